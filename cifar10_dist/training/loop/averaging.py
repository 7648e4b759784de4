"""An exponential moving average of the weights during training (EMA); airbench's lookahead is a recipe part
(``recipes.lookahead``)."""

from __future__ import annotations

from typing import Any

from ignite.engine import Engine, Events
from ignite.handlers import EMAHandler
from torch import nn


class WeightAverage:
    """An exponential moving average of the weights (Ignite's EMAHandler), updated after every optimizer step
    (every ``every`` iterations), its decay warmed up from 0.9 over ``warmup_steps`` steps; BatchNorm statistics
    are the model's. Checkpointed as the EMA weights plus this object (the warm-up position)."""

    WARMUP_MOMENTUM = 0.1  # Ignite's momentum = 1 - decay

    def __init__(self, model: nn.Module, trainer: Engine, decay: float, warmup_steps: int, every: int = 1) -> None:
        momentum = 1 - decay
        self.warm = warmup_steps > 0 and momentum < self.WARMUP_MOMENTUM
        self.handler = EMAHandler(
            model,
            momentum=momentum,
            momentum_warmup=self.WARMUP_MOMENTUM if self.warm else None,
            warmup_iters=warmup_steps if self.warm else None,
            handle_buffers="copy",
        )
        self.handler.attach(trainer, event=Events.ITERATION_COMPLETED(every=every))

    @property
    def model(self) -> nn.Module:
        return self.handler.ema_model

    def state_dict(self) -> dict[str, Any]:
        scheduler = getattr(self.handler, "momentum_scheduler", None) if self.warm else None  # (only when warmed up)
        return {"warmup_events": scheduler.event_index if scheduler is not None else 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        scheduler = getattr(self.handler, "momentum_scheduler", None) if self.warm else None
        if scheduler is not None:
            scheduler.event_index = state["warmup_events"]

"""Averages of the weights during training: airbench's lookahead and an exponential moving average (EMA)."""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from ignite.engine import Engine, Events
from ignite.handlers import EMAHandler
from torch import nn


PER_TENSOR_VARIABLE = "CIFAR10_DIST_LOOKAHEAD_PER_TENSOR"


class Lookahead:
    """airbench's lookahead (from hlb-cifar10): from ``start_fraction`` of training, every ``every`` steps the
    weights and BatchNorm statistics move to an exponential average of themselves, whose decay grows as
    ``decay**every * progress**power``; at each epoch end the weights are set to the average."""

    def __init__(self, model: nn.Module, total_iterations: int, start_fraction: float = 0.3, every: int = 5,
                 decay: float = 0.95, power: float = 3.0) -> None:
        self.model, self.total, self.every, self.decay, self.power = model, total_iterations, every, decay, power
        self.start = math.ceil(start_fraction * total_iterations)
        self.average: dict[str, torch.Tensor] | None = None

    def attach(self, trainer: Engine) -> None:
        trainer.add_event_handler(Events.ITERATION_COMPLETED, self.step)
        trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda _: self.update(1.0))

    def step(self, engine: Engine) -> None:
        iteration = engine.state.iteration
        if iteration < self.start or iteration % self.every:
            return
        if self.average is None:
            self.average = {name: tensor.detach().clone() for name, tensor in self._averaged().items()}
        else:
            self.update(self.decay**self.every * (iteration / self.total) ** self.power)

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """Average and weights move together: two foreach launches for all tensors (the same numbers as a
        lerp_ and a copy_ per tensor, which cost some 60 launches on the airbench network; PER_TENSOR_VARIABLE=1
        takes that path instead, for the GPU's A/B: benchmarks.bisect)."""
        if self.average is None:
            return
        current = self._averaged()
        averages = [self.average[name] for name in current]
        if os.environ.get(PER_TENSOR_VARIABLE) == "1":
            for average, tensor in zip(averages, current.values()):
                average.lerp_(tensor, 1 - decay)
                tensor.copy_(average)
            return
        torch._foreach_lerp_(averages, list(current.values()), 1 - decay)
        torch._foreach_copy_(list(current.values()), averages)

    def _averaged(self) -> dict[str, torch.Tensor]:
        return {name: tensor for name, tensor in self.model.state_dict().items() if tensor.is_floating_point()}

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        average, current = state["average"], self._averaged()
        self.average = None if average is None else {name: average[name].to(current[name].device) for name in current}


class WeightAverage:
    """An exponential moving average of the weights (Ignite's EMAHandler), updated after every optimizer step
    (every ``every`` iterations), its decay warmed up from 0.9 over ``warmup_steps`` steps; BatchNorm statistics
    are the model's. Checkpointed as the EMA weights plus this object (the warm-up position)."""

    WARMUP_MOMENTUM = 0.1  # Ignite's momentum = 1 - decay

    def __init__(self, model: nn.Module, trainer: Engine, decay: float, warmup_steps: int, every: int = 1) -> None:
        momentum = 1 - decay
        self.warm = warmup_steps > 0 and momentum < self.WARMUP_MOMENTUM
        self.handler = EMAHandler(model, momentum=momentum,
                                  momentum_warmup=self.WARMUP_MOMENTUM if self.warm else None,
                                  warmup_iters=warmup_steps if self.warm else None, handle_buffers="copy")
        self.handler.attach(trainer, event=Events.ITERATION_COMPLETED(every=every))

    @property
    def model(self) -> nn.Module:
        return self.handler.ema_model

    def state_dict(self) -> dict[str, Any]:
        return {"warmup_events": self.handler.momentum_scheduler.event_index if self.warm else 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.warm:
            self.handler.momentum_scheduler.event_index = state["warmup_events"]

"""airbench's lookahead (from hlb-cifar10): from 30% of training, every 5 steps the weights and BatchNorm statistics
move to an exponential average of themselves, whose decay grows with training; at each epoch end the weights are set
to the average. Any model may use it (``periodic_averaging: true``); fast.yaml does."""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from ignite.engine import Engine, Events
from torch import nn

PER_TENSOR_VARIABLE = "CIFAR10_DIST_LOOKAHEAD_PER_TENSOR"


class Lookahead:
    """airbench's lookahead (from hlb-cifar10): from ``start_fraction`` of training, every ``every`` steps the
    weights and BatchNorm statistics move to an exponential average of themselves, whose decay grows as
    ``decay**every * progress**power``; at each epoch end the weights are set to the average."""

    def __init__(
        self,
        model: nn.Module,
        total_iterations: int,
        start_fraction: float = 0.3,
        every: int = 5,
        decay: float = 0.95,
        power: float = 3.0,
    ) -> None:
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

"""Warm-up outside the timer, as airbench's ``warmup94`` does: a few training steps on a batch of the real shapes
before the first timed iteration, so that cuDNN's autotuning, torch.compile's compilation, lazy kernel loading and
the allocator's first growth happen there and not in epoch 1; then everything those steps changed is put back bit
for bit (the model's weights and buffers, the optimizer's and the grad scaler's state, the random generators), so
the run trains exactly as it would have without them. Its seconds are recorded apart (metrics.jsonl
``"event": "warm_up"``, summary.json ``warm_up_time``): outside the training time, inside the wall time."""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cifar10_dist import recipes
from cifar10_dist.data.batches import Batch, PrepareBatch
from cifar10_dist.data.loaders import NumberedBatch, batch_size_of, unwrapped
from cifar10_dist.system import ranks
from cifar10_dist.training.loop.step import TrainStep

logger = logging.getLogger("cifar10_dist")


@dataclass
class Saved:
    """What a training step changes, copied before the warm-up."""

    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scaler: dict[str, Any] | None
    cpu_random: torch.Tensor
    cuda_random: list[torch.Tensor]
    grad_norm: torch.Tensor | None


def save(step: TrainStep, network: nn.Module) -> Saved:
    return Saved(
        {name: value.detach().clone() for name, value in network.state_dict().items()},
        copy.deepcopy(step.optimizer.state_dict()),
        copy.deepcopy(step.scaler.state_dict()) if step.scaler is not None else None,
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        step.grad_norm,
    )


def restore(saved: Saved, step: TrainStep, network: nn.Module) -> None:
    with torch.no_grad():  # into the same tensors: the optimizer, DDP and a compiled graph keep pointing at them
        for name, value in network.state_dict().items():
            value.copy_(saved.weights[name])
    step.optimizer.load_state_dict(saved.optimizer)
    step.optimizer.zero_grad(set_to_none=True)
    if saved.scaler is not None and step.scaler is not None:
        step.scaler.load_state_dict(saved.scaler)
    torch.set_rng_state(saved.cpu_random)
    if saved.cuda_random:
        torch.cuda.set_rng_state_all(saved.cuda_random)
    step.grad_norm = saved.grad_norm


def first_batch(loader: Any) -> Batch:
    """The training set's first images as the loader serves a batch (numbered as iteration 1, so a loader that
    crops in its workers crops it too), read without touching the sampler: its position stays where a resume
    put it."""
    dataset = unwrapped(loader).dataset
    indices = NumberedBatch(range(batch_size_of(loader)))
    indices.epoch, indices.iteration = 0, 1
    return dataset.__getitems__(indices)  # type: ignore[attr-defined]  # (the training datasets of data.loaders)


@dataclass
class WarmUp:
    """``run()``: the warm-up of a run's training (``steps`` of them; none: nothing done), then the undoing."""

    step: TrainStep
    prepare: PrepareBatch
    loader: Any
    steps: int
    device: torch.device
    compression: Any = None  # grad_compression's state (PowerSGD counts steps and keeps errors): put back too

    def run(self) -> float | None:
        """Warm up and undo it; the seconds it took (None when there was nothing to do). A run continuing PowerSGD
        takes one step even without ``steps``: DDP lays its buckets out anew after its first step, and the
        checkpoint's error feedback and Q matrices are laid out as they are after it."""
        continued = self.compression is not None and self.compression.continued
        steps = max(self.steps, 1 if continued else 0)
        if steps <= 0:
            return None
        started = time.perf_counter()
        network = self.step.model  # (DDP's or a compiled module's state_dict: the same tensors)
        saved = save(self.step, network)
        compressed = copy.deepcopy(self.compression.state_dict()) if self.compression is not None else None
        if self.compression is not None:
            self.compression.reset()  # the undone steps exchange their gradients uncompressed
        batch = first_batch(self.loader)
        for branch in recipes.parts_of(network).warm_up_branches():
            with branch:
                for _ in range(steps):
                    self.step(*self.prepare(batch, 1))
        restore(saved, self.step, network)
        if compressed is not None:
            self.compression.load_state_dict(compressed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - started
        ranks.on_rank_zero(
            logger.info,
            "warm-up: %d training steps on a batch of the real shapes in %.2f s, then "
            "undone (outside the training time; %s)",
            steps,
            seconds,
            "warm_up_steps=0 to skip it" if self.steps else "for PowerSGD's bucket layout",
        )
        return seconds

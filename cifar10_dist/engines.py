"""Ignite engines: the supervised trainer, evaluators with Accuracy/Loss, mixed precision per device, LR schedule."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from ignite.engine import Engine, Events
from ignite.handlers import PiecewiseLinear
from ignite.metrics import Accuracy, ConfusionMatrix, Loss, Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce
from torch import nn

logger = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]
PrepareBatch = Callable[[Batch, int], Batch]  # (batch, iteration) -> (inputs, targets) on the device


@dataclass(frozen=True)
class Precision:
    """Autocast settings for one device: ``dtype`` None means full fp32."""

    device_type: str
    dtype: torch.dtype | None

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    @property
    def needs_grad_scaler(self) -> bool:
        return self.dtype == torch.float16

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


def choose_precision(device: torch.device, with_amp: bool) -> Precision:
    """fp16 autocast + GradScaler on CUDA, bf16 on XLA; fp32 on CPU, where bf16 autocast measured ~7x slower."""
    if not with_amp:
        return Precision(device.type, None)
    if device.type == "cuda":
        return Precision("cuda", torch.float16)
    if device.type == "xla":
        return Precision("xla", torch.bfloat16)
    logger.warning("with_amp=True ignored on %s: bf16 autocast trains ResNet-18 ~7x slower than fp32 on CPU", device)
    return Precision(device.type, None)


def make_grad_scaler(precision: Precision) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(precision.device_type) if precision.needs_grad_scaler else None


def create_trainer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    prepare_batch: PrepareBatch,
    precision: Precision,
    scaler: torch.amp.GradScaler | None,
) -> Engine:
    """An Engine whose step trains on one batch and returns the batch loss (a float).

    NaN/inf losses are caught by ``faults.attach_stop_checks`` (not Ignite's TerminateOnNan, whose
    COMPLETED event would checkpoint the broken state).
    """

    def train_step(engine: Engine, batch: Batch) -> float:
        model.train()
        inputs, targets = prepare_batch(batch, engine.state.iteration)
        with precision.autocast():
            loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss.item()

    trainer = Engine(train_step)
    trainer.logger = logging.getLogger("cifar10_dist.trainer")
    trainer.logger.setLevel(logging.CRITICAL)  # progress is logged by tracking; errors end the run with a message
    return trainer


class NumSamples(Metric):
    """How many samples the evaluation saw, summed over all processes."""

    @reinit__is_reduced
    def reset(self) -> None:
        self._count = torch.tensor(0, device=self._device)

    @reinit__is_reduced
    def update(self, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._count += output[1].shape[0]

    @sync_all_reduce("_count")
    def compute(self) -> int:
        return int(self._count.item())


def create_evaluator(
    model: nn.Module,
    loss_fn: nn.Module,
    prepare_batch: PrepareBatch,
    precision: Precision,
    device: torch.device,
    num_classes: int | None = None,
) -> Engine:
    """An Engine computing accuracy, loss and num_samples over a loader, exact across processes
    (and the confusion matrix when ``num_classes`` is given)."""

    @torch.no_grad()
    def eval_step(engine: Engine, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        model.eval()
        inputs, targets = prepare_batch(batch, engine.state.iteration)
        with precision.autocast():
            outputs = model(inputs)
        return outputs.float(), targets

    evaluator = Engine(eval_step)
    evaluator.logger = logging.getLogger("cifar10_dist.evaluator")
    evaluator.logger.setLevel(logging.CRITICAL)
    metric_device = torch.device("cpu") if device.type == "xla" else device  # Ignite keeps XLA metrics on CPU
    Accuracy(device=metric_device).attach(evaluator, "accuracy")
    Loss(loss_fn, device=metric_device).attach(evaluator, "loss")
    NumSamples(device=metric_device).attach(evaluator, "num_samples")
    if num_classes is not None:
        ConfusionMatrix(num_classes, device=metric_device).attach(evaluator, "confusion_matrix")
    return evaluator


def create_lr_scheduler(
    optimizer: torch.optim.Optimizer, learning_rate: float, warmup_iterations: int, total_iterations: int
) -> PiecewiseLinear:
    """Linear warmup 0 -> learning_rate, then linear decay to 0 at the last iteration (set per iteration)."""
    milestones = [(0, 0.0), (total_iterations, 0.0)]
    if warmup_iterations > 0:
        milestones.insert(1, (warmup_iterations, learning_rate))
    else:
        milestones[0] = (0, learning_rate)
    return PiecewiseLinear(optimizer, "lr", milestones_values=milestones)


def attach_validation(
    trainer: Engine, every_epochs: int, validate: Callable[[Engine], Any]
) -> None:
    """Call ``validate(trainer)`` every N epochs and once at the end, never twice for the same epoch."""
    last_validated = {"epoch": -1}

    def maybe_validate(engine: Engine) -> None:
        if last_validated["epoch"] == engine.state.epoch:
            return
        last_validated["epoch"] = engine.state.epoch
        validate(engine)

    trainer.add_event_handler(Events.EPOCH_COMPLETED(every=every_epochs) | Events.COMPLETED, maybe_validate)

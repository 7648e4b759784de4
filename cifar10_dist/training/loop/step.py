"""One training iteration as one object, ``TrainStep`` (timm's ``NativeScaler`` habit): forward under the run's
autocast, backward (scaled under fp16), gradient accumulation with DDP's ``no_sync`` on the batches that do not
step, unscale, clipping, the optimizer step and zero_grad; it returns a typed ``StepOutput`` that the NaN watch,
the trackers and ``training.run`` read by field. ``create_trainer`` wraps it in an Ignite Engine.

Nothing here waits for the device: the loss and the gradient norm stay device tensors, read by the handlers
that log (``system.stopping.LossWatch``, ``outputs.progress``, ``outputs.scalars``).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Callable

import torch
from ignite.engine import Engine
from torch import nn

from cifar10_dist.data.batches import Batch, PrepareBatch
from cifar10_dist.system.precision import Precision, make_grad_scaler
from cifar10_dist.training.loop.selection import HardestSelection


@dataclass(frozen=True)
class StepOutput:
    """What a training iteration returns (``engine.state.output``): the batch loss, a detached device tensor, and
    with clipping the pre-clip norm of the gradient of the latest optimizer step (a device tensor; None without
    clipping or before the first step)."""

    loss: torch.Tensor
    grad_norm: torch.Tensor | None = None


@dataclass(frozen=True)
class Accumulation:
    """Gradient accumulation over ``steps`` batches; ``synced`` is the DDP model whose all-reduce is skipped on
    the batches that do not step (None: one process, nothing to skip)."""

    steps: int
    synced: nn.Module | None = None

    def steps_at(self, iteration: int, total_iterations: int) -> bool:
        """Whether the optimizer steps after this (1-based) iteration."""
        return iteration % self.steps == 0 or iteration == total_iterations

    def without_gradient_sync(self) -> contextlib.AbstractContextManager:
        if isinstance(self.synced, nn.parallel.DistributedDataParallel):
            return self.synced.no_sync()
        return contextlib.nullcontext()


class TrainStep:
    """Train on one batch: ``step(inputs, targets, stepping)``. With ``accumulation`` each loss is divided by its
    N batches and the optimizer steps only when ``stepping``; with ``clip_grad_norm`` the accumulated gradient
    (unscaled first under the GradScaler) is clipped to that total norm before the step. The GradScaler (fp16
    only) is ``scaler``, checkpointed with the run."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: nn.Module,
        precision: Precision,
        accumulation: Accumulation | None = None,
        clip_grad_norm: float | None = None,
        teacher: Callable[[torch.Tensor], torch.Tensor] | None = None,
        selection: HardestSelection | None = None,
    ) -> None:
        self.model, self.optimizer, self.loss_fn, self.precision = model, optimizer, loss_fn, precision
        self.selection = selection  # data selection: the hardest part of a batch (``training.loop.selection``)
        self.teacher = teacher  # distillation: its logits on the same batch are the loss's third argument
        self.accumulation = accumulation or Accumulation(1)
        self.clip_grad_norm = clip_grad_norm
        self.scaler = make_grad_scaler(precision)
        self.clipped = [p for group in optimizer.param_groups for p in group["params"]] if clip_grad_norm else []
        self.grad_norm: torch.Tensor | None = None
        self.frozen_norms: list[nn.Module] = []  # kept in eval mode (``freezing.BackboneFreeze``)

    def __call__(
        self, inputs: torch.Tensor, targets: torch.Tensor, stepping: bool = True, select: bool = False
    ) -> StepOutput:
        if not self.model.training:  # after an evaluation (model.train() visits every module: ~1 us each)
            self.model.train()
            for norm in self.frozen_norms:
                norm.eval()
        if select:
            inputs, targets = self.selection(inputs, targets)  # type: ignore[misc]  # (where selecting)
        with contextlib.nullcontext() if stepping else self.accumulation.without_gradient_sync():
            with self.precision.autocast():
                outputs = self.model(inputs)
                loss = (
                    self.loss_fn(outputs, targets)
                    if self.teacher is None
                    else self.loss_fn(outputs, targets, self.teacher(inputs))
                )
            share = loss / self.accumulation.steps if self.accumulation.steps > 1 else loss
            (self.scaler.scale(share) if self.scaler is not None else share).backward()
        if stepping:
            self._step_optimizer()
        return StepOutput(loss.detach(), self.grad_norm)

    def _step_optimizer(self) -> None:
        if self.clip_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.clipped, self.clip_grad_norm).detach()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def create_trainer(step: TrainStep, prepare_batch: PrepareBatch) -> Engine:
    """An Engine whose iteration prepares its batch and runs ``step`` on it (the optimizer stepping after every
    N-th batch of an accumulation and after the last iteration of training). NaN/inf losses are caught by
    ``system.stopping.attach_stop_checks`` (not Ignite's TerminateOnNan, whose COMPLETED event would checkpoint
    the broken state)."""

    def train_iteration(engine: Engine, batch: Batch) -> StepOutput:
        iteration = engine.state.iteration
        inputs, targets = prepare_batch(batch, iteration)
        total = (engine.state.max_epochs or 0) * (engine.state.epoch_length or 0)
        select = step.selection is not None and step.selection.applies(iteration)
        return step(inputs, targets, step.accumulation.steps_at(iteration, total), select)

    trainer = Engine(train_iteration)
    trainer.logger = logging.getLogger("cifar10_dist.trainer")
    trainer.logger.setLevel(logging.CRITICAL)  # progress is logged by tracking; errors end the run with a message
    return trainer

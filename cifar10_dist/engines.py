"""Ignite engines: the supervised trainer, evaluators with Accuracy/Loss (and test-time augmentation), mixed
precision per device, the LR schedule per parameter group, and airbench's lookahead."""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from ignite.engine import Engine, Events
from ignite.handlers import EMAHandler
from ignite.metrics import Accuracy, ConfusionMatrix, Loss, Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce
from torch import nn

from cifar10_dist import hardware

logger = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]
PrepareBatch = Callable[[Batch, int], Batch]  # (batch, iteration) -> (inputs, targets) on the device


@dataclass(frozen=True)
class Precision:
    """Autocast settings for one device: ``dtype`` None means full fp32. ``reason`` says why it was chosen and
    ``warning`` what an explicit choice will cost on this hardware (both for the run's log)."""

    device_type: str
    dtype: torch.dtype | None
    reason: str = field(default="", compare=False)
    warning: str | None = field(default=None, compare=False)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    @property
    def name(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, str(self.dtype))

    @property
    def needs_grad_scaler(self) -> bool:
        return self.dtype == torch.float16

    def autocast(self) -> contextlib.AbstractContextManager:
        """torch.autocast for this type, or a null context in fp32 (a disabled autocast costs microseconds)."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def choose_precision(device: torch.device, with_amp: bool | str, amp_dtype: str = "auto") -> Precision:
    """``with_amp``: False fp32; True fp16 + GradScaler on CUDA, bf16 elsewhere (``amp_dtype`` float16 or bfloat16
    chooses; fp16 always with a GradScaler); "auto" what the hardware runs fast (``automatic_precision``)."""
    if with_amp == "auto":
        return automatic_precision(device)
    if not with_amp:
        return Precision(device.type, None, "fp32 (with_amp=False)")
    if amp_dtype != "auto":
        dtype = getattr(torch, amp_dtype)
    else:
        dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    chosen = Precision(device.type, dtype)
    reason = f"{chosen.name} autocast (with_amp=True)" + (" with a GradScaler" if chosen.needs_grad_scaler else "")
    warning = None
    cpu = hardware.cpu_info() if device.type == "cpu" and dtype == torch.bfloat16 else None
    if cpu is not None and not cpu.native_bf16:
        warning = (f"with_amp=True on a CPU without native bf16 ({cpu.describe()}): bf16 autocast is "
                   "emulated here, typically 5-15x slower than fp32 (measured on an AVX2 AMD EPYC: 15x for airbench, "
                   "5.6x for ResNet-18); --with_amp=auto trains in fp32 on this CPU")
    return Precision(device.type, dtype, reason, warning)


def automatic_precision(device: torch.device) -> Precision:
    """What this device runs fast: bf16 on GPUs with bf16 tensor cores (compute capability 8.0+: as fast as fp16,
    and no GradScaler, whose overflow check reads the GPU at every step), fp16 + GradScaler on older GPUs, bf16 on
    XLA, bf16 on CPUs with AMX or AVX512-BF16 kernels, fp32 on other CPUs (bf16 is emulated there)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return Precision("cuda", torch.bfloat16, f"bf16 autocast (with_amp=auto: compute capability {major}.{minor} "
                                                     "has bf16 tensor cores)")
        return Precision("cuda", torch.float16, f"fp16 autocast with a GradScaler (with_amp=auto: compute capability "
                                                f"{major}.{minor} has no bf16)")
    if device.type == "xla":
        return Precision("xla", torch.bfloat16, "bf16 autocast (with_amp=auto on XLA)")
    if device.type == "cpu":
        info = hardware.cpu_info()
        if info.native_bf16:
            return Precision("cpu", torch.bfloat16, f"bf16 autocast (with_amp=auto: {info.describe()})")
        return Precision("cpu", None, f"fp32 (with_amp=auto: {info.describe()}; bf16 autocast would be emulated "
                                      "here, many times slower)")
    return Precision(device.type, None, f"fp32 (with_amp=auto: no mixed precision chosen for {device.type})")


def make_grad_scaler(precision: Precision) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(precision.device_type) if precision.needs_grad_scaler else None


def create_trainer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    prepare_batch: PrepareBatch,
    precision: Precision,
    scaler: torch.amp.GradScaler | None,
    accumulation: Accumulation | None = None,
    clip_grad_norm: float | None = None,
) -> Engine:
    """An Engine whose step trains on one batch and returns the batch loss, a detached tensor on the device: the
    step never waits for the device (reading the loss is for the handlers that log, see ``faults.LossWatch``).

    With ``clip_grad_norm`` the gradient (the accumulated one, unscaled first under a GradScaler) is clipped to
    that total norm before each optimizer step; the pre-clip norm stays on the device as
    ``engine.state.grad_norm`` (read where the loss is: at logging iterations).

    With ``accumulation``, the gradients of N consecutive batches are summed (each loss divided by N) and the
    optimizer steps after the Nth (and after the last iteration of training); under DDP the N-1 batches in
    between skip the gradient all-reduce (``no_sync``). NaN/inf losses are caught by ``faults.attach_stop_checks``
    (not Ignite's TerminateOnNan, whose COMPLETED event would checkpoint the broken state).
    """
    accumulation = accumulation or Accumulation(1)
    clipped = [p for group in optimizer.param_groups for p in group["params"]] if clip_grad_norm is not None else []

    def train_step(engine: Engine, batch: Batch) -> torch.Tensor:
        if not model.training:  # after an evaluation (model.train() visits every module: ~1 us each)
            model.train()
        iteration = engine.state.iteration
        inputs, targets = prepare_batch(batch, iteration)
        stepping = accumulation.steps_at(iteration, engine.state.max_epochs * engine.state.epoch_length)
        with contextlib.nullcontext() if stepping else accumulation.without_gradient_sync():
            with precision.autocast():
                loss = loss_fn(model(inputs), targets)
            share = loss / accumulation.steps if accumulation.steps > 1 else loss
            (scaler.scale(share) if scaler is not None else share).backward()
        if stepping:
            if clip_grad_norm is not None:
                if scaler is not None:
                    scaler.unscale_(optimizer)
                engine.state.grad_norm = torch.nn.utils.clip_grad_norm_(clipped, clip_grad_norm).detach()
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    trainer = Engine(train_step)
    trainer.logger = logging.getLogger("cifar10_dist.trainer")
    trainer.logger.setLevel(logging.CRITICAL)  # progress is logged by tracking; errors end the run with a message
    return trainer


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


def predict(model: nn.Module, inputs: torch.Tensor, tta: int = 0) -> torch.Tensor:
    """Logits, averaged over test-time views: 0 the image only, 1 also its mirror, 2 also both of them shifted by
    one pixel up-left and down-right (reflect padding), weighted as in airbench (half unshifted, half shifted)."""
    if tta == 0:
        return model(inputs)
    mirrored = 0.5 * model(inputs) + 0.5 * model(inputs.flip(-1))
    if tta == 1:
        return mirrored
    size = inputs.shape[-1]
    padded = nn.functional.pad(inputs, (1, 1, 1, 1), mode="reflect")
    shifted = [padded[..., :size, :size], padded[..., 2:, 2:]]
    shifted_logits = [0.5 * model(view) + 0.5 * model(view.flip(-1)) for view in shifted]
    return 0.5 * mirrored + 0.25 * (shifted_logits[0] + shifted_logits[1])


def create_evaluator(
    model: nn.Module,
    loss_fn: nn.Module,
    prepare_batch: PrepareBatch,
    precision: Precision,
    device: torch.device,
    num_classes: int | None = None,
    tta: int = 0,
) -> Engine:
    """An Engine computing accuracy, loss and num_samples over a loader, exact across processes
    (and the confusion matrix when ``num_classes`` is given), with test-time augmentation level ``tta``."""

    @torch.no_grad()
    def eval_step(engine: Engine, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        model.eval()
        inputs, targets = prepare_batch(batch, engine.state.iteration)
        with precision.autocast():
            outputs = predict(model, inputs, tta)
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
        if self.average is None:
            return
        for name, tensor in self._averaged().items():
            self.average[name].lerp_(tensor, 1 - decay)
            tensor.copy_(self.average[name])

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

"""The training step every benchmark measures against: one plain step (``doctor.plain_training_step``, as
``doctor`` probes), the bare loop of such steps on one batch, and our trainer with its per-iteration handlers on
the same batch, each in any speed setting (channels_last, autocast, torch.compile) on any device."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from ignite.engine import Events
from torch import nn

from cifar10_dist import models
from cifar10_dist.outputs import progress, scalars
from cifar10_dist.system import doctor, stopping
from cifar10_dist.system.precision import choose_precision
from cifar10_dist.training.loop.step import TrainStep, create_trainer
from cifar10_dist.training.setup import schedules

CPU = torch.device("cpu")
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Timed:
    """Timed steps of a loop: how many, their seconds (after the warm-up's), images per step, the losses the bare
    loop read, the epoch lines our trainer's recorder wrote."""

    steps: int
    seconds: float
    images: int
    warmup_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    recorded: int = 0

    @property
    def images_per_second(self) -> float:
        return self.steps * self.images / self.seconds


def make_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    amp: bool = False,
    device: torch.device = CPU,
    amp_dtype: str = "auto",
) -> Callable[[torch.Tensor, torch.Tensor], float]:
    """One plain training step (with ``amp``: fp16 with a GradScaler on CUDA, as our trainer does, or
    ``amp_dtype``), returning the loss as a float (read at every step, as most hand-written loops do)."""
    step = device_step(model, optimizer, loss_fn, amp, device, amp_dtype)
    return lambda inputs, targets: step(inputs, targets).item()


def device_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    amp: bool = False,
    device: torch.device = CPU,
    amp_dtype: str = "auto",
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``make_step`` returning the loss as a device tensor: the caller reads it when it chooses."""
    return doctor.plain_training_step(model, optimizer, loss_fn, choose_precision(device, amp, amp_dtype))


def setup(model_name: str, device: torch.device = CPU) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module]:
    """A freshly seeded model of ours, Nesterov SGD and cross-entropy."""
    torch.manual_seed(0)
    model = models.build_model(model_name).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    return model, optimizer, nn.CrossEntropyLoss()


def prepared(
    model: nn.Module, batch: Batch, device: torch.device, channels_last: bool, compile: bool
) -> tuple[nn.Module, Batch]:
    """The model and batch on the device, in channels_last and compiled when asked."""
    inputs, targets = batch[0].to(device), batch[1].to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return (torch.compile(model) if compile else model), (inputs, targets)


def bare_loop(
    model_name: str,
    batch: Batch,
    steps: int,
    warmup: int,
    channels_last: bool = False,
    amp: bool = False,
    compile: bool = False,
    device: torch.device = CPU,
    amp_dtype: str = "auto",
) -> Timed:
    """``steps`` plain training steps on one batch after ``warmup`` untimed ones; the losses are read after the
    timed steps (the device waited for once, at the end), so nothing but the steps is timed."""
    model, optimizer, loss_fn = setup(model_name, device)
    model, (inputs, targets) = prepared(model, batch, device, channels_last, compile)
    step = device_step(model, optimizer, loss_fn, amp, device, amp_dtype)
    started = time.perf_counter()
    for _ in range(warmup):
        step(inputs, targets)
    synchronize(device)
    warmup_seconds = time.perf_counter() - started
    start = time.perf_counter()
    losses = [step(inputs, targets) for _ in range(steps)]
    synchronize(device)
    seconds = time.perf_counter() - start
    return Timed(len(losses), seconds, len(targets), warmup_seconds, torch.stack(losses).tolist())


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA; elsewhere the work is done when the call returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def engine_loop(
    model_name: str,
    batch: Batch,
    steps: int,
    warmup: int,
    channels_last: bool = False,
    amp: bool = False,
    compile: bool = False,
    device: torch.device = CPU,
    amp_dtype: str = "auto",
) -> Timed:
    """Our trainer and its per-iteration handlers (LR schedule, stop checks reading the loss where the progress
    lines do, progress, TensorBoard and metrics.jsonl) on the same batch; the device waited for at the end."""
    model, optimizer, loss_fn = setup(model_name, device)
    model, batch = prepared(model, batch, device, channels_last, compile)
    precision = choose_precision(device, amp, amp_dtype)
    trainer = create_trainer(TrainStep(model, optimizer, loss_fn, precision), lambda b, i: b)
    total = (steps + warmup) * 10
    trainer.add_event_handler(Events.ITERATION_STARTED, schedules.create_lr_scheduler(optimizer, 0.01, 5, total))
    stopping.attach_stop_checks(
        trainer,
        stopping.StopRequest(),
        lambda engine: None,
        Path(tempfile.gettempdir()),
        reads_at=lambda iteration: iteration % 15 == 0,
    )
    clock = progress.EpochClock(len(batch[1])).attach(trainer)
    progress.attach_progress_logging(trainer, optimizer, 15, clock, 1)
    with tempfile.TemporaryDirectory() as folder:
        recorder = scalars.Recorder(Path(folder))
        recorder.attach_training(trainer, optimizer, 15, clock)
        started = time.perf_counter()
        trainer.run([batch] * warmup, max_epochs=1)
        warmup_seconds = time.perf_counter() - started
        synchronize(device)
        start = time.perf_counter()
        state = trainer.run([batch] * steps, max_epochs=1)
        synchronize(device)
        seconds = time.perf_counter() - start
        recorder.close()
        recorded = (Path(folder) / "metrics.jsonl").read_text().count('"event": "epoch"')
    return Timed(state.iteration, seconds, len(batch[1]), warmup_seconds, recorded=recorded)


def flops_per_image(model_name: str) -> float:
    """FLOPs of one training step (forward + backward) per image, counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    model, _, loss_fn = setup(model_name)
    inputs, targets = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(inputs), targets).backward()
    return counter.get_total_flops() / 8

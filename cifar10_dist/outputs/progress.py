"""Progress on the console (rank 0): a bar per epoch on a terminal, else a line every log_every iterations (loss,
learning rate, global images/s, ETA of the run), and each epoch's duration and speed, counted once by the
``EpochClock`` that the run's record (``recorder``) reads too."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from ignite.engine import Engine, Events

from cifar10_dist.system.ranks import on_rank_zero

logger = logging.getLogger("cifar10_dist")


def step_output(engine: Engine) -> Any:
    """What the trainer's step returned (training.loop.step.StepOutput: the loss and grad norm, on the device);
    Ignite types ``state.output`` as an int."""
    return engine.state.output


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    return optimizer.param_groups[0]["lr"]


@dataclass(frozen=True)
class EpochTiming:
    """One epoch's training (evaluation excluded): seconds, the iterations this process ran of it (fewer than
    the epoch's length in the epoch a resume starts in), and the global images per second."""

    seconds: float
    iterations: int
    images_per_second: float


class EpochClock:
    """Each epoch's ``EpochTiming``, counted in one place for the progress line and the record: attach it to
    the trainer before either reads it, so its start of an epoch is known."""

    def __init__(self, images_per_iteration: int) -> None:
        self.images_per_iteration = images_per_iteration  # what all processes together train on per step
        self.started_at = 0  # the trainer's iteration when the epoch started

    def attach(self, trainer: Engine) -> EpochClock:
        trainer.add_event_handler(Events.EPOCH_STARTED, self._start)
        return self

    def _start(self, engine: Engine) -> None:
        self.started_at = engine.state.iteration

    def timing(self, engine: Engine) -> EpochTiming:
        """The epoch that just completed (read at EPOCH_COMPLETED)."""
        seconds = engine.state.times.get("EPOCH_COMPLETED") or 0.0
        iterations = engine.state.iteration - self.started_at
        return EpochTiming(seconds, iterations, iterations * self.images_per_iteration / max(seconds, 1e-9))


def attach_progress_logging(
    trainer: Engine, optimizer: torch.optim.Optimizer, log_every: int, clock: EpochClock, num_epochs: int
) -> None:
    """Rank 0: a progress bar per epoch on a terminal, else a ``ProgressLines`` line every ``log_every``
    iterations; the duration and speed of each epoch either way (``clock``'s)."""
    on_rank_zero(_attach_progress, trainer, optimizer, log_every, clock, num_epochs)


def _attach_progress(
    trainer: Engine, optimizer: torch.optim.Optimizer, log_every: int, clock: EpochClock, num_epochs: int
) -> None:
    if sys.stderr.isatty():
        ProgressBar(optimizer).attach(trainer, log_every)
    else:
        ProgressLines(optimizer, clock.images_per_iteration, num_epochs).attach(trainer, log_every)

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_epoch_time(engine: Engine) -> None:
        timing = clock.timing(engine)
        logger.info(
            "epoch %d done in %.1f s (%.0f img/s)", engine.state.epoch, timing.seconds, timing.images_per_second
        )


class ProgressBar:
    """Ignite's progress bar with the loss and lr; the loss is read at log iterations only, so the bar itself
    never waits for the device."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.loss = optimizer, float("nan")

    def attach(self, trainer: Engine, log_every: int) -> None:
        from ignite.handlers import ProgressBar as IgniteBar

        trainer.add_event_handler(Events.ITERATION_COMPLETED(every=log_every), self._read_loss)
        IgniteBar(persist=False, bar_format=None).attach(
            trainer, output_transform=lambda _: {"loss": self.loss, "lr": current_lr(self.optimizer)}
        )

    def _read_loss(self, engine: Engine) -> None:
        self.loss = float(step_output(engine).loss)


class ProgressLines:
    """A line every ``log_every`` iterations: epoch and iteration, loss, lr, global images/s since the last line
    and the ETA of the run's training at that speed."""

    def __init__(self, optimizer: torch.optim.Optimizer, images_per_iteration: int, num_epochs: int) -> None:
        self.optimizer, self.images_per_iteration, self.num_epochs = optimizer, images_per_iteration, num_epochs
        self.iteration, self.time = 0, time.perf_counter()  # at the last line (or the epoch's start)

    def attach(self, trainer: Engine, log_every: int) -> None:
        trainer.add_event_handler(Events.EPOCH_STARTED, self._restart)
        trainer.add_event_handler(Events.ITERATION_COMPLETED(every=log_every), self._log)

    def _restart(self, engine: Engine) -> None:
        self.iteration, self.time = engine.state.iteration, time.perf_counter()

    def _log(self, engine: Engine) -> None:
        now = time.perf_counter()
        seconds_per_iteration = (now - self.time) / max(engine.state.iteration - self.iteration, 1)
        self.iteration, self.time = engine.state.iteration, now
        epoch_length = engine.state.epoch_length or 0
        in_epoch = (engine.state.iteration - 1) % epoch_length + 1 if epoch_length else engine.state.iteration
        remaining = self.num_epochs * epoch_length - engine.state.iteration
        logger.info(
            "epoch %d/%d iter %d/%d: loss %.4f, lr %.4g, %.0f img/s, ETA %s",
            engine.state.epoch,
            self.num_epochs,
            in_epoch,
            epoch_length,
            float(step_output(engine).loss),
            current_lr(self.optimizer),
            self.images_per_iteration / max(seconds_per_iteration, 1e-9),
            format_duration(remaining * seconds_per_iteration),
        )


def format_duration(seconds: float) -> str:
    """Seconds as H:MM:SS (training time left; evaluation not included)."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"

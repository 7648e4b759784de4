"""Stopping safely: preemption signals, NaN loss, all processes agreeing at an iteration boundary.

A signal handler only sets a flag. After every iteration all processes all-reduce two flags (a stop was
requested somewhere; the loss is not finite somewhere), so they all take the same decision at the same
iteration: on a stop request, write a checkpoint and raise Preempted; on NaN/inf, raise TrainingDiverged
before any checkpoint of the broken state is written.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from pathlib import Path
from typing import Callable

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from cifar10_dist.errors import Preempted, TrainingDiverged

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Records the first SIGTERM/SIGUSR1; optionally passes it on to this process's children (spawned workers)."""

    def __init__(self, forward_to_children: bool = False) -> None:
        self.signal_name: str | None = None
        self.forward_to_children = forward_to_children

    def install(self) -> None:
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.signal_name = self.signal_name or signal.Signals(signum).name
        if self.forward_to_children:
            for child in child_pids():
                try:
                    os.kill(child, signum)
                except ProcessLookupError:
                    pass

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


def child_pids(pid: int | None = None) -> list[int]:
    """Direct children of a process (Linux /proc; empty elsewhere)."""
    pids: list[int] = []
    for children in Path(f"/proc/{pid or os.getpid()}/task").glob("*/children"):
        try:
            pids.extend(int(text) for text in children.read_text().split())
        except OSError:
            continue
    return pids


def attach_stop_checks(trainer: Engine, stop: StopRequest, save_checkpoint: Callable[[Engine], None]) -> None:
    """After each iteration: agree on NaN and stop requests across processes, then act on them.

    Attach before the checkpoint handlers, so that a NaN iteration is never saved.
    """
    device = idist.device()

    @trainer.on(Events.ITERATION_COMPLETED)
    def check(engine: Engine) -> None:
        loss = engine.state.output
        flags = torch.tensor([float(stop.requested), float(not math.isfinite(loss))], device=device)
        if idist.get_world_size() > 1:
            flags = idist.all_reduce(flags)
        iteration = engine.state.iteration
        if flags[1] > 0:
            raise TrainingDiverged(
                f"training stopped at iteration {iteration} (epoch {engine.state.epoch}): the loss became {loss} "
                "on at least one process; the checkpoints on disk are from before it (try a lower learning_rate)"
            )
        if flags[0] > 0:
            save_checkpoint(engine)
            raise Preempted(
                f"stopped at iteration {iteration} on {stop.signal_name or 'a signal to another process'}: "
                "checkpoint written; run the same command with --resume_from=auto to continue"
            )


def finite_weights_only(save: Callable[[Engine], None], model: torch.nn.Module) -> Callable[[Engine], None]:
    """Wrap a checkpoint handler so that it never writes NaN/inf parameters (keeps the last good file)."""

    def save_if_finite(engine: Engine) -> None:
        if not all(bool(torch.isfinite(parameter).all()) for parameter in model.parameters()):
            raise TrainingDiverged(
                f"training stopped at iteration {engine.state.iteration} (epoch {engine.state.epoch}): the weights "
                "became NaN/inf; the checkpoints on disk are from before it (try a lower learning_rate)"
            )
        save(engine)

    return save_if_finite

"""Host waits counted by the training iteration that made them: ``HostWaits`` catches the warnings that
``torch.cuda.set_sync_debug_mode("warn")`` gives for every call that makes the host wait for the GPU, and files
each under the trainer's iteration it happened in (a batch being fetched belongs to the iteration it is for),
or under "evaluation" (inside an evaluator's run) or "outside" (set-up, warm-up, the run's end), with the place in
our code that made it. Plain Python: the CPU suite tests the counting with warnings of the same text."""

from __future__ import annotations

import collections
import contextlib
import sys
import warnings
from pathlib import Path
from types import FrameType
from typing import Iterator

from ignite.engine import Engine

WAIT_TEXT = "synchroniz"  # torch's warning: "called a synchronizing CUDA operation"


class HostWaits:
    """Waits by iteration (``by_iteration``: iteration -> places), in evaluation and outside training
    (``elsewhere``: "evaluation"/"outside" -> places)."""

    def __init__(self) -> None:
        self.by_iteration: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.elsewhere: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    @contextlib.contextmanager
    def caught(self) -> Iterator[HostWaits]:
        """Inside: every warning about a host wait is counted here (other warnings are shown as usual)."""
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            shown = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                if WAIT_TEXT in str(message):
                    self.count(sys._getframe(1))
                else:
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            yield self

    def count(self, frame: FrameType | None) -> None:
        engines, fetching, ours = [], False, None
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, Engine):
                engines.append(owner)
            path = Path(frame.f_code.co_filename).parts
            if frame.f_code.co_name == "__next__" and path[-3:] == ("utils", "data", "dataloader.py"):
                fetching = True
            if ours is None and "cifar10_dist" in path and "tests" not in path:
                ours = f"{path[-1]}:{frame.f_lineno} ({frame.f_code.co_name})"
            frame = frame.f_back
        place = ours or "torch"
        if not engines:
            self.elsewhere["outside"][place] += 1
        elif engines[0] is not engines[-1]:  # the innermost engine is not the outermost (the trainer)
            self.elsewhere["evaluation"][place] += 1
        else:
            trainer = engines[-1]
            iteration = trainer.state.iteration + (1 if fetching else 0)  # (fetched before it is counted)
            self.by_iteration[iteration][place] += 1

    def iterations_waiting(self, allowed: set[int] | None = None) -> dict[int, collections.Counter]:
        """The iterations with a wait, but those in ``allowed`` (that log, checkpoint or end an epoch) and
        iteration 0 (the trainer's start, before the first)."""
        return {
            iteration: places
            for iteration, places in sorted(self.by_iteration.items())
            if iteration and iteration not in (allowed or set())
        }

    def places(self, iterations: dict[int, collections.Counter]) -> collections.Counter:
        """In how many of ``iterations`` each place waited."""
        counted: collections.Counter = collections.Counter()
        for places in iterations.values():
            counted.update(set(places))
        return counted

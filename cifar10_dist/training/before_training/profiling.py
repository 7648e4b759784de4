"""``profile=N``: where a run's time goes. ``torch.profiler`` records N training iterations after WARMUP of this
launch (a launch of WARMUP iterations or fewer: all of them, with no warm-up; a shortened window is said in a
warning) (CPU activity, and CUDA's where there is a GPU) into a trace that Perfetto, chrome://tracing and
TensorBoard's profiler plugin open (RUN/profile/rank<R>.pt.trace.json); the top operators by self time go to
the log and RUN/profile/top_operators.txt. Ignite's ``HandlersTimeProfiler`` times the whole run: data loading,
the training step and each handler (the evaluations are the Validation handler's time), as shares of the total
in the log and in summary.json. Neither changes what is computed: a profiled run ends with the same weights.

On a GPU the step is launched without waiting for it (the loop never syncs), so "training step" counts launch
time and the device's work lands wherever something waits for it; the trace shows the device's own time.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Iterator

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import HandlersTimeProfiler

from cifar10_dist.outputs import files
from cifar10_dist.system import ranks

logger = logging.getLogger("cifar10_dist")

WARMUP = 5  # iterations of this launch before the trace starts (first-call allocations, autotuning)
TOP_OPERATORS = 15
SHOWN_SHARE = 0.001  # parts below this share of the time are summed in the log line


class RunProfiler:
    """The trace of ``iterations`` iterations after WARMUP, and the handlers' times over the whole run."""

    def __init__(self, iterations: int, run_dir: Path) -> None:
        self.iterations, self.folder = iterations, run_dir / "profile"
        self.handlers = HandlersTimeProfiler()
        self.profiler: torch.profiler.profile | None = None
        self.seen = 0  # iterations of this launch
        self.launch_iterations = 0  # how many this launch runs
        self.warmup = WARMUP
        self.traced = 0
        self.trace: Path | None = None
        self.table = ""

    def attach(self, trainer: Engine) -> None:
        """Times every handler the trainer has when it starts (attach it last), traces the window."""
        self.handlers.attach(trainer)
        trainer.add_event_handler(Events.STARTED, self._plan)
        trainer.add_event_handler(Events.ITERATION_STARTED, self._maybe_start)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, self._maybe_stop)

    def _plan(self, engine: Engine) -> None:
        """A launch too short for the warm-up and the window shortens the warm-up (to none at the least), so that
        as many of the asked iterations as it has are traced, and says so."""
        self.launch_iterations = max(
            (engine.state.max_epochs or 0) * (engine.state.epoch_length or 0) - engine.state.iteration, 0
        )
        self.warmup = WARMUP if self.launch_iterations > WARMUP else 0
        if self.launch_iterations < WARMUP + self.iterations:
            ranks.on_rank_zero(
                logger.warning,
                "profile: this launch has %d training iterations, fewer than %d of warm-up and the %d asked: %s",
                self.launch_iterations,
                WARMUP,
                self.iterations,
                self.shortened(),
            )

    def shortened(self) -> str:
        """What a launch too short for the warm-up and the window traces."""
        if not self.launch_iterations:
            return "nothing is traced"
        if not self.warmup:
            return (
                f"tracing all {self.launch_iterations} with no warm-up (first-call costs, allocations and "
                f"autotuning, show in the trace)"
            )
        return f"tracing the last {self.launch_iterations - WARMUP} after {WARMUP} of warm-up"

    def _maybe_start(self, _: Engine) -> None:
        self.seen += 1
        if self.seen == self.warmup + 1 and self.profiler is None:
            self.profiler = torch.profiler.profile(activities=activities())
            with quiet_kineto_without_gpu():
                self.profiler.__enter__()

    def _maybe_stop(self, _: Engine) -> None:
        if self.profiler is not None and self.trace is None:
            self.traced += 1
            if self.traced >= self.iterations:
                self._stop()

    def _stop(self) -> None:
        """End the trace and write it (every rank its own file; rank 0 the table of top operators)."""
        assert self.profiler is not None  # (started)
        self.profiler.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.trace = self.folder / f"rank{idist.get_rank()}.pt.trace.json"
        self.profiler.export_chrome_trace(str(self.trace))
        sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        self.table = self.profiler.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS)
        ranks.on_rank_zero(
            files.write_file,
            self.folder / "top_operators.txt",
            f"{self.traced} training iterations after {self.warmup} of warm-up, sorted by {sort_by}\n{self.table}\n",
        )
        ranks.on_rank_zero(
            logger.info,
            "profile: top operators by self time over %d iterations (%s)\n%s",
            self.traced,
            self.trace.parent,
            self.table,
        )

    def report(self) -> dict[str, Any]:
        """After the run: the trace ended (if the run was shorter than the window) and each part's share of the
        time, logged on rank 0 and returned for summary.json."""
        if self.profiler is not None and self.trace is None:
            self._stop()
        shares = time_shares(self.handlers.get_results())
        total = sum(shares.values()) or 1.0
        shown = {name: seconds for name, seconds in shares.items() if seconds / total >= SHOWN_SHARE}
        others = (sum(shares.values()) - sum(shown.values())) / total
        rest = f", {len(shares) - len(shown)} other handlers {others:.1%}"
        ranks.on_rank_zero(
            logger.info,
            "profile: where the run's time went (HandlersTimeProfiler, %.1f s): %s%s",
            total,
            ", ".join(f"{name} {seconds / total:.1%}" for name, seconds in shown.items()),
            rest if len(shown) < len(shares) else "",
        )
        return {
            "iterations_traced": self.traced,
            "warmup_iterations": self.warmup,
            "trace": str(self.trace) if self.trace else None,
            "seconds": {k: round(v, 4) for k, v in shares.items()},
            "shares": {name: round(seconds / total, 4) for name, seconds in shares.items()},
        }


def activities() -> list[torch.profiler.ProfilerActivity]:
    """CPU activity, and CUDA's only where there is a GPU."""
    found = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        found.append(torch.profiler.ProfilerActivity.CUDA)
    return found


@contextlib.contextmanager
def quiet_kineto_without_gpu() -> Iterator[None]:
    """Without a GPU, a CUDA build's profiler library (kineto) logs "ERROR: gpuGetDeviceCount failed" when it
    writes the trace: its log level, read once as the profiler starts, is set to errors-off for that start only
    (a level the user set is kept, and the environment is left as it was)."""
    if torch.cuda.is_available() or "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = "5"
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


LABELS = {
    "Dataflow": "data loading",
    "Processing": "training step",
    "attach_validation.maybe_validate": "evaluation",
    "finite_weights_only.save_if_finite": "checkpoints",
}


def time_shares(results: list[list[Any]]) -> dict[str, float]:
    """Seconds per part from HandlersTimeProfiler's rows, largest first: data loading (its Dataflow), the
    training step (Processing), evaluation, checkpoints and each other handler summed over its events (named
    by where it is defined; the profiler's own handlers as "profiler"); parts that took no time are left out."""
    parts: dict[str, float] = {}
    for name, _event, total, *_ in results:
        if name == "Total" or not isinstance(total, float) or total <= 0:
            continue
        plain = name.replace("<locals>.", "")
        label = "profiler" if plain.startswith("RunProfiler.") else LABELS.get(plain, plain)
        parts[label] = parts.get(label, 0.0) + total
    return dict(sorted(parts.items(), key=lambda item: -item[1]))


def attach(iterations: int, run_dir: Path, trainer: Engine) -> RunProfiler | None:
    """A RunProfiler on the trainer when ``profile`` asks for one (after every other handler is attached)."""
    if not iterations:
        return None
    profiler = RunProfiler(iterations, run_dir)
    profiler.attach(trainer)
    return profiler

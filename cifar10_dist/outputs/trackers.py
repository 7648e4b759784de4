"""The trackers: outside stores a run also reports to (ClearML, MLflow, Weights & Biases), behind one interface
(``Tracker``) and one opener (``open_trackers``) that the training worker calls once; the local record (TensorBoard,
metrics.jsonl, summary.json) is ``scalars.Recorder``'s and the run folder's, not a tracker's. Adding a tracker is one
module implementing ``Tracker`` plus its keys in ``config.output_keys`` and one line in ``TRACKERS``. A tracker gets
the run's ``Config`` (typed: ``config.with_mlflow``, never a key by string) and logs ``config.replayable()``.

Every tracker reaches its store through ``tracker_guard.Guarded`` (a background thread on rank 0): a store that
stops answering is one warning, never the run's end.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from cifar10_dist.config import Config
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.outputs.tracker_guard import Guarded


class Tracker(Protocol):
    """What a tracker is given and does. It is built on every rank with the resolved config, the run folder and the
    run's provenance, and does its work on rank 0 (``enabled`` there when its ``with_*`` key is on), except its
    ``saver``, which every rank uses."""

    enabled: bool

    @property
    def store(self) -> str | None:
        """Where it sends, for messages."""

    def report_scalar(self, tag: str, value: float, step: int) -> None:
        """A scalar by name and step, kept locally until ``flush`` (never sent from here)."""

    def flush(self) -> None:
        """Send what is kept (starting the tracker's run first if that has not happened); raises when the store
        does not answer, keeping what it could not send."""

    def unsent(self) -> int:
        """Scalars kept and not yet sent."""

    def log_artifacts(self, run_dir: Path) -> None:
        """The run's record files at the end (and, where the tracker is asked to, the best model file)."""

    def saver(self, run_dir: Path) -> Any:
        """A checkpoint writer that also uploads the files (Ignite's BaseSaveHandler), or None."""

    def summary_fields(self) -> dict[str, Any]:
        """Fields of summary.json this tracker fills (e.g. where an offline session was kept)."""

    def end(self, status: str) -> None:
        """FINISHED, FAILED or KILLED (stopped by a signal: a resume continues it)."""


def _clearml(config: Config, run_dir: Path, provenance: Provenance) -> Tracker:
    from cifar10_dist.outputs.clearml_tracking import ClearML

    return ClearML(config, run_dir)


def _mlflow(config: Config, run_dir: Path, provenance: Provenance) -> Tracker:
    from cifar10_dist.outputs.mlflow_tracking import MLflow

    return MLflow(config, run_dir, provenance)


def _wandb(config: Config, run_dir: Path, provenance: Provenance) -> Tracker:
    from cifar10_dist.outputs.wandb_tracking import WandB

    return WandB(config, run_dir, provenance)


def _require_clearml() -> None:
    from cifar10_dist.outputs.clearml_tracking import require_clearml

    require_clearml()


def _require_mlflow() -> None:
    from cifar10_dist.outputs.mlflow_tracking import require_mlflow

    require_mlflow()


def _require_wandb() -> None:
    from cifar10_dist.outputs.wandb_tracking import require_wandb

    require_wandb()


@dataclass(frozen=True)
class TrackerKind:
    """A tracker as the opener knows it: whether a run's config turns it on, its builder, its install check."""

    turned_on: Callable[[Config], bool]
    build: Callable[[Config, Path, Provenance], Tracker]
    require: Callable[[], None]


TRACKERS: dict[str, TrackerKind] = {
    "clearml": TrackerKind(lambda config: config.with_clearml, _clearml, _require_clearml),
    "mlflow": TrackerKind(lambda config: config.with_mlflow, _mlflow, _require_mlflow),
    "wandb": TrackerKind(lambda config: config.with_wandb, _wandb, _require_wandb),
}


def check_installed(config: Config) -> None:
    """Each tracker that is on: its package importable, else one line saying what to install (preflight)."""
    for kind in TRACKERS.values():
        if kind.turned_on(config):
            kind.require()


class OpenTrackers:
    """The run's trackers, each guarded, as one context manager: entered, each starts (in the background); left,
    each ends with the run's status, waiting a bounded time for its store."""

    def __init__(self, guarded: list[Guarded]) -> None:
        self.guarded = guarded
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> OpenTrackers:
        for tracker in self.guarded:
            self._stack.enter_context(tracker)
        return self

    def __exit__(self, *exc_info: Any) -> bool | None:
        return self._stack.__exit__(*exc_info)

    def saver(self, run_dir: Path) -> Any:
        """The checkpoint writer of the first tracker that has one (every rank), else None (plain files)."""
        savers = (guarded.tracker.saver(run_dir) for guarded in self.guarded if guarded.tracker.enabled)
        return next((saver for saver in savers if saver is not None), None)

    def send_artifacts(self, run_dir: Path) -> None:
        """The run's files to every tracker, in the background (rank 0)."""
        for guarded in self.guarded:
            guarded.send("artifacts", functools.partial(guarded.tracker.log_artifacts, run_dir))

    def summary_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for guarded in self.guarded:
            if guarded.tracker.enabled:
                fields.update(guarded.tracker.summary_fields())
        return fields


def open_trackers(config: Config, run_dir: Path, provenance: Provenance) -> OpenTrackers:
    """Every tracker whose ``with_*`` key is on, built and guarded (enter the result to start them); each logs
    ``config.replayable()`` as the run's parameters."""
    return OpenTrackers(
        [
            Guarded(kind.build(config, run_dir, provenance), name, run_dir)
            for name, kind in TRACKERS.items()
            if kind.turned_on(config)
        ]
    )

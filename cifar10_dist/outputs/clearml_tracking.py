"""ClearML tracking (rank 0; ``with_clearml``): a task named after the run folder; scalars reach it through
``scalars.Recorder``, checkpoints through Ignite's ClearMLSaver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cifar10_dist.config import Config
from cifar10_dist.errors import UserError
from cifar10_dist.system.ranks import on_rank_zero


def require_clearml() -> None:
    try:
        import clearml  # noqa: F401
    except ImportError:
        raise UserError(
            "with_clearml needs ClearML: pip install 'cifar10-dist[clearml]' (or pip install clearml)"
        ) from None


class ClearML:
    """ClearML tracking (rank 0; ``with_clearml``): a task named after the run folder with the resolved config
    connected; scalars arrive through ``Recorder`` only (ClearML's own TensorBoard capture is off, so each
    quantity arrives once), checkpoints through Ignite's ClearMLSaver. ClearML's git detection is off: it ran
    git in a thread whose pipe a forked helper could inherit, which hung the task's close; provenance.json
    records the commit instead. ``clearml_offline`` (or ClearML's own
    CLEARML_OFFLINE_MODE=1) records the session locally. Scalars and the close reach the server through
    ``tracker_guard.Guarded``: a server that does not answer never ends the run."""

    def __init__(self, config: Config, run_dir: Path) -> None:
        self.logger: Any = None
        self.task: Any = None
        self.enabled = config.with_clearml
        if self.enabled:
            on_rank_zero(self._start, config, run_dir)

    def _start(self, config: Config, run_dir: Path) -> None:
        from clearml import Task
        from ignite.handlers.clearml_logger import ClearMLLogger

        if config.clearml_offline:
            Task.set_offline(offline_mode=True)
        self.logger = ClearMLLogger(
            project_name=config.clearml_project,
            task_name=run_dir.name,
            auto_connect_frameworks={"tensorboard": False, "matplotlib": False, "detect_repository": False},
        )
        self.task = Task.current_task()  # the task ClearMLLogger just started
        self.task.connect(config.replayable(), name="config")

    def saver(self, run_dir: Path) -> Any:
        """Checkpoint writer: ClearMLSaver (on every rank; it registers the files with the task on rank 0)."""
        from ignite.handlers.clearml_logger import ClearMLSaver

        return (
            ClearMLSaver(self.logger, dirname=str(run_dir), require_empty=False, atomic=True) if self.enabled else None
        )

    def log_artifacts(self, run_dir: Path) -> None:
        """The checkpoints reach ClearML through the saver; nothing more at the end."""

    def summary_fields(self) -> dict[str, Any]:
        return {"clearml_offline_folder": self.offline_folder()}

    def report_scalar(self, tag: str, value: float, step: int) -> None:
        if self.task is not None:
            title, series = tag.split("/", 1)
            self.task.get_logger().report_scalar(title=title, series=series, value=value, iteration=step)

    def flush(self) -> None:
        """ClearML sends in the background: nothing to do here."""

    @property
    def store(self) -> str:
        folder = self.offline_folder()
        return f"offline folder {folder}" if folder else "ClearML's server (clearml.conf)"

    def unsent(self) -> int:
        """ClearML keeps and resends scalars itself."""
        return 0

    def end(self, status: str) -> None:
        """Close the task (ClearML sends what it still holds; the run's status is its own)."""
        self.close()

    def offline_folder(self) -> str | None:
        if self.task is None or not self.task.is_offline():
            return None
        return str(self.task.get_offline_mode_folder())

    def close(self) -> None:
        if self.logger is not None:
            logger_, self.logger = self.logger, None
            logger_.close()

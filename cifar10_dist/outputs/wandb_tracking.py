"""Weights & Biases tracking (rank 0; ``with_wandb``): one W&B run per run folder, kept across resumes (its id in
``wandb.json`` in the run folder, W&B's ``resume="allow"``), started through Ignite's ``WandBLogger`` as the
code-generator starts it. The run's config is the resolved config with the provenance under ``provenance``; its
metrics the scalars ``scalars.Recorder`` writes to TensorBoard, same names, each against its own step (a custom
``step`` axis: W&B's own step only grows, while epochs and iterations both count from 1); at the end the run's record
files as an artifact and, with ``wandb_log_model``, the best model file as another. A tuning trial's run is in the
group of its study. ``wandb_mode``: online, or offline without WANDB_API_KEY (the run kept in the run folder's
``wandb/``, for ``wandb sync``), so that a cluster node without network still tracks; an online start whose server
does not answer within INIT_TIMEOUT_SECONDS goes offline the same way, with one warning. A resume from a checkpoint
trains and logs again what ran after it: the steps that W&B's sessions of the run folder recorded (``wandb_history``)
are not sent a second time.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from cifar10_dist.config import Config
from cifar10_dist.errors import UserError, first_line
from cifar10_dist.outputs import checkpoint_files, files, wandb_history
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.outputs.run_folder import record_files
from cifar10_dist.system.ranks import is_rank_zero

logger = logging.getLogger("cifar10_dist")

RUN_FILE = "wandb.json"  # in the run folder: the W&B run this run folder reports to
INIT_TIMEOUT_SECONDS = 10  # an online start that gets no answer in this time goes offline (unless WANDB_INIT_TIMEOUT)


def require_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise UserError(
            "with_wandb needs Weights & Biases: pip install 'cifar10-dist[wandb]' (or pip install wandb)"
        ) from None
    return wandb


def wandb_mode(configured: str | None) -> str:
    """The configured mode, else online with an API key in the environment, else offline."""
    return configured or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


class WandB:
    """The W&B run of this run folder (rank 0; nothing elsewhere, when ``with_wandb`` is off or the mode is
    disabled): started or continued at the first flush (in ``tracker_guard``'s thread), scalars kept until a flush
    sends them."""

    def __init__(self, config: Config, run_dir: Path, provenance: Provenance) -> None:
        self.mode = wandb_mode(config.wandb_mode)
        self.enabled = config.with_wandb and self.mode != "disabled" and is_rank_zero()
        self.config, self.run_dir, self.provenance = config, run_dir, provenance.to_dict()
        self.store = f"W&B {self.mode} (project {config.wandb_project})"
        self.run: Any = None
        self.pending: list[tuple[str, float, int]] = []
        self.defined: set[str] = set()
        self.sent_before: dict[str, int] = {}  # each metric's last step that earlier launches' W&B recorded

    def _start(self) -> None:
        """Start or continue the run folder's W&B run; online, a server that does not answer within
        INIT_TIMEOUT_SECONDS leaves the run tracked offline in the run folder instead (one warning, the same run
        id: ``wandb sync`` sends it later), never a second W&B run."""
        kept = read_run_file(self.run_dir)
        run_id = kept["id"] if kept else uuid.uuid4().hex[:12]  # W&B's ids: lower-case letters and digits
        self.sent_before = wandb_history.last_steps(self.run_dir, run_id) if kept else {}
        try:
            self._init(run_id, self.mode)
        except Exception as error:  # noqa: BLE001 - whatever W&B's client raises for a server it cannot reach
            if self.mode != "online":
                raise
            self._go_offline(run_id, error)
        self.run = require_wandb().run
        self.run.define_metric("step", hidden=True)
        files.write_json(
            self.run_dir / RUN_FILE, {"id": run_id, "project": self.config.wandb_project, "mode": self.mode}
        )

    def _init(self, run_id: str, mode: str) -> None:
        from ignite.handlers.wandb_logger import WandBLogger

        wandb = require_wandb()
        study = None if self.config.trial is None else self.config.trial.study
        config = {**self.config.replayable(), "trial": study, "provenance": self.provenance}
        WandBLogger(
            project=self.config.wandb_project,
            entity=self.config.wandb_entity,
            name=self.run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
            mode=mode,
            group=study,
            job_type="trial" if study else "run",
            config=config,
            settings=wandb.Settings(console="off", silent=True, init_timeout=init_timeout()),
        )

    def _go_offline(self, run_id: str, error: BaseException) -> None:
        """After an online start that failed: W&B's service let go of the run id, the failed attempt's folder
        removed, and the same run started offline in the run folder."""
        wandb = require_wandb()
        wandb.teardown()
        for attempt in (self.run_dir / "wandb").glob(f"run-*-{run_id}"):
            shutil.rmtree(attempt, ignore_errors=True)
        logger.warning(
            "%s: the server did not answer within %g s (%s): this run is tracked offline in %s instead; "
            "wandb sync %s/offline-run-*-%s sends it when the server answers",
            self.store,
            init_timeout(),
            first_line(error),
            self.run_dir / "wandb",
            self.run_dir / "wandb",
            run_id,
        )
        self.mode = "offline"
        self.store = f"W&B offline (project {self.config.wandb_project})"
        self._init(run_id, "offline")

    def report_scalar(self, tag: str, value: float, step: int) -> None:
        """A metric, kept until a flush sends it."""
        if self.enabled:
            self.pending.append((tag, float(value), int(step)))

    def flush(self) -> None:
        """Start (or continue) the W&B run if that has not happened yet, then log the kept metrics, those of one
        step together, but none at a step W&B recorded before (a resume's second pass over the iterations after its
        checkpoint); each leaves ``pending`` once logged."""
        if not self.enabled:
            return
        if self.run is None:
            self._start()
        self.pending = [item for item in self.pending if item[2] > self.sent_before.get(item[0], -1)]
        while self.pending:
            step = self.pending[0][2]
            batch = []
            for tag, value, at in self.pending:
                if at != step:
                    break
                batch.append((tag, value))
            for tag, _ in batch:
                if tag not in self.defined:
                    self.run.define_metric(tag, step_metric="step")
                    self.defined.add(tag)
            self.run.log({**dict(batch), "step": step})
            del self.pending[: len(batch)]

    def unsent(self) -> int:
        return len(self.pending)

    def log_artifacts(self, run_dir: Path) -> None:
        """The run's record files (those present) as one artifact (``record-<id>``, type run-record) and, when
        asked (wandb_log_model), the best model file as another (``model-<id>``, type model)."""
        wandb = require_wandb()
        self.flush()
        record = wandb.Artifact(f"record-{self.run.id}", type="run-record")
        for path in record_files(run_dir):
            record.add_file(str(path))
        self.run.log_artifact(record)
        best_model = checkpoint_files.best_model_file(run_dir) if self.config.wandb_log_model else None
        if best_model is not None:
            model = wandb.Artifact(f"model-{self.run.id}", type="model")
            model.add_file(str(best_model))
            self.run.log_artifact(model)

    def saver(self, run_dir: Path) -> None:
        """Checkpoints stay files in the run folder (the best model reaches W&B with the artifacts)."""

    def summary_fields(self) -> dict[str, Any]:
        return {}

    def end(self, status: str) -> None:
        """FINISHED (exit code 0), FAILED (1) or KILLED (marked preempting: a resume continues it)."""
        self.flush()
        if status == "KILLED":
            self.run.mark_preempting()
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
        self.run = None


def init_timeout() -> float:
    """Seconds an online start waits for the server: W&B's own WANDB_INIT_TIMEOUT where the user set it, else
    INIT_TIMEOUT_SECONDS (W&B's default of 90 s would hold a run's start, and its end, for a minute and a half)."""
    try:
        return float(os.environ.get("WANDB_INIT_TIMEOUT", INIT_TIMEOUT_SECONDS))
    except ValueError:
        return float(INIT_TIMEOUT_SECONDS)


def read_run_file(run_dir: Path) -> dict[str, str] | None:
    try:
        kept = json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and "id" in kept else None

"""A tuning trial seen from inside its run: rank 0 reports each val accuracy to the Optuna trial and asks the
pruner, every rank gets the answer (``TrialReporter``, attached by ``training.run``); and the Optuna pieces that both
the trial's processes and ``tuning.studies`` (the study's driver, above the runs) need: the optuna module, storages,
pruners."""

from __future__ import annotations

import logging
import math
import random
import time
import warnings
from pathlib import Path
from typing import Any

from cifar10_dist.config import PrunerSpec, TrialSpec
from cifar10_dist.errors import UserError, first_line
from cifar10_dist.outputs import files
from cifar10_dist.system import ranks

logger = logging.getLogger("cifar10_dist")

JOURNAL_PREFIX = "journal:"
INSTALL_HINT = "pip install 'cifar10-dist[tune]'"
CREATION_ATTEMPTS = 5  # opening a database whose tables another worker is creating at the same moment
RETRIES = 3  # how often a failed (killed) trial is queued again


def require_optuna() -> Any:
    """The optuna module, or one line saying how to install it."""
    try:
        import optuna
    except ImportError as missing:
        raise UserError(f"tune needs the optuna package, which is not installed: {INSTALL_HINT}") from missing
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # tune prints a line per trial itself, with any failure
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def open_storage(url: str, heartbeat: int | None = None) -> Any:
    """An Optuna storage for the URL; database storages with a heartbeat (a trial whose process stops beating for
    2 heartbeats is failed and queued again)."""
    optuna = require_optuna()
    if url.startswith(JOURNAL_PREFIX):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url[len(JOURNAL_PREFIX) :])
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    beats = (
        {}
        if heartbeat is None
        else {
            "heartbeat_interval": heartbeat,
            "grace_period": 2 * heartbeat,
            "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=RETRIES),
        }
    )
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}  # several workers wait their turn
    for attempt in range(CREATION_ATTEMPTS):
        try:
            with files.sqlite_lock(url):  # workers starting together on a fresh file
                return optuna.storages.RDBStorage(url, engine_kwargs=engine, **beats)
        except Exception as error:  # SQLAlchemy's errors: no driver, server down, bad URL
            if _lost_creation_race(error) and attempt + 1 < CREATION_ATTEMPTS:
                time.sleep(0.5 + random.random())  # workers starting together race to create the tables
                continue
            raise UserError(f"storage '{without_password(url)}' cannot be opened: {first_line(error)}") from error
    raise AssertionError("unreachable")


def _lost_creation_race(error: Exception) -> bool:
    """True for the errors of two workers creating the same tables, types or rows at once: a unique-key violation,
    or "already exists" (SQLite and MySQL say it as an OperationalError, PostgreSQL as a ProgrammingError)."""
    name = type(error).__name__
    return name == "IntegrityError" or (
        name in ("OperationalError", "ProgrammingError") and "already exists" in str(error)
    )


def without_password(url: str) -> str:
    scheme, _, rest = url.partition("://")
    if "@" in rest and ":" in rest.split("@", 1)[0]:
        user = rest.split("@", 1)[0].split(":", 1)[0]
        return f"{scheme}://{user}:***@{rest.split('@', 1)[1]}"
    return url


def make_pruner(spec: PrunerSpec) -> Any:
    """The Optuna pruner that ``spec`` describes."""
    optuna = require_optuna()
    if spec.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.startup_trials, n_warmup_steps=spec.warmup_epochs)
    if spec.name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=spec.max_epochs)
    return optuna.pruners.NopPruner()


class TrialReporter:
    """Attached by ``training.run`` to the evaluation that chooses the best model: rank 0 reports its ``metric`` (the
    run's best_metric) to the trial (epoch as the step) and asks the pruner; every rank receives the answer, and a
    pruned run terminates the trainer after this validation (it then ends like any finished run)."""

    def __init__(self, spec: TrialSpec, trainer: Any, metric: str = "accuracy") -> None:
        self.spec = spec
        self.trainer = trainer
        self.metric = metric
        self.pruned_at: int | None = None
        self._trial: Any = None

    def __call__(self, evaluator: Any) -> None:
        state = self.trainer.state
        epoch, accuracy = state.epoch, float(evaluator.state.metrics[self.metric])
        finished = state.iteration >= state.max_epochs * state.epoch_length  # reported, never pruned: it is done
        if ranks.from_rank_zero(self._report, accuracy, epoch) and not finished:
            self.pruned_at = epoch
            logger.info(
                "pruned at epoch %d: val %s %.4f is below what the pruner keeps (trial %d)",
                epoch,
                self.metric,
                accuracy,
                self.spec.number,
            )
            self.trainer.terminate()

    def _report(self, accuracy: float, epoch: int) -> bool:
        trial = self._open()
        if trial is None or not math.isfinite(accuracy):
            return False
        trial.report(accuracy, epoch)
        return bool(trial.should_prune())

    def _open(self) -> Any:
        """The running trial, through the storage URL (None, with a warning, when it is not running any more:
        a trial's config.yaml run again by hand)."""
        if self._trial is None:
            optuna = require_optuna()
            storage = open_storage(self.spec.storage)
            study_id = storage.get_study_id_from_name(self.spec.study)
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.spec.number)
            if storage.get_trial(trial_id).state != optuna.trial.TrialState.RUNNING:
                logger.warning(
                    "trial %d of study %s is not running: its results are not reported",
                    self.spec.number,
                    self.spec.study,
                )
                self._trial = False
                return None
            study = optuna.load_study(study_name=self.spec.study, storage=storage, pruner=make_pruner(self.spec.pruner))
            self._trial = optuna.trial.Trial(study, trial_id)
        return self._trial or None

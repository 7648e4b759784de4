"""MLflow tracking (rank 0; ``with_mlflow``): one MLflow run per run folder, kept across resumes.

The run's parameters are the resolved config, its tags the provenance (git commit, data checksum, hardware,
precision, world size), its metrics the scalars ``scalars.Recorder`` writes to TensorBoard (same names, same
steps), its artifacts config.yaml, provenance.json, summary.json, curves.png and the mistakes picture (and the best
model file with ``mlflow_log_model``). The MLflow run's id is kept in the run folder (``mlflow.json``), so a
resumed run continues the same MLflow run. A tuning trial's run is a child of its study's run
(``mlflow_parent_run``). The store is ``mlflow_tracking_uri``, else MLflow's own MLFLOW_TRACKING_URI, else a
SQLite file in the output folder (artifacts beside it in ``mlartifacts/``). A server that stops answering never
ends the run (``tracker_guard``); each request to a server is bounded (``HTTP_BOUNDS``) instead of MLflow's
minutes of retries.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from cifar10_dist.config import Config
from cifar10_dist.errors import UserError, first_line
from cifar10_dist.outputs import checkpoint_files, files
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.outputs.run_folder import record_files
from cifar10_dist.system.ranks import is_rank_zero

RUN_FILE = "mlflow.json"  # in the run folder: the store and the MLflow run this run folder reports to
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag for nested runs (what its UI nests by)
BATCH = 1000  # metrics per log_batch call (MLflow's limit); params and tags: 100
QUIET_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")  # "Creating initial MLflow database tables"

logger = logging.getLogger("cifar10_dist")


def require_mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise UserError(
            "with_mlflow needs MLflow: pip install 'cifar10-dist[mlflow]' (or pip install mlflow)"
        ) from None
    return mlflow


def tracking_uri(configured: str | None, output_path: str | Path) -> str:
    """The store: the configured URI, else MLFLOW_TRACKING_URI, else sqlite:///<output_path>/mlflow.db."""
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(Path(output_path) / 'mlflow.db').resolve()}"


def open_client(uri: str) -> Any:
    """An MlflowClient on the store, its schema created or checked under the SQLite lock (``files.sqlite_lock``:
    tune workers starting together, as for the Optuna study)."""
    mlflow = require_mlflow()
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    with files.sqlite_lock(uri):
        client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # creates or upgrades a SQLite store's tables now, under the lock
    return client


def experiment_id(client: Any, name: str, uri: str) -> str:
    """The experiment's id, created when missing (a SQLite store's artifacts go beside it, in mlartifacts/)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
    with files.sqlite_lock(uri):
        found = client.get_experiment_by_name(name)  # a worker beside this one may have made it meanwhile
        return found.experiment_id if found is not None else client.create_experiment(name, location)


def provenance_tags(record: Provenance) -> dict[str, str]:
    """The provenance worth filtering runs by, as MLflow tags."""
    package, versions = record.package, record.versions or {}
    tags = {
        "git_commit": package.git_commit,
        "git_dirty": package.git_dirty,
        "package_version": package.version,
        "dataset": record.dataset.name,
        "dataset_sha256": record.dataset.sha256,
        "precision": record.precision,
        "backend": record.backend,
        "world_size": record.world_size,
        "devices": ", ".join(f"{count} x {name}" for name, count in (record.devices or {}).items()),
        "cpu": record.cpu_model,
        "torch": versions.get("torch"),
    }
    return {f"cifar10_dist.{key}": str(value) for key, value in tags.items() if value is not None}


def as_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The config as MLflow parameters: strings (mappings and lists as JSON), at most MLflow's 6,000 characters."""

    def text(value: Any) -> str:
        return json.dumps(value) if isinstance(value, (dict, list, tuple)) else str(value)

    return {key: text(value)[:6000] for key, value in config.items()}


class MLflow:
    """The MLflow run of this run folder (rank 0; nothing elsewhere or when ``with_mlflow`` is off): started or
    continued at the first flush, fed scalars by the Recorder, given the artifacts and its status at the end.
    Every call that reaches the store goes through ``tracker_guard.Guarded`` (a background thread; a store that
    does not answer never ends the run); scalars wait in ``pending`` until a flush has sent them."""

    def __init__(self, config: Config, run_dir: Path, provenance: Provenance) -> None:
        self.client: Any = None
        self.run_id: str | None = None
        self.pending: list[Any] = []
        self.logged: dict[str, int] = {}  # a continued run: each metric's last step the store had at the start
        self.enabled = config.with_mlflow and is_rank_zero()
        self.config, self.run_dir, self.provenance = config, run_dir, provenance
        self.store = tracking_uri(config.mlflow_tracking_uri, config.output_path) if self.enabled else ""
        self.bounded: dict[str, str | None] = {}
        if config.with_mlflow:
            require_mlflow()
        if self.store.startswith(("http:", "https:")):
            self.bounded = bound_http_retries()

    def _start(self) -> None:
        config, run_dir, uri = self.config, self.run_dir, self.store
        self.client = self.client or open_client(uri)
        kept = read_run_file(run_dir)
        if kept is not None and kept["tracking_uri"] == uri and self._still_there(kept["run_id"]):
            self.client.update_run(kept["run_id"], status="RUNNING")
            self.client.set_tag(kept["run_id"], "cifar10_dist.resumed_from", str(self.provenance.resumed_from))
            self.run_id = kept["run_id"]
            self.logged = self._last_steps()
            logger.info("mlflow: continuing run %s in %s", self.run_id, uri)
            return
        experiment = experiment_id(self.client, config.mlflow_experiment, uri)
        tags = {**provenance_tags(self.provenance), "cifar10_dist.run_dir": str(run_dir.resolve())}
        if config.mlflow_parent_run:
            tags[PARENT_TAG] = config.mlflow_parent_run
        run = self.client.create_run(experiment, run_name=run_dir.name, tags=tags)
        params = {key: value for key, value in config.replayable().items() if key != "mlflow_parent_run"}
        self._log_params(run.info.run_id, as_params(params))
        files.write_json(
            run_dir / RUN_FILE, {"tracking_uri": uri, "experiment_id": experiment, "run_id": run.info.run_id}
        )
        self.run_id = run.info.run_id
        browse = f"open {uri}" if uri.startswith(("http:", "https:")) else f"mlflow ui --backend-store-uri {uri}"
        logger.info(
            "mlflow: run %s (%s) in experiment %s of %s; to browse: %s",
            run_dir.name,
            self.run_id,
            config.mlflow_experiment,
            uri,
            browse,
        )

    def _last_steps(self) -> dict[str, int]:
        """Each metric's last step in the store's run: a resume from a checkpoint trains and logs again the
        iterations (and an evaluation) that ran after it before the stop, which the store may already have."""
        return {
            key: max(metric.step for metric in self.client.get_metric_history(self.run_id, key))
            for key in self.client.get_run(self.run_id).data.metrics
        }

    def _still_there(self, run_id: str) -> bool:
        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except Exception:  # deleted from the store, or another store at the same address: a new MLflow run
            return False

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[start : start + 100])

    def report_scalar(self, tag: str, value: float, step: int) -> None:
        """A metric, kept until a flush sends it (each log_batch is one store transaction)."""
        if self.enabled:
            from mlflow.entities import Metric

            self.pending.append(Metric(tag, float(value), int(time.time() * 1000), step))

    def flush(self) -> None:
        """Start (or continue) the MLflow run if that has not happened yet, then send the kept metrics; a batch
        leaves ``pending`` only once the store has it."""
        if not self.enabled:
            return
        if self.run_id is None:
            self._start()
        if self.logged:  # never a step twice: what the store has from before a resume is not sent again
            self.pending = [metric for metric in self.pending if metric.step > self.logged.get(metric.key, -1)]
        while self.pending:
            batch = self.pending[:BATCH]
            self.client.log_batch(self.run_id, metrics=batch)
            del self.pending[: len(batch)]

    def unsent(self) -> int:
        return len(self.pending)

    def log_artifacts(self, run_dir: Path) -> None:
        """The run's record files (those present) and, when asked (mlflow_log_model), the best model file."""
        with_best_model = self.config.mlflow_log_model
        self.flush()
        for path in record_files(run_dir):
            self.client.log_artifact(self.run_id, str(path))
        best_model = checkpoint_files.best_model_file(run_dir) if with_best_model else None
        if best_model is not None:
            self.client.log_artifact(self.run_id, str(best_model), artifact_path="model")

    def saver(self, run_dir: Path) -> None:
        """Checkpoints stay files in the run folder (the best model reaches MLflow with the artifacts)."""

    def summary_fields(self) -> dict[str, Any]:
        return {}

    def end(self, status: str) -> None:
        """FINISHED, FAILED or KILLED (stopped by a signal: a resume continues it)."""
        try:
            self.flush()
            self.client.set_terminated(self.run_id, status=status)
        finally:
            restore_environment(self.bounded)


HTTP_BOUNDS = {  # MLflow's own defaults retry a request for minutes; the user's settings of these win
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def bound_http_retries() -> dict[str, str | None]:
    """Bound each request to an MLflow server (about 3 s when nothing listens, 30 s when it hangs) while the run
    lasts, where the environment does not already say; returns what to restore."""
    earlier = {name: os.environ.get(name) for name in HTTP_BOUNDS if name not in os.environ}
    os.environ.update({name: HTTP_BOUNDS[name] for name in earlier})
    return earlier


def restore_environment(earlier: Mapping[str, str | None]) -> None:
    for name, value in earlier.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def read_run_file(run_dir: Path) -> dict[str, str] | None:
    try:
        kept = json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and {"tracking_uri", "run_id"} <= set(kept) else None


def study_run(uri: str, experiment: str, study: str, params: Mapping[str, Any]) -> str:
    """The MLflow run of a tuning study (the parent of its trials' runs): found by its tag, or created once
    (workers starting together take turns under the store lock); returns its id."""
    client = open_client(uri)
    experiment_number = experiment_id(client, experiment, uri)
    query = f"tags.`cifar10_dist.study` = '{study}'"
    with files.sqlite_lock(uri):
        found = client.search_runs([experiment_number], filter_string=query, max_results=1)
        if found:
            return found[0].info.run_id
        run = client.create_run(experiment_number, run_name=f"study {study}", tags={"cifar10_dist.study": study})
    client.log_batch(
        run.info.run_id,
        params=[require_mlflow().entities.Param(key, value) for key, value in as_params(params).items()][:100],
    )
    return run.info.run_id


def log_study_best(uri: str, run_id: str, best_value: float, trials: int) -> None:
    """The study's best val accuracy so far, a metric of its run at step = trials finished."""
    open_client(uri).log_metric(run_id, "study/best_value", best_value, step=trials)


STUDY_WARNED: set[str] = set()  # stores this process has already warned about for a study's own calls


def for_the_study(what: str, uri: str, action: Callable[[], Any]) -> Any | None:
    """A tuning study's own call to its MLflow store (its parent run, its best value), as a run's tracker makes
    them: requests bounded (``HTTP_BOUNDS``), and a store that does not answer is one warning per store, never the
    study's end (None then); the trials go on, each tracked as a run is."""
    earlier = bound_http_retries()
    try:
        return action()
    except Exception as error:  # noqa: BLE001 - whatever MLflow's client raises for a store it cannot reach
        if uri not in STUDY_WARNED:
            STUDY_WARNED.add(uri)
            logger.warning(
                "MLflow: the store at %s does not answer (%s): the study goes on without %s; each "
                "trial's own run is tracked as a run's is (metrics.jsonl keeps everything)",
                uri,
                first_line(error),
                what,
            )
        return None
    finally:
        restore_environment(earlier)

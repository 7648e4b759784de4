"""Hyperparameter tuning with Optuna: a search space over config keys, trials that are ordinary runs, pruning
agreed by every process of a trial, and a test set that no trial sees.

The study lives in a storage that many ``tune`` processes share (SQLite by default, Optuna's journal file, or any
SQLAlchemy URL such as PostgreSQL); each process runs ``trials`` trials, one after another, through the usual
launcher. A trial's processes reach the study through its storage URL (in the trial's config), never through
pickled objects: rank 0 reports the selection accuracy after each validation and asks whether to prune, and all
ranks follow its answer. A trial whose worker was killed is failed by Optuna's heartbeat (database storages) and
retried by another worker from its newest checkpoint; a trial stopped by Ctrl-C or preemption is queued again
at once and continues from the checkpoint the stop wrote.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from cifar10_dist.config import Config, PrunerSpec, TrialSpec, load_config
from cifar10_dist.errors import Interrupted, Preempted, UserError
from cifar10_dist.outputs import log_lines, reading
from cifar10_dist.results import TuneResult
from cifar10_dist.training.loop.trials import RETRIES, open_storage, require_optuna, without_password
from cifar10_dist.tuning.opening import TuneOptions, open_study, pruner_spec, storage_url, study_of
from cifar10_dist.tuning.reporting import (
    INTERRUPTED,
    format_params,
    format_trial_line,
    state_name,
    trial_table,
    write_plots,
)
from cifar10_dist.tuning.search_space import Dimension, check_space

logger = logging.getLogger("cifar10_dist")

# ---------------------------------------------------------------- one trial


class TrialFailed(Exception):
    """A trial's run ended with a user error (diverged, bad combination of values): the trial fails, tuning goes on."""


@dataclass
class Objective:
    """Runs one trial as an ordinary run in output_path/STUDY/trial-<number> and returns its best selection
    accuracy; a pruned run raises optuna.TrialPruned."""

    base: Config
    space: Mapping[str, Dimension]
    study_dir: Path
    url: str
    study: Any
    pruner: PrunerSpec
    current: int | None = None
    mlflow_parent: tuple[str, str] | None = None  # with_mlflow: (store URI, the study's MLflow run)

    def __call__(self, trial: Any) -> float:
        optuna = require_optuna()
        from cifar10_dist import runs

        self.current = trial.number
        params = {name: dimension.suggest(trial) for name, dimension in self.space.items()}
        history = retry_history(self.study, trial.number)
        resume = retried_checkpoint(history, self.study_dir)
        trial.set_user_attr("run_dir", str(self.study_dir / f"trial-{trial.number}"))
        logger.info(
            "trial %d: %s%s",
            trial.number,
            format_params(params),
            f" (retry of trial {history[0]}, from {resume})" if resume else "",
        )
        try:
            result = runs.train_trial(self.trial_config(trial.number, params, resume))  # a refused one fails too
        except (Preempted, Interrupted):
            trial.set_user_attr(INTERRUPTED, True)  # Optuna fails it; the table says it was interrupted
            raise
        except UserError as error:
            trial.set_user_attr("fail_reason", str(error))
            raise TrialFailed(f"trial {trial.number} failed: {error}") from error
        if result.pruned_at is not None:
            raise optuna.TrialPruned(f"pruned at epoch {result.pruned_at}")
        return best_accuracy(Path(result.run_dir))

    def trial_config(self, number: int, params: Mapping[str, Any], resume: str | None) -> Config:
        trial = TrialSpec(
            study=self.study.study_name, storage=self.url, number=number, params=dict(params), pruner=self.pruner
        )
        values = {
            **self.base.to_dict(),
            **params,
            "output_path": str(self.study_dir),
            "run_name": f"trial-{number}",
            "resume_from": resume,
            "overwrite": False,
            "seeds": 1,
            "trial": trial,
        }
        if self.mlflow_parent is not None:  # the trial's MLflow run: a child of the study's, in the same store
            values.update(mlflow_tracking_uri=self.mlflow_parent[0], mlflow_parent_run=self.mlflow_parent[1])
        return load_config(None, **values)


def retry_history(study: Any, number: int) -> list[int]:
    """The trials that this one repeats, first the original (RetryHeartbeatStaleTrialCallback records them); [] for a
    trial of its own."""
    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    return list(frozen.system_attrs.get("retry_history", []))


def retried_checkpoint(history: list[int], study_dir: Path) -> str | None:
    """For a trial queued again after its worker died or stopped: the newest valid checkpoint of the trials it
    repeats (the latest first), else None (it starts from zero)."""
    from cifar10_dist.outputs import checkpoint_files

    for number in reversed(history):
        newest = checkpoint_files.newest_valid_checkpoint(study_dir / f"trial-{number}")
        if newest is not None:
            return str(newest)
    return None


def best_accuracy(run_dir: Path) -> float:
    """The objective: the best selection (val) value of the run's best_metric (accuracy by default) of a finished
    trial run, from its summary.json."""
    summary = reading.read_summary(run_dir)
    if summary is None or summary.best is None:
        raise TrialFailed(f"{run_dir} has no validation result: it cannot be ranked")
    return float(summary.best.value if summary.best.value is not None else summary.best.accuracy)


# ---------------------------------------------------------------- the tuning loop, the final test, the report


def tune(
    base: Config, space: Mapping[str, Dimension], options: TuneOptions, echo: Callable[[str], None] = print
) -> TuneResult:
    """Run ``options.trials`` trials of the study in this process, then report (and the final test)."""
    require_optuna()
    if base.val_split <= 0:
        raise UserError(
            f"tune needs val_split > 0 (got {base.val_split}): trials are ranked on held-out training "
            "images, never on the test set (e.g. --val_split=0.1)"
        )
    if base.resume_from is not None or base.seeds != 1:
        raise UserError("tune sets resume_from and runs one seed per trial: drop resume_from and seeds")
    check_space(base, space)
    with log_lines.package_logging():  # the study's own warnings (a store that does not answer) as a run's show
        return run_study(base, space, options, echo)


def run_study(
    base: Config, space: Mapping[str, Dimension], options: TuneOptions, echo: Callable[[str], None] = print
) -> TuneResult:
    """The checked study: open it, run the trials, report."""
    study, url = open_study(options, base, space)
    study_dir = Path(study_of(study)["study_dir"])
    objective = Objective(
        base,
        space,
        study_dir,
        url,
        study,
        pruner_spec(options, base.num_epochs),
        mlflow_parent=study_mlflow_run(base, space, options) if base.with_mlflow else None,
    )
    echo(
        f"study {options.study} in {without_password(url)}: {len(study.trials)} trials so far; running "
        f"{options.trials} here"
    )

    def announce(done_study: Any, trial: Any) -> None:
        echo(format_trial_line(trial))
        if objective.mlflow_parent is not None and done_study.best_trials:
            from cifar10_dist.outputs import mlflow_tracking

            finished = sum(t.state.is_finished() for t in done_study.get_trials(deepcopy=False))
            uri, run_id = objective.mlflow_parent
            mlflow_tracking.for_the_study(
                "its best value",
                uri,
                lambda: mlflow_tracking.log_study_best(uri, run_id, done_study.best_value, finished),
            )

    try:
        study.optimize(objective, n_trials=options.trials, catch=(TrialFailed,), callbacks=[announce])
    except (Preempted, Interrupted) as stop:
        queue_again(study, objective.current)
        how = str(stop).split(":", 1)[0]  # "stopped at iteration 12 on SIGTERM" / "interrupted at epoch 1, ..."
        message = (
            f"trial {objective.current} {how}: checkpoint written and the trial queued again in study "
            f"{options.study}; run the same tune command (or any worker of the study) to continue it"
        )
        raise (Preempted(message) if isinstance(stop, Preempted) else Interrupted(message)) from stop
    return report(study, echo, final_test=options.final_test)


def study_mlflow_run(base: Config, space: Mapping[str, Dimension], options: TuneOptions) -> tuple[str, str] | None:
    """with_mlflow: the study's MLflow run (found or created once), whose children the trials' runs are; its
    parameters are the study's settings and searched keys. None when the store does not answer (one warning):
    the trials' runs are then not grouped under it."""
    from cifar10_dist.outputs import mlflow_tracking

    uri = mlflow_tracking.tracking_uri(base.mlflow_tracking_uri, base.output_path)
    params = {
        "study": options.study,
        "sampler": options.sampler,
        "pruner": options.pruner,
        "best_metric": base.best_metric,
        **{f"space.{name}": dim for name, dim in space.items()},
    }
    run_id = mlflow_tracking.for_the_study(
        "its own run (the trials' parent)",
        uri,
        lambda: mlflow_tracking.study_run(uri, base.mlflow_experiment, str(options.study), params),
    )
    return (uri, run_id) if run_id is not None else None


def queue_again(study: Any, number: int | None) -> None:
    """A trial stopped by Ctrl-C or preemption (its checkpoint written): queue it again, to continue from there."""
    optuna = require_optuna()
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is not None and trial.state == optuna.trial.TrialState.FAIL:
        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=RETRIES)(study, trial)
        logger.info("trial %d stopped: queued again, the next worker continues it from its checkpoint", number)


def report(study: Any, echo: Callable[[str], None] = print, final_test: bool = False) -> TuneResult:
    """The trial table, best_config.yaml and plots in the study folder; the final test when asked."""
    from cifar10_dist.outputs import files

    study_dir = Path(study_of(study)["study_dir"])
    trials = study.get_trials(deepcopy=False)
    trial_state = require_optuna().trial.TrialState
    shown = [
        each.name
        for each in (
            trial_state.COMPLETE,
            trial_state.PRUNED,
            trial_state.FAIL,
            trial_state.RUNNING,
            trial_state.WAITING,
        )
    ] + ["INTERRUPTED"]
    states = {each: sum(state_name(t) == each for t in trials) for each in shown}
    echo(trial_table(trials))
    echo("trials: " + ", ".join(f"{count} {state.lower()}" for state, count in states.items() if count))
    summary = TuneResult(study.study_name, str(study_dir), states)
    completed = [t for t in trials if t.state == trial_state.COMPLETE]
    if completed:
        best = study.best_trial
        best_config = best_config_of(study, best)
        files.write_yaml(study_dir / "best_config.yaml", best_config)
        base = Config.from_record(study_of(study)["base_config"])  # (an older study's: today's defaults)
        metric = base.best_metric
        echo(f"best: trial {best.number}, val {metric} {best.value:.4f}, {format_params(best.params)}")
        echo(
            f"best config: {study_dir / 'best_config.yaml'} (cifar10-dist run "
            f"--config={study_dir / 'best_config.yaml'})"
        )
        summary = dataclasses.replace(
            summary,
            best_trial=best.number,
            best_value=best.value,
            best_params=dict(best.params),
            plots=write_plots(study, study_dir) if base.figures else [],
        )
        if final_test:
            summary = dataclasses.replace(summary, final_test=run_final_test(study, best, echo))
    files.write_json(study_dir / "tuning_summary.json", summary.to_dict())
    if not completed and states["FAIL"]:
        raise UserError(
            f"no trial of study {study.study_name} has completed ({states['FAIL']} failed, the reasons "
            "are above): no best config"
        )
    return summary


def best_config_of(study: Any, best: Any) -> dict[str, Any]:
    """The base config with the best trial's values: ``cifar10-dist run --config=`` takes it as it is."""
    values = {**study_of(study)["base_config"], **best.params}
    return load_config(None, **values).to_dict()


def run_final_test(study: Any, best: Any, echo: Callable[[str], None]) -> dict[str, Any] | None:
    """The best trial's best model on the test set, once per study and best trial (kept in the study); skipped
    while other workers still run trials of it (the last one to finish runs it)."""
    from cifar10_dist import runs
    from cifar10_dist.outputs import checkpoint_files

    key = f"final_test:trial-{best.number}"
    if key in study.user_attrs:
        done = study.user_attrs[key]
        echo(
            f"final test (trial {best.number}, evaluated once earlier): accuracy {done['accuracy']:.4f} "
            f"({done['num_samples']} test images)"
        )
        return done
    trial_state = require_optuna().trial.TrialState
    running = [
        t.number for t in study.get_trials(deepcopy=False) if t.state in (trial_state.RUNNING, trial_state.WAITING)
    ]
    if running:
        echo(
            f"final test not run: trials {', '.join(map(str, running))} are still running or queued in other "
            "workers (the last worker to finish runs it)"
        )
        return None
    run_dir = Path(best.user_attrs["run_dir"])
    best_file = checkpoint_files.best_model_file(run_dir)
    if best_file is None:
        raise UserError(f"trial {best.number} has no best-model file in {run_dir}: no final test")
    base = study_of(study)["base_config"]
    launch = {key: base[key] for key in ("backend", "nproc_per_node", "batch_size", "num_workers") if key in base}
    started = time.perf_counter()
    result = runs.evaluate(best_file, **launch)
    done = {
        "trial": best.number,
        "checkpoint": str(best_file),
        "accuracy": result.accuracy,
        "loss": result.loss,
        "num_samples": result.num_samples,
        "seconds": time.perf_counter() - started,
    }
    study.set_user_attr(key, done)
    used = [name for name in study.user_attrs if name.startswith("final_test:")]
    echo(
        f"final test (trial {best.number}'s best model, the test set's only use in this study"
        f"{'' if len(used) <= 1 else f'; now used by {len(used)} best trials'}): accuracy {result.accuracy:.4f}, "
        f"loss {result.loss:.4f} ({result.num_samples} test images)"
    )
    return done


def report_only(
    study_name: str, storage: str | None, output_path: str, final_test: bool, echo: Callable[[str], None] = print
) -> TuneResult:
    """The report of an existing study (while it runs, or after)."""
    optuna = require_optuna()
    url = storage_url(storage, Path(output_path) / study_name)
    if storage is None and not Path(url[len("sqlite:///") :]).is_file():
        raise UserError(
            f"no study database at {url[len('sqlite:///') :]}: give --storage (and --output_path) of the study"
        )
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(url))
    except KeyError as missing:
        raise UserError(f"study '{study_name}' is not in {without_password(url)}") from missing
    return report(study, echo, final_test=final_test)

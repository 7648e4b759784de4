"""Runs: ``resolve`` a config, ``train`` (once, or ``train_seeds``), ``evaluate`` a checkpoint, ``lr_find``. The layer
below ``api`` (which re-exports these) and ``tuning`` (whose trials are runs).

Each resolves the config exactly once, before torch is imported (a bad value fails in well under a second), then
checks it against the world once (``preflight``) and launches the per-process function of ``training.run`` in
every process (``spawn``).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Any

from cifar10_dist.config import INHERITED_BY_EVALUATE, Config, LrSweep, load_config, note
from cifar10_dist.errors import UserError, WorkerLost
from cifar10_dist.launch import start_method
from cifar10_dist.results import EvaluationResult, LrFindResult, RunResult, SeedsResult, TrialResult
from cifar10_dist.training.setup import config_fitting


def resolve(config: Config | str | Path | None = None, **overrides: Any) -> Config:
    """A validated Config: ``config`` itself (with ``overrides`` applied) or built from a YAML path, with the values
    a file or the defaults gave fitted to the run by the planner (``config_fitting``, one line each)."""
    if isinstance(config, Config):  # (fitted before the overrides: what it noted needs the file it came from)
        config = config_fitting.fitted_to_the_run(config)
        loaded = load_config(None, given=overrides, **{**config.to_dict(), **overrides}) if overrides else config
    else:
        loaded = load_config(config, **overrides)
    return config_fitting.fitted_to_the_run(loaded)


def train(config: Config | str | Path | None = None, **overrides: Any) -> RunResult:
    """Train once with the given config (a Config, or a YAML file) and overrides; return the final metrics and run
    folder (in every process of a torchrun/srun launch: rank 0's). Several seeds are ``train_seeds``'."""
    resolved = resolve(config, **overrides)
    if resolved.seeds > 1:
        raise UserError(
            f"train runs once, and seeds={resolved.seeds} asks for {resolved.seeds} runs: call "
            "train_seeds (a SeedsResult: the runs and their summary), as cifar10-dist run --seeds does"
        )
    if resolved.trial is not None:  # a trial's config.yaml run again: a run of its own, tested
        note(
            f"the config names trial {resolved.trial.number} of study {resolved.trial.study}: trained as a run of its "
            "own (tune runs trials), its test set evaluated"
        )
        resolved = dataclasses.replace(resolved, trial=None)
    start_method.start_early(resolved)
    from cifar10_dist import preflight
    from cifar10_dist.launch import spawn
    from cifar10_dist.training.run import training

    preflight.check_before_launch(resolved)
    return RunResult.from_dict(reported_by(spawn.run(training, resolved)))


def train_trial(config: Config) -> TrialResult:
    """A tuning trial's run (``config.trial`` set): as ``train``, its result chosen on val and never tested."""
    from cifar10_dist import preflight
    from cifar10_dist.launch import spawn
    from cifar10_dist.training.run import training

    start_method.start_early(config)
    preflight.check_before_launch(config)
    return TrialResult.from_dict(reported_by(spawn.run(training, config)))


def reported_by(reported: dict[str, Any]) -> dict[str, Any]:
    """What the workers reported (every process of a launch has rank 0's result); a launch whose workers all
    ended without one is a lost run."""
    if not reported:
        raise WorkerLost("the run's processes ended without reporting a result")
    return reported


def train_seeds(config: Config | str | Path | None = None, **overrides: Any) -> SeedsResult:
    """Train ``seeds`` times (seed, seed+1, ...) one after another; summarise the final metrics.

    The summary (mean, sample std, min, max of each final metric) is also written to
    output_path/seeds_<run_name or time>.json (by rank 0 of a torchrun/srun launch).
    """
    resolved = resolve(config, **overrides)
    from cifar10_dist import preflight
    from cifar10_dist.launch import spawn
    from cifar10_dist.outputs import files
    from cifar10_dist.outputs import summary as summary_file
    from cifar10_dist.training.run import training

    preflight.check_before_launch(resolved)
    runs = []
    for seed in range(resolved.seed, resolved.seed + resolved.seeds):
        run_name = f"{resolved.run_name}-seed{seed}" if resolved.run_name else None
        reported = spawn.run(training, dataclasses.replace(resolved, seed=seed, seeds=1, run_name=run_name))
        runs.append(dataclasses.replace(RunResult.from_dict(reported_by(reported)), seed=seed))
    summary = summary_file.summarize_seeds([run.to_dict() for run in runs])
    name = resolved.run_name or datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(resolved.output_path) / f"seeds_{name}.json"
    result = SeedsResult(runs=runs, summary=summary, summary_file=str(path))
    if start_method.launch_rank(resolved.node_rank) == 0:
        files.write_json(path, {"config": resolved.replayable(), **result.to_dict()})
    return result


def evaluation_config(checkpoint: str | Path, config: Config | str | Path | None = None, **overrides: Any) -> Config:
    """The config a checkpoint is evaluated with: its recorded model and data keys, unless given (another model
    given does not take the recorded model's model_kwargs: they belong to that model)."""
    from cifar10_dist import checkpoint_layout
    from cifar10_dist.outputs import checkpoint_files

    loaded = checkpoint_files.load_checkpoint(checkpoint)
    recorded, keys = checkpoint_layout.recorded_config(loaded), checkpoint_layout.recorded_keys(loaded)
    inherited = {key: getattr(recorded, key) for key in INHERITED_BY_EVALUATE if key in keys}
    if "model" in overrides and overrides["model"] != inherited.get("model"):
        inherited.pop("model_kwargs", None)
    return resolve(config, **{**inherited, **overrides})


def evaluate(
    checkpoint: str | Path,
    config: Config | str | Path | None = None,
    raw_weights: bool = False,
    output_dir: str | Path | None = None,
    **overrides: Any,
) -> EvaluationResult:
    """Test-set accuracy, loss, per-class accuracy, confusion matrix and most confident mistakes of a saved model (a
    training checkpoint or a best-model file), in one pass over the test set; with ``output_dir`` the confusion
    matrix and the mistakes are also written there. The model and data keys recorded in the checkpoint are used
    unless given; a training checkpoint of a run with ema_decay is evaluated with its EMA weights unless
    ``raw_weights``."""
    from cifar10_dist import preflight
    from cifar10_dist.launch import spawn
    from cifar10_dist.outputs import files
    from cifar10_dist.training.trained_models import checkpoint_evaluation

    resolved = evaluation_config(checkpoint, config, **overrides)
    start_method.start_early(resolved)
    preflight.check_before_launch(resolved)
    if output_dir is not None:
        files.make_folder(Path(output_dir))
    worker = checkpoint_evaluation.EvaluationWorker(
        str(checkpoint), raw_weights, None if output_dir is None else str(output_dir)
    )
    return EvaluationResult.from_dict(reported_by(spawn.run(worker, resolved)))


def lr_find(config: Config, settings: LrSweep, folder: str | Path | None = None) -> LrFindResult:
    """Sweep the learning rate with the config's model, data and optimizer in every process of its launch
    (``training.before_training.lr_finding``); lr_find.json and lr_find.png go to ``folder`` (default: a new
    output_path/lr_find-<time>). Every process of a torchrun/srun launch returns rank 0's."""
    from cifar10_dist import preflight
    from cifar10_dist.launch import spawn
    from cifar10_dist.outputs import files
    from cifar10_dist.training.before_training import lr_finding

    settings.check()
    start_method.start_early(config)
    preflight.check_before_launch(config)
    if folder is None:
        folder = Path(config.output_path) / f"lr_find-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    made = not Path(folder).exists()
    files.make_folder(Path(folder))
    try:
        reported = spawn.run(lr_finding.LrFindWorker(settings, str(folder)), config)
    except BaseException:
        if made and Path(folder).is_dir() and not any(Path(folder).iterdir()):
            Path(folder).rmdir()  # a sweep that found nothing leaves no empty folder behind
        raise
    return LrFindResult(**reported_by(reported))

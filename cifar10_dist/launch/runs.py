"""Runs: ``resolve`` a config, ``train`` (once, or ``train_seeds``), ``evaluate`` a checkpoint, ``lr_find``. The layer below
``api`` (which re-exports these) and ``tuning`` (whose trials are runs).

Each resolves the config exactly once, before torch is imported (a bad value fails in well under a second), then
checks it against the world once (``preflight``) and launches the per-process function of ``training.run`` in
every process (``spawn``).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Any

from cifar10_dist.config import INHERITED_BY_EVALUATE, Config, LrSweep, load_config
from cifar10_dist.launch import start_method
from cifar10_dist.results import EvaluationResult, LrFindResult, RunResult, SeedsResult


def resolve(config: Config | str | Path | None = None, **overrides: Any) -> Config:
    """A validated Config: ``config`` itself (with ``overrides`` applied) or built from a YAML path."""
    if isinstance(config, Config):
        return load_config(None, given=overrides, **{**config.to_dict(), **overrides}) if overrides else config
    return load_config(config, **overrides)


def train(config: Config | str | Path | None = None, **overrides: Any) -> RunResult | SeedsResult | None:
    """Train with the given config (a Config, or a YAML file) and overrides; return the final metrics and run folder.

    With ``seeds`` > 1 the runs of ``train_seeds`` and their summary. None in the processes of a torchrun/srun
    launch other than rank 0 (rank 0 reports).
    """
    resolved = resolve(config, **overrides)
    start_method.start_early(resolved)
    from cifar10_dist.launch import preflight, spawn
    from cifar10_dist.training import run as worker

    preflight.check_before_launch(resolved)
    if resolved.seeds > 1:
        return _train_seeds(resolved)
    reported = spawn.run(worker.training, resolved)
    return RunResult.from_dict(reported) if reported else None


def train_seeds(config: Config | str | Path | None = None, **overrides: Any) -> SeedsResult | None:
    """Train ``seeds`` times (seed, seed+1, ...) one after another; summarise the final metrics.

    The summary (mean, sample std, min, max of each final metric) is also written to
    output_path/seeds_<run_name or time>.json.
    """
    resolved = resolve(config, **overrides)
    from cifar10_dist.launch import preflight

    preflight.check_before_launch(resolved)
    return _train_seeds(resolved)


def _train_seeds(config: Config) -> SeedsResult | None:
    from cifar10_dist.launch import spawn
    from cifar10_dist.outputs import files
    from cifar10_dist.outputs import summary as summary_file
    from cifar10_dist.training import run as worker

    runs = []
    for seed in range(config.seed, config.seed + config.seeds):
        run_name = f"{config.run_name}-seed{seed}" if config.run_name else None
        reported = spawn.run(worker.training, dataclasses.replace(config, seed=seed, seeds=1, run_name=run_name))
        if not reported:
            return None  # a non-zero rank under torchrun: rank 0 reports
        runs.append(dataclasses.replace(RunResult.from_dict(reported), seed=seed))
    summary = summary_file.summarize_seeds([run.to_dict() for run in runs])
    name = config.run_name or datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(config.output_path) / f"seeds_{name}.json"
    result = SeedsResult(runs=runs, summary=summary, summary_file=str(path))
    files.write_json(path, {"config": config.to_dict(), **result.to_dict()})
    return result


def evaluation_config(checkpoint: str | Path, config: Config | str | Path | None = None, **overrides: Any) -> Config:
    """The config a checkpoint is evaluated with: its recorded model and data keys, unless given (another model
    given does not take the recorded model's model_kwargs: they belong to that model)."""
    from cifar10_dist import checkpoint_layout
    from cifar10_dist.outputs import checkpoint_files

    recorded = checkpoint_layout.recorded_config(checkpoint_files.load_checkpoint(checkpoint))
    inherited = {key: recorded[key] for key in INHERITED_BY_EVALUATE if key in recorded}
    if overrides.get("model", recorded.get("model")) != recorded.get("model"):
        inherited.pop("model_kwargs", None)
    if isinstance(config, Config):
        return resolve(config, **{**inherited, **overrides})
    return load_config(config, **{**inherited, **overrides})


def evaluate(checkpoint: str | Path, config: Config | str | Path | None = None, raw_weights: bool = False,
             output_dir: str | Path | None = None, **overrides: Any) -> EvaluationResult | None:
    """Test-set accuracy, loss, per-class accuracy, confusion matrix and most confident mistakes of a saved model (a
    training checkpoint or a best-model file), in one pass over the test set; with ``output_dir`` the confusion
    matrix and the mistakes are also written there. The model and data keys recorded in the checkpoint are used
    unless given; a training checkpoint of a run with ema_decay is evaluated with its EMA weights unless
    ``raw_weights``."""
    from cifar10_dist.launch import preflight, spawn
    from cifar10_dist.outputs import files
    from cifar10_dist.training.shipping import checkpoint_evaluation

    resolved = evaluation_config(checkpoint, config, **overrides)
    start_method.start_early(resolved)
    preflight.check_before_launch(resolved)
    if output_dir is not None:
        files.make_folder(Path(output_dir))
    worker = checkpoint_evaluation.EvaluationWorker(str(checkpoint), raw_weights, None if output_dir is None else str(output_dir))
    reported = spawn.run(worker, resolved)
    return EvaluationResult.from_dict(reported) if reported else None


def lr_find(config: Config, settings: LrSweep, folder: str | Path | None = None) -> LrFindResult | None:
    """Sweep the learning rate with the config's model, data and optimizer in every process of its launch
    (``training.before_training.lr_finding``); lr_find.json and lr_find.png go to ``folder`` (default: a new
    output_path/lr_find-<time>). None in the processes of a torchrun/srun launch other than rank 0."""
    from cifar10_dist.launch import preflight, spawn
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
    return LrFindResult(**reported) if reported else None

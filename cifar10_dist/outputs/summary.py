"""summary.json of a run (``summarize``: the best and final numbers, times, where and how it ran, its files), the
final scalars it adds to the trackers and TensorBoard, and the mean and spread over several seeds' runs."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from cifar10_dist.outputs.provenance import DataRecord, PackageBuild, Provenance
from cifar10_dist.outputs.reading import epochs_and_evaluations, read_events, selection_split
from cifar10_dist.results import BestResult, RunResult, RunSummary, TrialResult


def summarize(
    run_dir: Path,
    result: RunResult | TrialResult,
    record: Provenance | None,
    seconds: float,
    best_metric: str = "accuracy",
) -> RunSummary:
    """summary.json's record: best and final accuracy, times, world size (and its changes), backend, devices,
    precision, hardware, versions (from the run's ``record``, where given), checkpoint paths."""
    record = record or Provenance(PackageBuild(), {}, None, 0, {}, "", {}, DataRecord("", None))
    events = read_events(run_dir)
    epochs, evaluations = epochs_and_evaluations(events)
    selection, _, best = selection_split(evaluations, best_metric)
    resumes = [event for event in events if event["event"] == "resume"]
    warm_ups = [event for event in events if event["event"] == "warm_up"]
    return RunSummary(
        run_dir=str(run_dir),
        best=BestResult(
            selection, best["accuracy"], best["epoch"], best_metric, best.get(best_metric, best["accuracy"])
        )
        if best
        else None,
        final={split: getattr(result, split) for split in ("train", "val", "test") if getattr(result, split)},
        epochs=result.epochs,
        iterations=result.iterations,
        stopped_early=result.stopped_early,
        total_time=seconds,
        training_time=sum(e["epoch_time"] for e in epochs),
        warm_up_time=sum(warm["seconds"] for warm in warm_ups) if warm_ups else None,
        world_size=record.world_size or None,
        world_size_changes=[
            {key: event[key] for key in ("iteration", "checkpoint_world_size", "world_size", "same_images")}
            for event in resumes
        ],
        backend=record.backend,
        devices=record.devices,
        precision=record.precision or None,
        hardware=record.hardware,
        data_checks=record.dataset.checks or {},
        versions={**record.versions, "cifar10-dist": record.package.version},
        checkpoints=sorted(str(path) for path in run_dir.glob("training_checkpoint_*.pt")),
        best_models=sorted(str(path) for path in run_dir.glob("best_model_*.pt")),
    )


def final_scalars(summary: RunSummary) -> dict[str, float]:
    """The headline numbers of a finished run for TensorBoard's HParams tab: final/<split>_accuracy and _loss,
    best/<split>_accuracy."""
    scalars = {}
    for split, metrics in summary.final.items():
        scalars[f"final/{split}_accuracy"] = metrics.accuracy
        scalars[f"final/{split}_loss"] = metrics.loss
        if metrics.top5_accuracy is not None:
            scalars[f"final/{split}_top5_accuracy"] = metrics.top5_accuracy
    if summary.best is not None:
        scalars[f"best/{summary.best.split}_accuracy"] = summary.best.accuracy
    return scalars


def summarize_seeds(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, sample standard deviation, min and max of each final metric over repeated runs."""
    summary = {}
    for split in ("test", "val", "train"):
        for metric in ("accuracy", "loss"):
            values = [run[split][metric] for run in runs if run.get(split)]
            if len(values) == len(runs):
                summary[f"{split}_{metric}"] = {
                    "mean": statistics.fmean(values),
                    "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "min": min(values),
                    "max": max(values),
                }
    return summary

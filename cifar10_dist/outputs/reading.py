"""Reading a run folder back: metrics.jsonl -> curves, summary.json, comparison tables and plots,
and the confusion-matrix picture of ``evaluate``. Plots are drawn on matplotlib Figures directly (no pyplot),
so the caller's matplotlib backend and open figures are left alone."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from cifar10_dist.errors import UserError, first_line
from cifar10_dist.outputs import tracker_guard
from cifar10_dist.results import BestResult, RunResult, RunSummary

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


class DamagedFile(UserError):
    """A run-folder file that exists but cannot be read as what it should be (a full disk, a truncated copy)."""


def read_json(path: Path) -> Any:
    """A JSON file of a run folder; a damaged one is a one-line DamagedFile naming it and what is wrong."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DamagedFile(f"{path} is damaged: not valid JSON ({error.msg} at line {error.lineno}, column "
                          f"{error.colno}; {path.stat().st_size} bytes)") from error
    except (OSError, UnicodeDecodeError) as error:
        raise DamagedFile(f"{path} cannot be read: {error}") from error


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every line of metrics.jsonl, in order; a damaged line is a one-line DamagedFile naming the file and line."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"'{run_dir}' is not a run folder: it has no metrics.jsonl")
    events = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DamagedFile(f"{path} is damaged at line {number}: not valid JSON ({error.msg}): "
                              f"{line[:60]!r}") from error
        if not isinstance(record, dict) or "event" not in record:
            raise DamagedFile(f"{path} is damaged at line {number}: not a metrics record: {line[:60]!r}")
        events.append(record)
    return events


def read_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(epoch lines, evaluation lines) of metrics.jsonl, a later line superseding an earlier one for the same
    epoch (and split), as after a resume; other events (a resume) are left out."""
    return epochs_and_evaluations(read_events(run_dir))


def epochs_and_evaluations(events: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    epochs: dict[int, dict[str, Any]] = {}
    evaluations: dict[tuple[str, int], dict[str, Any]] = {}
    for record in events:
        if record["event"] == "epoch":
            record.setdefault("epoch_loss", record.get("train_loss"))  # its name in older run folders
            epochs[record["epoch"]] = record
        elif record["event"] == "evaluation":
            evaluations[(record["split"], record["epoch"])] = record
    return [epochs[key] for key in sorted(epochs)], [evaluations[key] for key in sorted(evaluations, key=lambda k: (k[1], k[0]))]


def read_summary(run_dir: Path) -> RunSummary | None:
    """summary.json of a finished run, or None for a run that has not finished; DamagedFile when it is damaged."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = read_json(path)
    if not isinstance(summary, dict):
        raise DamagedFile(f"{path} is damaged: a JSON {type(summary).__name__}, not the run's summary object")
    try:
        return RunSummary.from_dict(summary)
    except (TypeError, KeyError) as error:
        raise DamagedFile(f"{path} is damaged: not a run summary ({first_line(error)})") from error


def selection_split(evaluations: Sequence[Mapping[str, Any]], metric: str = "accuracy"
                    ) -> tuple[str, list[Mapping[str, Any]], Mapping | None]:
    """(split that chose the best model: val if the run held one out, else test, and its EMA's evaluations when
    the run kept one; its evaluations; the best one by ``metric``, accuracy in older records that lack it)."""
    split = "val" if any(e["split"] == "val" for e in evaluations) else "test"
    if any(e["split"] == f"{split}_ema" for e in evaluations):
        split = f"{split}_ema"
    chosen = [e for e in evaluations if e["split"] == split]
    return split, chosen, max(chosen, key=lambda e: e.get(metric, e["accuracy"]), default=None)


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


def summarize(run_dir: Path, result: RunResult, record: Mapping[str, Any], seconds: float,
              best_metric: str = "accuracy") -> RunSummary:
    """summary.json's record: best and final accuracy, times, world size (and its changes), backend, devices,
    precision, hardware, versions, checkpoint paths."""
    events = read_events(run_dir)
    epochs, evaluations = epochs_and_evaluations(events)
    selection, _, best = selection_split(evaluations, best_metric)
    resumes = [event for event in events if event["event"] == "resume"]
    return RunSummary(
        run_dir=str(run_dir),
        best=BestResult(selection, best["accuracy"], best["epoch"], best_metric, best.get(best_metric, best["accuracy"]))
        if best else None,
        final={split: getattr(result, split) for split in ("train", "val", "test") if getattr(result, split)},
        epochs=result.epochs, iterations=result.iterations, stopped_early=result.stopped_early,
        total_time=seconds, training_time=sum(e["epoch_time"] for e in epochs),
        world_size=record.get("world_size"),
        world_size_changes=[{key: event[key] for key in ("iteration", "checkpoint_world_size", "world_size",
                                                         "same_images")} for event in resumes],
        backend=record.get("backend"), devices=record.get("devices") or {}, precision=record.get("precision"),
        hardware=record.get("hardware") or {}, data_checks=record.get("dataset", {}).get("checks") or {},
        versions={**record.get("versions", {}), "cifar10-dist": record.get("package", {}).get("version")},
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


def time_to_accuracy(run_dir: Path, targets: Sequence[float]) -> dict[str, Any]:
    """When the selection split first reached each target accuracy at an epoch end: seconds of training
    (epoch times only, as airbench counts) and of training plus evaluations; None if never reached."""
    epochs, evaluations = read_metrics(run_dir)
    split, points, _ = selection_split(evaluations)
    train_seconds = {e["epoch"]: e["epoch_time"] for e in epochs}
    eval_seconds: dict[int, float] = {}
    for e in evaluations:
        eval_seconds[e["epoch"]] = eval_seconds.get(e["epoch"], 0.0) + e["duration"]
    reached: dict[float, dict[str, float] | None] = {}
    for target in targets:
        first = next((e for e in points if e["accuracy"] >= target), None)
        if first is None:
            reached[target] = None
            continue
        done = [epoch for epoch in train_seconds if epoch <= first["epoch"]]
        training = sum(train_seconds[epoch] for epoch in done)
        reached[target] = {"epoch": first["epoch"], "training_time": training,
                           "with_evaluation": training + sum(eval_seconds.get(epoch, 0.0) for epoch in done)}
    try:
        summary = read_summary(run_dir)
    except DamagedFile:  # compare() has said so already
        summary = None
    final = points[-1]["accuracy"] if points else None
    return {"run": run_dir.name, "split": split, "final_accuracy": final, "reached": reached,
            "total_time": summary.total_time if summary else None}


def format_time_to_accuracy(rows: Sequence[Mapping[str, Any]], targets: Sequence[float]) -> str:
    """Minutes of training to each target (with evaluations in brackets), final accuracy, whole-run minutes;
    with several runs, a last line of mean and sample std (time columns: over the runs that got there)."""
    def minutes(value: float | None) -> str:
        return "-" if value is None else f"{value / 60:.1f}"

    headers = [f"to {target:.0%}" for target in targets]
    width = max(len("mean +- std"), *(len(row["run"]) for row in rows))
    lines = [f"{'run':<{width}}  " + "  ".join(f"{h:>13}" for h in headers) + f"  {'final acc':>15}  {'run min':>7}"]
    for row in rows:
        cells = []
        for target in targets:
            hit = row["reached"][target]
            cells.append("never" if hit is None else f"{minutes(hit['training_time'])} ({minutes(hit['with_evaluation'])})")
        final = "-" if row["final_accuracy"] is None else f"{row['final_accuracy']:.4f} ({row['split']})"
        lines.append(f"{row['run']:<{width}}  " + "  ".join(f"{c:>13}" for c in cells)
                     + f"  {final:>15}  {minutes(row['total_time']):>7}")
    if len(rows) > 1:
        cells = []
        for target in targets:
            times = [row["reached"][target]["training_time"] / 60 for row in rows if row["reached"][target]]
            if not times:
                cells.append("never")
                continue
            cells.append(_mean_std(times, 1) + ("" if len(times) == len(rows) else f" [{len(times)}/{len(rows)}]"))
        finals = [row["final_accuracy"] for row in rows if row["final_accuracy"] is not None]
        lines.append(f"{'mean +- std':<{width}}  " + "  ".join(f"{c:>13}" for c in cells) + f"  {_mean_std(finals, 4):>15}")
        lines.append("times in minutes: training only (with evaluations); std is the sample standard deviation")
    return "\n".join(lines)


def _mean_std(values: Sequence[float], digits: int) -> str:
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f}+-{spread:.{digits}f}"


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


SPLIT_COLOURS = {"training": "tab:gray", "train_subset": "tab:blue", "val": "tab:orange", "test": "tab:red"}


def render_curves(run_dir: Path, path: Path) -> None:
    """Loss and accuracy against epoch: the epoch's mean training loss, and each evaluated split."""
    epochs, evaluations = read_metrics(run_dir)
    figure = _figure(10, 4)
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    loss_axes.plot([e["epoch"] for e in epochs], [e["epoch_loss"] for e in epochs], "o--",
                   color=SPLIT_COLOURS["training"], label="training batches (augmented)")
    splits = {e["split"] for e in evaluations}
    for split in sorted(splits):
        points = [e for e in evaluations if e["split"] == split]
        x = [e["epoch"] for e in points]
        label = "test (model chosen on val)" if split == "test" and "val" in splits else split
        style = {"color": SPLIT_COLOURS.get(split), "label": label}
        loss_axes.plot(x, [e["loss"] for e in points], "o-", **style)
        accuracy_axes.plot(x, [e["accuracy"] for e in points], "o-", **style)
    for axes, name in ((loss_axes, "loss"), (accuracy_axes, "accuracy")):
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.set_xlabel("epoch")
        axes.set_ylabel(name)
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(run_dir.name, fontsize=9)
    figure.subplots_adjust(left=0.07, right=0.985, bottom=0.13, top=0.9, wspace=0.22)  # tight_layout: 0.3 s a run
    figure.savefig(path, dpi=100, format="png")


@dataclass(frozen=True)
class Comparison:
    """What ``compare`` could read: a row per readable run, its folder, and one line per problem met."""

    rows: list[dict[str, Any]]
    folders: list[Path]
    problems: list[str]


def compare(run_dirs: Sequence[Path]) -> Comparison:
    """One row per run from its summary.json (or metrics.jsonl alone for a run that has not finished, or whose
    summary.json is damaged); a folder whose metrics.jsonl cannot be read is left out with one line saying why."""
    rows, folders, problems = [], [], []
    for run_dir in run_dirs:
        try:
            _, evaluations = read_metrics(run_dir)
        except UserError as error:
            problems.append(f"{error}: {run_dir.name} left out")
            continue
        try:
            summary = read_summary(run_dir)
        except DamagedFile as error:
            problems.append(f"{error}: {run_dir.name} reported from metrics.jsonl alone")
            summary = None
        rows.append(_row(run_dir, summary, evaluations))
        folders.append(run_dir)
    return Comparison(rows, folders, problems)


def _row(run_dir: Path, summary: RunSummary | None, evaluations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    last = {e["split"]: e for e in evaluations}
    selection, _, best = selection_split(evaluations)
    final_test, final_top5 = last.get("test", {}).get("accuracy"), last.get("test", {}).get("top5_accuracy")
    if summary is not None and "test" in summary.final:
        final_test, final_top5 = summary.final["test"].accuracy, summary.final["test"].top5_accuracy
    epochs_so_far = max((e["epoch"] for e in evaluations), default=0)
    return {
        "run": run_dir.name,
        "finished": summary is not None,
        "world_size": summary.world_size if summary else None,
        "epochs": summary.epochs if summary and summary.epochs is not None else epochs_so_far,
        "best_split": selection,
        "best_accuracy": best["accuracy"] if best else None,
        "final_test_accuracy": final_test,
        "final_test_top5": final_top5,
        "training_time": summary.training_time if summary else None,
        "mistakes": str(run_dir / "mistakes.png") if (run_dir / "mistakes.png").is_file() else None,
        "trackers": summary.trackers if summary else {},
    }


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    def cell(value: Any, digits: int = 4) -> str:
        if value is None:
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    width = max(len("run"), *(len(row["run"]) for row in rows))
    lines = [f"{'run':<{width}}  {'procs':>5}  {'epochs':>6}  {'best (split)':>15}  {'final test':>10}  {'top-5':>6}  "
             f"{'train s':>8}"]
    for row in rows:
        best = f"{cell(row['best_accuracy'])} ({row['best_split']})"
        name = row["run"] + ("" if row["finished"] else " *")
        lines.append(f"{name:<{width}}  {cell(row['world_size']):>5}  {cell(row['epochs']):>6}  {best:>15}  "
                     f"{cell(row['final_test_accuracy']):>10}  {cell(row.get('final_test_top5')):>6}  "
                     f"{cell(row['training_time'], 1):>8}")
    if not all(row["finished"] for row in rows):
        lines.append("* not finished (no readable summary.json): numbers so far")
    lines += [f"mistakes of {row['run']}: {row['mistakes']}" for row in rows if row.get("mistakes")]
    lines += [f"{row['run']}: {name} at {note.get('store')} did not get {tracker_guard.describe_missing(note)} "
              f"({note.get('error')}); metrics.jsonl has everything"
              for row in rows for name, note in sorted(row.get("trackers", {}).items())]
    return "\n".join(lines)


def render_comparison(run_dirs: Sequence[Path], path: Path) -> None:
    """Accuracy on the selection split and running train loss of several runs, overlaid."""
    figure = _figure(10, 4)
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    for run_dir in run_dirs:
        epochs, evaluations = read_metrics(run_dir)
        selection, points, _ = selection_split(evaluations)
        loss_axes.plot([e["epoch"] for e in epochs], [e["epoch_loss"] for e in epochs], "o-", label=run_dir.name)
        accuracy_axes.plot([e["epoch"] for e in points], [e["accuracy"] for e in points], "o-",
                           label=f"{run_dir.name} ({selection})")
    for axes, name in ((loss_axes, "training loss (epoch mean)"), (accuracy_axes, "accuracy")):
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.set_xlabel("epoch")
        axes.set_ylabel(name)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")


def render_confusion(matrix: Sequence[Sequence[int]], path: Path, title: str,
                     names: Sequence[str] | None = None) -> None:
    """The confusion matrix (rows: true class, columns: predicted), with counts in the cells up to 20 classes."""
    size = max(7.0, 0.16 * len(matrix))
    figure = _figure(size, size * 6 / 7)
    axes = figure.subplots()
    image = axes.imshow(matrix, cmap="Blues")
    figure.colorbar(image, ax=axes)
    names = list(names) if names and len(names) == len(matrix) else [str(i) for i in range(len(matrix))]
    font = 7 if len(matrix) <= 20 else 5
    axes.set_xticks(range(len(names)), names, rotation=45 if len(matrix) <= 20 else 90, ha="right", fontsize=font)
    axes.set_yticks(range(len(names)), names, fontsize=font)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    peak = max(max(row) for row in matrix) or 1
    for i, row in enumerate(matrix if len(matrix) <= 20 else []):
        for j, count in enumerate(row):
            axes.text(j, i, str(count), ha="center", va="center", fontsize=7,
                      color="white" if count > peak / 2 else "black")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")


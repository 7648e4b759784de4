"""Reading a run folder back: metrics.jsonl and summary.json, the best evaluation, the time each run took to an
accuracy, and the comparison table of ``report`` (its plots: ``plots``; summary.json is made by ``summary``)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from cifar10_dist.errors import UserError, first_line
from cifar10_dist.outputs import tracker_guard
from cifar10_dist.results import RunSummary


class DamagedFile(UserError):
    """A run-folder file that exists but cannot be read as what it should be (a full disk, a truncated copy)."""


def read_json(path: Path) -> Any:
    """A JSON file of a run folder; a damaged one is a one-line DamagedFile naming it and what is wrong."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DamagedFile(
            f"{path} is damaged: not valid JSON ({error.msg} at line {error.lineno}, column "
            f"{error.colno}; {path.stat().st_size} bytes)"
        ) from error
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
            raise DamagedFile(
                f"{path} is damaged at line {number}: not valid JSON ({error.msg}): {line[:60]!r}"
            ) from error
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
    by_epoch = sorted(evaluations, key=lambda key: (key[1], key[0]))
    return [epochs[key] for key in sorted(epochs)], [evaluations[key] for key in by_epoch]


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


def selection_split(
    evaluations: Sequence[Mapping[str, Any]], metric: str = "accuracy"
) -> tuple[str, list[Mapping[str, Any]], Mapping | None]:
    """(split that chose the best model: val if the run held one out, else test, and its EMA's evaluations when
    the run kept one; its evaluations; the best one by ``metric``, accuracy in older records that lack it)."""
    split = "val" if any(e["split"] == "val" for e in evaluations) else "test"
    if any(e["split"] == f"{split}_ema" for e in evaluations):
        split = f"{split}_ema"
    chosen = [e for e in evaluations if e["split"] == split]
    return split, chosen, max(chosen, key=lambda e: e.get(metric, e["accuracy"]), default=None)


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
        reached[target] = {
            "epoch": first["epoch"],
            "training_time": training,
            "with_evaluation": training + sum(eval_seconds.get(epoch, 0.0) for epoch in done),
        }
    try:
        summary = read_summary(run_dir)
    except DamagedFile:  # compare() has said so already
        summary = None
    final = points[-1]["accuracy"] if points else None
    return {
        "run": run_dir.name,
        "split": split,
        "final_accuracy": final,
        "reached": reached,
        "total_time": summary.total_time if summary else None,
    }


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
            cells.append(
                "never" if hit is None else f"{minutes(hit['training_time'])} ({minutes(hit['with_evaluation'])})"
            )
        final = "-" if row["final_accuracy"] is None else f"{row['final_accuracy']:.4f} ({row['split']})"
        lines.append(
            f"{row['run']:<{width}}  "
            + "  ".join(f"{c:>13}" for c in cells)
            + f"  {final:>15}  {minutes(row['total_time']):>7}"
        )
    splits = sorted({row["split"] for row in rows})
    if len(rows) > 1:
        for split in splits:  # runs measured on another split (val, test) are never averaged together
            group = [row for row in rows if row["split"] == split]
            label = "mean +- std" if len(splits) == 1 else f"mean ({split})"
            lines.append(f"{label:<{width}}  " + _mean_row(group, targets))
        lines.append(
            "times in minutes: training only (with evaluations); std is the sample standard deviation"
            + (
                ""
                if len(splits) == 1
                else f"; the runs chose on different splits ({', '.join(splits)}): each split's runs are averaged apart"
            )
        )
    return "\n".join(lines)


def _mean_row(rows: Sequence[Mapping[str, Any]], targets: Sequence[float]) -> str:
    """The mean +- std cells of runs measured on one split: time to each target, then the final accuracy."""
    cells = []
    for target in targets:
        times = [row["reached"][target]["training_time"] / 60 for row in rows if row["reached"][target]]
        if not times:
            cells.append("never")
            continue
        cells.append(mean_std(times, 1) + ("" if len(times) == len(rows) else f" [{len(times)}/{len(rows)}]"))
    finals = [row["final_accuracy"] for row in rows if row["final_accuracy"] is not None]
    return "  ".join(f"{c:>13}" for c in cells) + f"  {mean_std(finals, 4):>15}"


def mean_std(values: Sequence[float], digits: int) -> str:
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f}+-{spread:.{digits}f}"


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
    lines = [
        f"{'run':<{width}}  {'procs':>5}  {'epochs':>6}  {'best (split)':>15}  {'final test':>10}  {'top-5':>6}  "
        f"{'train s':>8}"
    ]
    for row in rows:
        best = f"{cell(row['best_accuracy'])} ({row['best_split']})"
        name = row["run"] + ("" if row["finished"] else " *")
        lines.append(
            f"{name:<{width}}  {cell(row['world_size']):>5}  {cell(row['epochs']):>6}  {best:>15}  "
            f"{cell(row['final_test_accuracy']):>10}  {cell(row.get('final_test_top5')):>6}  "
            f"{cell(row['training_time'], 1):>8}"
        )
    if not all(row["finished"] for row in rows):
        lines.append("* not finished (no readable summary.json): numbers so far")
    lines += [f"mistakes of {row['run']}: {row['mistakes']}" for row in rows if row.get("mistakes")]
    lines += [
        f"{row['run']}: {name} at {note.get('store')} did not get {tracker_guard.describe_missing(note)} "
        f"({note.get('error')}); metrics.jsonl has everything"
        for row in rows
        for name, note in sorted(row.get("trackers", {}).items())
    ]
    return "\n".join(lines)

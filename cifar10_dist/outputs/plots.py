"""The pictures of runs: a run's curves (curves.png), several runs overlaid (``report``'s plot), a confusion matrix
(``evaluate``), a reliability diagram (calibration) and lr-find's sweep. Drawn on matplotlib Figures directly (no
pyplot), so the caller's matplotlib backend and open figures are left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from cifar10_dist.outputs.reading import read_metrics, selection_split


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


SPLIT_COLOURS = {"training": "tab:gray", "train_subset": "tab:blue", "val": "tab:orange", "test": "tab:red"}


def render_curves(run_dir: Path, path: Path) -> None:
    """Loss and accuracy against epoch: the epoch's mean training loss, and each evaluated split."""
    epochs, evaluations = read_metrics(run_dir)
    figure = _figure(10, 4)
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    loss_axes.plot(
        [e["epoch"] for e in epochs],
        [e["epoch_loss"] for e in epochs],
        "o--",
        color=SPLIT_COLOURS["training"],
        label="training batches (augmented)",
    )
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


def render_comparison(run_dirs: Sequence[Path], path: Path) -> None:
    """Accuracy on the selection split and running train loss of several runs, overlaid."""
    figure = _figure(10, 4)
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    for run_dir in run_dirs:
        epochs, evaluations = read_metrics(run_dir)
        selection, points, _ = selection_split(evaluations)
        loss_axes.plot([e["epoch"] for e in epochs], [e["epoch_loss"] for e in epochs], "o-", label=run_dir.name)
        accuracy_axes.plot(
            [e["epoch"] for e in points], [e["accuracy"] for e in points], "o-", label=f"{run_dir.name} ({selection})"
        )
    for axes, name in ((loss_axes, "training loss (epoch mean)"), (accuracy_axes, "accuracy")):
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.set_xlabel("epoch")
        axes.set_ylabel(name)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")


def render_confusion(
    matrix: Sequence[Sequence[int]], path: Path, title: str, names: Sequence[str] | None = None
) -> None:
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
            axes.text(
                j, i, str(count), ha="center", va="center", fontsize=7, color="white" if count > peak / 2 else "black"
            )
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")


def render_lr_sweep(
    learning_rates: Sequence[float], losses: Sequence[float], suggestion: float, rule: str, path: Path
) -> None:
    """lr-find's sweep: the smoothed training loss against learning_rate (log x), the suggestion marked."""
    figure = _figure(7, 4.2)
    axes = figure.subplots()
    axes.plot(learning_rates, losses, "-", color="tab:blue", label="training loss (smoothed, all ranks' mean)")
    axes.axvline(
        suggestion, color="tab:red", linestyle="--", label=f"suggested learning_rate {suggestion:.3g} ({rule})"
    )
    axes.set_xscale("log")
    axes.set_xlabel("learning_rate (the schedule's peak; other groups keep their ratios)")
    axes.set_ylabel("training loss")
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")


def render_reliability(rows: dict[str, list[float]], ece: float, path: Path, title: str) -> None:
    """The reliability diagram: accuracy against mean top-1 probability per bin (bars; the diagonal is perfect
    calibration), with how many images each bin holds."""
    bins = len(rows["images"])
    width = 1 / bins
    centres = [(index + 0.5) * width for index in range(bins)]
    figure = _figure(5.5, 5.5)
    axes, counts = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    filled = [count > 0 for count in rows["images"]]
    axes.bar(
        [c for c, f in zip(centres, filled) if f],
        [a for a, f in zip(rows["accuracy"], filled) if f],
        width=width * 0.95,
        color="tab:blue",
        label="accuracy in the bin",
    )
    axes.plot(
        [c for c, f in zip(rows["confidence"], filled) if f],
        [a for a, f in zip(rows["accuracy"], filled) if f],
        "o",
        color="tab:red",
        markersize=3,
        label="at the bin's mean top-1 probability",
    )
    axes.plot([0, 1], [0, 1], "--", color="gray", label="perfectly calibrated")
    axes.set_ylabel("accuracy")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.legend(fontsize=7, loc="upper left")
    axes.set_title(f"{title}: ECE {ece:.4f} ({bins} bins)", fontsize=9)
    counts.bar(centres, rows["images"], width=width * 0.95, color="tab:gray")
    counts.set_xlabel("top-1 probability")
    counts.set_ylabel("images")
    figure.tight_layout()
    figure.savefig(path, dpi=100, format="png")

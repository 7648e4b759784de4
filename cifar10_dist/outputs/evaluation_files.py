"""What ``evaluate`` leaves in its folder for a saved model: the confusion matrix (``confusion_<checkpoint>.json`` and
``.png``) and the most confident mistakes (``mistakes_<checkpoint>.json`` and ``.png``), both from the one pass
over the test set that computed the metrics (rank 0 writes them)."""

from __future__ import annotations

from pathlib import Path

import torch

from cifar10_dist.outputs import files, mistake_grid, plots
from cifar10_dist.results import EvaluationResult


def confusion_stem(checkpoint: Path) -> str:
    return f"confusion_{checkpoint.stem}"


def mistakes_stem(checkpoint: Path) -> str:
    return f"mistakes_{checkpoint.stem}"


def write(folder: Path, checkpoint: Path, result: EvaluationResult, test_images: torch.Tensor) -> None:
    """The confusion matrix and the mistakes of one evaluation of ``checkpoint`` (``test_images``: the images the
    mistakes' indices point into)."""
    stem = confusion_stem(checkpoint)
    files.write_json(folder / f"{stem}.json", {
        "checkpoint": str(checkpoint), "classes": result.classes, "rows": "true class", "columns": "predicted",
        "confusion_matrix": result.confusion_matrix, "per_class_accuracy": result.per_class_accuracy})
    files.write_file(folder / f"{stem}.png", lambda path: plots.render_confusion(
        result.confusion_matrix, path, checkpoint.name, result.classes))
    mistake_grid.write(folder, mistakes_stem(checkpoint), test_images, result.mistakes, checkpoint.name,
                       {"checkpoint": str(checkpoint), "test_images": result.num_samples})

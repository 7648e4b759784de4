"""What ``evaluate`` leaves in its folder for a saved model: the confusion matrix (``confusion_<checkpoint>.json`` and
``.png``), the most confident mistakes (``mistakes_<checkpoint>.json`` and ``.png``) and the reliability diagram
(``calibration_<checkpoint>.json`` and ``.png``), all from the one pass over the test set that computed the
metrics (rank 0 writes them); a run's end writes its final test's diagram as calibration.json and .png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from cifar10_dist.outputs import files, mistake_grid, plots
from cifar10_dist.results import EvaluationResult


def confusion_stem(checkpoint: Path) -> str:
    return f"confusion_{checkpoint.stem}"


def mistakes_stem(checkpoint: Path) -> str:
    return f"mistakes_{checkpoint.stem}"


def calibration_stem(checkpoint: Path) -> str:
    return f"calibration_{checkpoint.stem}"


def write_calibration(
    folder: Path, stem: str, ece: float, reliability: dict[str, list[float]], title: str, draw: bool = True
) -> Any:
    """The reliability diagram's bins as STEM.json and, with ``draw``, the diagram as STEM.png; returns the
    picture's pixels (H x W x 3), or None undrawn."""
    files.write_json(folder / f"{stem}.json", {"ece": ece, "bins": len(reliability["images"]), **reliability})
    if not draw:
        return None
    files.write_file(folder / f"{stem}.png", lambda path: plots.render_reliability(reliability, ece, path, title))
    from PIL import Image

    with Image.open(folder / f"{stem}.png") as picture:
        return np.asarray(picture.convert("RGB"))


def write(folder: Path, checkpoint: Path, result: EvaluationResult, test_images: torch.Tensor) -> None:
    """The confusion matrix, the mistakes and the reliability diagram of one evaluation of ``checkpoint``
    (``test_images``: the images the mistakes' indices point into)."""
    stem = confusion_stem(checkpoint)
    files.write_json(
        folder / f"{stem}.json",
        {
            "checkpoint": str(checkpoint),
            "classes": result.classes,
            "rows": "true class",
            "columns": "predicted",
            "confusion_matrix": result.confusion_matrix,
            "per_class_accuracy": result.per_class_accuracy,
        },
    )
    files.write_file(
        folder / f"{stem}.png",
        lambda path: plots.render_confusion(result.confusion_matrix, path, checkpoint.name, result.classes),
    )
    mistake_grid.write(
        folder,
        mistakes_stem(checkpoint),
        test_images,
        result.mistakes,
        checkpoint.name,
        {"checkpoint": str(checkpoint), "test_images": result.num_samples},
    )
    if result.reliability:
        write_calibration(folder, calibration_stem(checkpoint), result.ece or 0.0, result.reliability, checkpoint.name)

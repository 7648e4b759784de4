"""The mistakes as a picture: the test images a model got wrong with the most confidence, each with its true and
predicted class and the probability it gave, drawn in a grid (PNG) and listed in a JSON file beside it. What
people look at first, before any number of the confusion matrix. Chosen here from probabilities
(``most_confident``), or gathered during a run's own test evaluation (``training.evaluators.MistakeCollector``);
``evaluate`` computes them for a checkpoint (``serve.mistakes``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from cifar10_dist.outputs import files

SHOWN = 16  # tiles in the picture: the most confident mistakes


@dataclass(frozen=True)
class Mistake:
    """A test image (its index in the test set) the model got wrong, and how sure it was."""

    index: int
    true: str
    predicted: str
    confidence: float


def most_confident(probabilities: torch.Tensor, labels: torch.Tensor, classes: Sequence[str],
                   count: int = SHOWN) -> list[Mistake]:
    """The ``count`` wrong predictions with the highest probability on the predicted class, most confident first."""
    confidence, predicted = probabilities.max(dim=1)
    wrong = (predicted != labels).nonzero().flatten()
    order = wrong[confidence[wrong].argsort(descending=True)][:count]
    return [Mistake(int(i), classes[int(labels[i])], classes[int(predicted[i])], round(float(confidence[i]), 4))
            for i in order]


def write(folder: Path, stem: str, images: torch.Tensor, found: Sequence[Mistake], title: str,
          record: dict[str, Any]) -> Path:
    """``stem``.json (``record`` and the mistakes) and ``stem``.png (the grid) in ``folder``; returns the PNG."""
    files.write_json(folder / f"{stem}.json", {**record, "mistakes": [asdict(mistake) for mistake in found]})
    picture = folder / f"{stem}.png"
    files.write_file(picture, lambda path: figure(images, found, title).savefig(path, dpi=100, format="png"))
    return picture


def figure(images: torch.Tensor, found: Sequence[Mistake], title: str) -> Any:
    """A matplotlib Figure: the mistakes' images (uint8, N x 3 x H x W), each titled with the prediction, its
    probability and the true class."""
    from matplotlib.figure import Figure

    columns = min(8, max(1, len(found)))
    rows = max(1, math.ceil(len(found) / columns))
    drawing = Figure(figsize=(1.6 * columns, 1.9 * rows + 0.4))
    for position, mistake in enumerate(found):
        axes = drawing.add_subplot(rows, columns, position + 1)
        axes.imshow(images[mistake.index].cpu().permute(1, 2, 0).numpy())
        axes.set_title(f"{mistake.predicted} {mistake.confidence:.2f}\n(true: {mistake.true})", fontsize=7)
        axes.axis("off")
    drawing.suptitle(f"most confident mistakes: {title}" if found else f"no mistakes: {title}", fontsize=8)
    return drawing


def as_pixels(drawing: Any) -> Any:
    """The figure rendered at 100 dpi as an H x W x 3 uint8 array (for TensorBoard's image tab)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(drawing)
    drawing.set_dpi(100)
    canvas.draw()
    import numpy as np

    return np.asarray(canvas.buffer_rgba())[..., :3].copy()

"""The mistakes as a picture: the test images a model got wrong with the most confidence, each with its true and
predicted class and the probability it gave, drawn in a grid (PNG) and listed in a JSON file beside it. What
people look at first, before any number of the confusion matrix. Gathered in passing by the test evaluation of a
run or of ``evaluate`` (``training.loop.evaluators.MistakeCollector``)."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import torch

from cifar10_dist.outputs import files
from cifar10_dist.results import Mistake

SHOWN = 16  # tiles in the picture: the most confident mistakes


def write(
    folder: Path,
    stem: str,
    images: torch.Tensor,
    found: Sequence[Mistake],
    title: str,
    record: dict[str, Any],
    draw: bool = True,
) -> Any:
    """``stem``.json (``record`` and the mistakes) and, with ``draw``, ``stem``.png (the grid) in ``folder``;
    returns the picture's pixels (H x W x 3 uint8, e.g. for TensorBoard: drawn once), or None undrawn."""
    from PIL import Image

    files.write_json(folder / f"{stem}.json", {**record, "mistakes": [asdict(mistake) for mistake in found]})
    if not draw:
        return None
    pixels = render(images, found, title)
    files.write_file(folder / f"{stem}.png", lambda path: Image.fromarray(pixels).save(path, format="PNG"))
    return pixels


def render(images: torch.Tensor, found: Sequence[Mistake], title: str) -> Any:
    """The mistakes' images (uint8, N x 3 x H x W) side by side, 8 to a row, each titled with the prediction, its
    probability and the true class, as H x W x 3 uint8 pixels at 100 dpi: one montage in one axes, the titles as
    text (a tenth of a second, not one axes per tile)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = min(8, max(1, len(found)))
    rows = max(1, math.ceil(len(found) / columns))
    width, height = 1.6 * columns, 1.9 * rows + 0.4  # inches: a tile 1.6 x 1.9 (1.2 of image, 0.7 of title)
    drawing = Figure(figsize=(width, height), dpi=100)
    canvas = FigureCanvasAgg(drawing)
    size = int(images.shape[-1]) if found else 1
    montage = np.full((rows * size * 19 // 12, columns * size * 16 // 12, 3), 255, dtype=np.uint8)
    for position, mistake in enumerate(found):
        row, column = divmod(position, columns)
        y, x = row * size * 19 // 12 + size * 7 // 12, column * size * 16 // 12 + size * 2 // 12
        montage[y : y + size, x : x + size] = images[mistake.index].cpu().permute(1, 2, 0).numpy()
        drawing.text(
            (column + 0.5) / columns,
            1 - (0.4 + 1.9 * row + 0.65) / height,  # just above its image
            f"{mistake.predicted} {mistake.confidence:.2f}\n(true: {mistake.true})",
            fontsize=7,
            ha="center",
            va="bottom",
        )
    axes = drawing.add_axes((0, 0, 1, 1 - 0.4 / height))
    axes.imshow(montage, interpolation="nearest", aspect="auto")
    axes.axis("off")
    axes.set_zorder(-1)
    drawing.suptitle(f"most confident mistakes: {title}" if found else f"no mistakes: {title}", fontsize=8)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()

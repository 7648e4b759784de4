"""The mistakes as a picture: the test images a model got wrong with the most confidence, each with its true and
predicted class and the probability it gave, in a grid (``mistakes_<checkpoint>.png``) and listed in a JSON file
beside it. What people look at first, before any number of the confusion matrix."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from cifar10_dist import sources
from cifar10_dist.config import Config
from cifar10_dist.outputs import files
from cifar10_dist.serve import inference

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


def write(checkpoint: Path, config: Config, folder: Path, raw_weights: bool = False) -> list[Mistake]:
    """The checkpoint's model on the test images of the data ``config`` names (its recorded normalisation and the
    config's test-time augmentation): its most confident mistakes drawn and listed in ``folder``."""
    trained = inference.load_trained_model(checkpoint, raw_weights=raw_weights)
    test = sources.source_of(config.dataset).implementation().load(config).test
    found = most_confident(inference.probabilities(trained, test.images, tta=config.tta), test.labels,
                           trained.classes)
    stem = f"mistakes_{checkpoint.stem}"
    files.write_json(folder / f"{stem}.json", {"checkpoint": str(checkpoint), "test_images": len(test),
                                               "mistakes": [asdict(mistake) for mistake in found]})
    files.write_file(folder / f"{stem}.png", lambda path: draw(test.images, found, path, checkpoint.name))
    return found


def draw(images: torch.Tensor, found: Sequence[Mistake], path: Path, title: str) -> None:
    """A grid of the mistakes' images, each titled with the prediction, its probability and the true class."""
    from matplotlib.figure import Figure

    columns = min(8, max(1, len(found)))
    rows = max(1, math.ceil(len(found) / columns))
    figure = Figure(figsize=(1.6 * columns, 1.9 * rows + 0.4))
    for position, mistake in enumerate(found):
        axes = figure.add_subplot(rows, columns, position + 1)
        axes.imshow(images[mistake.index].permute(1, 2, 0).numpy())
        axes.set_title(f"{mistake.predicted} {mistake.confidence:.2f}\n(true: {mistake.true})", fontsize=7)
        axes.axis("off")
    figure.suptitle(f"most confident mistakes: {title}" if found else f"no mistakes: {title}", fontsize=8)
    figure.savefig(path, dpi=100, format="png")

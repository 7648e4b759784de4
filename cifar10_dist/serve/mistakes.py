"""The mistakes of a saved model as a picture: ``evaluate`` runs the checkpoint on the test images and draws and
lists its most confidently wrong ones (``mistakes_<checkpoint>.png`` and ``.json``; ``outputs.mistake_grid``)."""

from __future__ import annotations

from pathlib import Path

from cifar10_dist import sources
from cifar10_dist.config import Config
from cifar10_dist.outputs import mistake_grid
from cifar10_dist.outputs.mistake_grid import SHOWN, Mistake, most_confident
from cifar10_dist.serve import inference

__all__ = ["SHOWN", "Mistake", "most_confident", "write"]


def write(checkpoint: Path, config: Config, folder: Path, raw_weights: bool = False) -> list[Mistake]:
    """The checkpoint's model on the test images of the data ``config`` names (its recorded normalisation and the
    config's test-time augmentation): its most confident mistakes drawn and listed in ``folder``."""
    trained = inference.load_trained_model(checkpoint, raw_weights=raw_weights)
    test = sources.source_of(config.dataset).implementation().load(config).test
    found = most_confident(inference.probabilities(trained, test.images, tta=config.tta), test.labels,
                           trained.classes)
    mistake_grid.write(folder, f"mistakes_{checkpoint.stem}", test.images, found, checkpoint.name,
                       {"checkpoint": str(checkpoint), "test_images": len(test)})
    return found

"""The records every dataset source produces: images with their labels (``ImageSet``), what a model needs to
see them as it was trained (``DatasetInfo``: classes, normalisation, size), and a run's splits (``LoadedData``).
The defaults are CIFAR-10's: 32x32 images and its channel statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")  # CIFAR-10's
MEAN = (0.4914, 0.4822, 0.4465)


STD = (0.2023, 0.1994, 0.2010)


IMAGE_SIZE = 32


@dataclass(frozen=True)
class DatasetInfo:
    """What a model trained on a dataset needs to see images as it did: the class names, the channel mean and
    std (of 0..1 pixels) its inputs were normalised with, and the image size. Recorded in every checkpoint's
    provenance (``data``), so ``evaluate``, ``predict`` and ``export`` use it without the data."""

    classes: tuple[str, ...]
    mean: tuple[float, ...] = MEAN
    std: tuple[float, ...] = STD
    image_size: int = IMAGE_SIZE

    def to_dict(self) -> dict[str, Any]:
        return {"classes": list(self.classes), "mean": list(self.mean), "std": list(self.std),
                "image_size": self.image_size}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DatasetInfo:
        return cls(tuple(values["classes"]), tuple(values["mean"]), tuple(values["std"]), int(values["image_size"]))


@dataclass
class LoadedData:
    """A run's splits before holding out (val: a folder dataset's val/), what a model needs to see them (classes,
    normalisation, image size) and, for a folder, what its checks found."""

    train: ImageSet
    test: ImageSet
    info: DatasetInfo
    val: ImageSet | None = None
    checks: dict[str, Any] | None = None


@dataclass(frozen=True)
class ImageSet:
    """Images as uint8 (N, 3, 32, 32) and labels as int64 (N,)."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

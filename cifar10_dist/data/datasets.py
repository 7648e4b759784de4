"""The records every dataset source produces: images with their labels (``ImageSet``), what a model needs to
see them as it was trained (``DatasetInfo``: classes, normalisation, size), and a run's splits (``LoadedData``);
and what a source's module provides (``DataSource``, found by ``implementation``).
The defaults are CIFAR-10's: 32x32 images and its channel statistics."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol, cast

import numpy as np
import torch

from cifar10_dist import sources
from cifar10_dist.sources import CIFAR10_CLASSES, NUM_CLASSES  # noqa: F401 (NUM_CLASSES: for the data modules)

if TYPE_CHECKING:
    from cifar10_dist.config import Config
    from cifar10_dist.results import PreparedData

CLASSES = CIFAR10_CLASSES  # the names of the CIFAR-10 source's classes, as the data modules know them
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
    image_size: int = IMAGE_SIZE  # what the model takes
    crop_fraction: float = 1.0  # evaluation: the central crop_fraction of a stored image, resized to image_size
    stored: int | None = None  # the side images are stored (and read for predict) at; None: image_size

    @property
    def stored_size(self) -> int:
        return self.image_size if self.stored is None else self.stored

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": list(self.classes),
            "mean": list(self.mean),
            "std": list(self.std),
            "image_size": self.image_size,
            "crop_fraction": self.crop_fraction,
            "stored_size": self.stored_size,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DatasetInfo:
        """Read back from provenance (older records lack crop_fraction and stored_size: 1 and image_size)."""
        return cls(
            tuple(values["classes"]),
            tuple(values["mean"]),
            tuple(values["std"]),
            int(values["image_size"]),
            float(values.get("crop_fraction", 1.0)),
            values.get("stored_size"),
        )


@dataclass
class LoadedData:
    """A run's splits before holding out (val: a folder dataset's val/), what a model needs to see them (classes,
    normalisation, image size) and, for a folder, what its checks found."""

    train: ImageSet
    test: ImageSet
    info: DatasetInfo
    val: ImageSet | None = None
    checks: dict[str, Any] | None = None


class MappedImages:
    """uint8 images (N, 3, S, S) read on demand from a memory-mapped cache file: the rows ``rows`` of the array in
    ``path`` (an .npy file), each mirrored where ``flipped`` says. Indexing with indices or a slice reads just
    those images into a tensor; the file's pages belong to the operating system, shared by every process of a
    node, so a process's private memory does not grow with the dataset. Pickled (to DataLoader workers) as its
    path and rows, never as pixels."""

    def __init__(self, path: Path, rows: np.ndarray, flipped: np.ndarray | None = None) -> None:
        self.path, self.rows, self.flipped = Path(path), np.asarray(rows, dtype=np.int64), flipped
        self._pixels: np.ndarray | None = None

    @property
    def pixels(self) -> np.ndarray:
        if self._pixels is None:
            self._pixels = np.load(self.path, mmap_mode="r")
        return self._pixels

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.rows), *self.pixels.shape[1:]))

    dtype, device = torch.uint8, torch.device("cpu")

    def __getitem__(self, index: Any) -> torch.Tensor:
        """The images at ``index`` (an int, a slice, indices), read now, in index order."""
        index = index.cpu().numpy() if isinstance(index, torch.Tensor) else index
        chosen = self.rows[index]
        scalar = np.ndim(chosen) == 0
        chosen = np.atleast_1d(chosen)
        order = np.argsort(chosen, kind="stable")  # the file read front to back, then put in index order
        images = np.empty((len(chosen), *self.pixels.shape[1:]), dtype=np.uint8)
        images[order] = self.pixels[chosen[order]]
        if self.flipped is not None:
            mirror = np.atleast_1d(self.flipped[index])
            images[mirror] = images[mirror][..., ::-1]
        tensor = torch.from_numpy(images)
        return tensor[0] if scalar else tensor

    def select(self, index: Any) -> MappedImages:
        """The images at ``index`` as another on-demand set (nothing read)."""
        index = index.cpu().numpy() if isinstance(index, torch.Tensor) else index
        return MappedImages(self.path, self.rows[index], None if self.flipped is None else self.flipped[index])

    def with_flips(self, flipped: np.ndarray) -> MappedImages:
        return MappedImages(self.path, self.rows, np.asarray(flipped, dtype=bool))

    def to(self, device: torch.device | str) -> torch.Tensor:
        """All the images, read into a tensor on ``device`` (data_on_device)."""
        return self[slice(None)].to(device)

    def cpu(self) -> torch.Tensor:
        return self[slice(None)]

    def chunks(self, size: int = 4096) -> Iterator[torch.Tensor]:
        """The images in order, ``size`` at a time (a checksum reads the set without holding it)."""
        for start in range(0, len(self), size):
            yield self[start : start + size]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "flipped": self.flipped}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["rows"], state["flipped"])  # type: ignore[misc]  # (unpickling)

    def __repr__(self) -> str:
        return f"MappedImages({len(self)} images of {self.path})"


@dataclass(frozen=True)
class ImageSet:
    """Images as uint8 (N, 3, S, S), in memory or read on demand from a cache (``MappedImages``), and labels as
    int64 (N,)."""

    images: torch.Tensor | MappedImages
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: torch.Tensor) -> ImageSet:
        """The images at ``index``: copied when in memory, still on demand when mapped."""
        images = self.images.select(index) if isinstance(self.images, MappedImages) else self.images[index]
        return ImageSet(images, self.labels[index])


class DataSource(Protocol):
    """What the module of a dataset source (``sources.Source.module``) provides, each taking the resolved config
    (a checkpoint's recorded one for ``sample_images``); mypy checks every registered module against it
    (``run_data``'s ``_SOURCE_MODULES``)."""

    def info(self, config: Config) -> DatasetInfo:
        """The classes (and the default normalisation and size), before any image is read."""

    def load(self, config: Config) -> LoadedData:
        """The run's images, downloaded or cached first where needed (one process per node while the others
        wait)."""

    def preflight(self, config: Config) -> None:
        """Checks against the filesystem before any process starts (one line for a bad layout)."""

    def sample_images(self, config: Config, limit: int) -> tuple[torch.Tensor, str] | None:
        """Up to ``limit`` uint8 images (N, 3, S, S) of the data ``config`` names and what they are (export's
        check), or None where they cannot be read."""

    def prepare(
        self, config: Config, synthetic: int | None = None, synthetic_test: int | None = None, seed: int = 0
    ) -> PreparedData:
        """The ``prepare-data`` command."""


def implementation(dataset: str) -> DataSource:
    """The module of the source ``dataset=NAME`` names (imported when first asked), or one line listing the
    sources there are."""
    return cast(DataSource, sources.source_of(dataset).implementation())

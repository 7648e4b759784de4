"""Synthetic CIFAR-shaped data, made in memory from a seed: learnable, so smoke runs and tests train for real."""

from __future__ import annotations

import torch

from cifar10_dist.config import Config
from cifar10_dist.data.datasets import CLASSES, NUM_CLASSES, DatasetInfo, ImageSet, LoadedData
from cifar10_dist.errors import UserError
from cifar10_dist.results import PreparedData


def make_synthetic(
    num_train: int, num_test: int, seed: int = 0, classes: int = NUM_CLASSES
) -> tuple[ImageSet, ImageSet]:
    """A learnable CIFAR-shaped dataset: each of ``classes`` has its own colour and stripe pattern, plus noise.

    The class signal survives crops and flips; the heavy noise keeps it from being trivial: simple_cnn
    reaches about 50% test accuracy after one epoch of 5,000 images and about 94% after three.
    """
    generator = torch.Generator().manual_seed(seed)
    colours = torch.rand(classes, 3, 1, 1, generator=generator) * 40 + 108
    frequencies = torch.arange(classes).float() % 5 + 1
    horizontal = torch.arange(classes) % 10 >= 5
    coordinate = torch.arange(32).float()
    stripes = torch.sin(coordinate[None, :] * frequencies[:, None] * torch.pi / 16)  # (classes, 32)
    patterns = torch.where(horizontal[:, None, None], stripes[:, :, None], stripes[:, None, :])  # (classes, 32, 32)
    templates = colours + 10 * patterns[:, None]

    def sample(count: int) -> ImageSet:
        labels = torch.randint(0, classes, (count,), generator=generator)
        noise = torch.randn(count, 3, 32, 32, generator=generator) * 100
        images = (templates[labels] + noise).clamp(0, 255).to(torch.uint8)
        return ImageSet(images, labels)

    return sample(num_train), sample(num_test)


# ---------------------------------------------------------------- the synthetic source (sources.py)

SEED = 20240601  # the synthetic dataset is the same whatever the training seed


def info(config: Config) -> DatasetInfo:
    """CIFAR-10's class names and channel statistics, 32x32."""
    return DatasetInfo(CLASSES)


def load(config: Config) -> LoadedData:
    """``synthetic_size`` training images and a fifth of that for testing, made in memory."""
    return LoadedData(*make_synthetic(config.synthetic_size, max(config.synthetic_size // 5, 1), SEED), info(config))


def preflight(config: Config) -> None:
    """Nothing on disk to check."""


def sample_images(config: Config, limit: int) -> tuple[torch.Tensor, str] | None:
    return torch.as_tensor(make_synthetic(1, limit, seed=0)[1].images), f"{limit} synthetic images"


def prepare(
    config: Config, synthetic: int | None = None, synthetic_test: int | None = None, seed: int = 0
) -> PreparedData:
    raise UserError(
        "dataset=synthetic is made in memory by every run: nothing to prepare (prepare-data "
        "--dataset=cifar10 --synthetic=N writes synthetic images in CIFAR-10's files)"
    )

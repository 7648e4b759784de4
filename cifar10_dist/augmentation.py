"""Batch transforms on the training device: pad, random crop and flip of a uint8 batch from a seeded generator,
and normalisation with the dataset's channel statistics."""

from __future__ import annotations

import functools

import torch

from cifar10_dist.data import MEAN, PAD, STD


def augment(
    images: torch.Tensor,
    generator: torch.Generator,
    padding: int = PAD,
    pad_mode: str = "zeros",
    flip: str = "random",
) -> torch.Tensor:
    """Pad (zeros or reflect), take a random 32x32 crop per image and flip (``random``: each image with
    probability 1/2, ``all`` or ``none``), on a uint8 batch.

    Random numbers come from ``generator`` (a CPU generator), so results do not depend on the device.
    """
    if padding == 0 and flip == "none":
        return images  # nothing to draw or move
    count, size = images.shape[0], images.shape[-1]
    mode = "constant" if pad_mode == "zeros" else "reflect"
    padded = torch.nn.functional.pad(images, (padding,) * 4, mode=mode) if padding else images
    offsets = torch.randint(0, 2 * padding + 1, (2, count), generator=generator).to(images.device)
    if flip == "random":
        flips = (torch.rand(count, generator=generator) < 0.5).to(images.device)
    else:
        flips = torch.full((count,), flip == "all", device=images.device)
    steps = torch.arange(size, device=images.device)
    rows = (offsets[0, :, None] + steps)[:, None, :, None]  # (N, 1, 32, 1)
    columns = offsets[1, :, None] + steps  # (N, 32)
    columns = torch.where(flips[:, None], columns.flip(1), columns)[:, None, None, :]  # (N, 1, 1, 32)
    batch_index = torch.arange(count, device=images.device)[:, None, None, None]
    channel_index = torch.arange(images.shape[1], device=images.device)[None, :, None, None]
    return padded[batch_index, channel_index, rows, columns]


def normalize(images: torch.Tensor, mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD) -> torch.Tensor:
    """uint8 (N, 3, H, W) to float32 normalised with a channel mean and std of 0..1 pixels (CIFAR-10's unless
    given: a folder dataset's come from its training images, ``data.DatasetInfo``)."""
    scaled_mean, scaled_std = _normalization(images.device, tuple(mean), tuple(std))
    return (images.float() - scaled_mean) / scaled_std


@functools.lru_cache(maxsize=8)
def _normalization(device: torch.device, mean: tuple[float, ...], std: tuple[float, ...]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (1, 3, 1, 1) mean and std in pixel units on ``device``, made once per device (not at every batch)."""
    return (torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255,
            torch.tensor(std, device=device).view(1, 3, 1, 1) * 255)

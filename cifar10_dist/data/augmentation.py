"""Batch transforms on the training device: pad, random crop and flip of a uint8 batch from a seeded generator
(or random-resized crops at any resolution), the evaluation view (a central crop resized),
normalisation with the dataset's channel statistics, and torchvision.transforms.v2's policies (TrivialAugment,
RandAugment, AutoAugment per image), RandomErasing and MixUp/CutMix, which draw from torch's default generator
(reseeded per iteration by ``batches``: resume stays exact)."""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from cifar10_dist.data.datasets import MEAN, STD
from cifar10_dist.data.device_copies import upload

PAD = 4  # pixels of padding before the random crop, CIFAR's default


def augment(
    images: torch.Tensor, generator: torch.Generator, padding: int = PAD, pad_mode: str = "zeros", flip: str = "random"
) -> torch.Tensor:
    """Pad (zeros or reflect), take a random 32x32 crop per image and flip (``random``: each image with
    probability 1/2, ``all`` or ``none``), on a uint8 batch.

    Random numbers come from ``generator`` (a CPU generator), so results do not depend on the device.
    """
    if padding == 0 and flip == "none":
        return images  # nothing to draw or move
    offsets, flips = crop_draws(len(images), generator, padding, flip)
    return cut(images, upload(offsets, images.device), upload(flips, images.device), padding, pad_mode)


def crop_draws(count: int, generator: torch.Generator, padding: int, flip: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``augment``'s draws for ``count`` images, on the CPU: crop offsets (2, count) in 0..2 x padding (drawn even
    without padding, so the generator moves the same way), then which images are mirrored (one uniform number
    per image for ``random``, none drawn for ``all`` or ``none``)."""
    offsets = torch.randint(0, 2 * padding + 1, (2, count), generator=generator)
    flips = torch.rand(count, generator=generator) < 0.5 if flip == "random" else torch.full((count,), flip == "all")
    return offsets, flips


def cut(
    images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, padding: int, pad_mode: str = "zeros"
) -> torch.Tensor:
    """Each image padded (zeros or reflect), cut at its ``offsets`` (2, N) and mirrored where ``flips``, in one
    gather (the draws already on the images' device)."""
    if padding == 0:  # a flip alone, without the gather of a crop
        return torch.where(flips[:, None, None, None], images.flip(-1), images)
    count, size = images.shape[0], images.shape[-1]
    mode = "constant" if pad_mode == "zeros" else "reflect"
    padded = torch.nn.functional.pad(images, (padding,) * 4, mode=mode)
    steps = torch.arange(size, device=images.device)
    rows = (offsets[0, :, None] + steps)[:, None, :, None]  # (N, 1, 32, 1)
    columns = offsets[1, :, None] + steps  # (N, 32)
    columns = torch.where(flips[:, None], columns.flip(1), columns)[:, None, None, :]  # (N, 1, 1, 32)
    batch_index = torch.arange(count, device=images.device)[:, None, None, None]
    channel_index = torch.arange(images.shape[1], device=images.device)[None, :, None, None]
    return padded[batch_index, channel_index, rows, columns]


RATIO = (3 / 4, 4 / 3)  # random-resized crops' aspect ratios, as torchvision's RandomResizedCrop
ATTEMPTS = 10  # draws per image before falling back to the whole image, as torchvision's


def random_resized_boxes(count: int, size: int, scale_min: float, generator: torch.Generator) -> torch.Tensor:
    """torchvision's RandomResizedCrop parameters for ``count`` square images of side ``size``, drawn at once:
    (top, left, height, width) per image, int64 on the CPU. The area is a uniform fraction in [scale_min, 1] of the
    image, the aspect ratio log-uniform in RATIO; the first of ATTEMPTS draws that fits is taken, else the whole
    image. A fixed number of draws per image, so the generator's state after a batch does not depend on them."""
    area = size * size * (scale_min + (1 - scale_min) * torch.rand(count, ATTEMPTS, generator=generator))
    low, high = math.log(RATIO[0]), math.log(RATIO[1])
    aspect = torch.exp(low + (high - low) * torch.rand(count, ATTEMPTS, generator=generator))
    width, height = (area * aspect).sqrt().round().long(), (area / aspect).sqrt().round().long()
    fits = (width > 0) & (height > 0) & (width <= size) & (height <= size)
    first = fits.long().argmax(dim=1, keepdim=True)
    found = fits.any(dim=1)
    width = torch.where(found, width.gather(1, first)[:, 0], size)
    height = torch.where(found, height.gather(1, first)[:, 0], size)
    top = (torch.rand(count, generator=generator) * (size - height + 1)).long()
    left = (torch.rand(count, generator=generator) * (size - width + 1)).long()
    return torch.stack([top, left, height, width], dim=1)


def flip_draws(count: int, generator: torch.Generator, flip: str = "random") -> torch.Tensor:
    """Which images ``augment`` without padding mirrors (bool per image, on the CPU), from the same draws: none
    for ``none``; else crop offsets (drawn, unused) then, for ``random``, one uniform number per image."""
    if flip == "none":
        return torch.zeros(count, dtype=torch.bool)
    return crop_draws(count, generator, 0, flip)[1]


def resized_crops(
    images: torch.Tensor, boxes: torch.Tensor, size: int, flips: torch.Tensor | None = None
) -> torch.Tensor:
    """Each uint8 image's box (top, left, height, width) resized to size x size, mirrored where ``flips`` says:
    torchvision's ``resized_crop`` (bilinear, antialiased) per image, on the batch's device (on a CPU the uint8
    kernel it calls, ``interpolate``, called directly: SIMD, no float copy, the same numbers), written straight
    into the batch (no stack, no second pass to flip; in a DataLoader worker, into shared memory, which the batch
    is sent through)."""
    from torchvision.transforms.v2 import functional

    crops = images.new_empty((len(images), images.shape[1], size, size))
    if torch.utils.data.get_worker_info() is not None:
        crops.share_memory_()  # as default_collate does in a worker: sending the batch then copies nothing
    on_cpu = images.device.type == "cpu"
    mirrored = [False] * len(images) if flips is None else flips.tolist()
    for index, ((top, left, height, width), mirror) in enumerate(zip(boxes.tolist(), mirrored)):
        if on_cpu:
            box = images[index : index + 1, :, top : top + height, left : left + width]
            crop = torch.nn.functional.interpolate(box, size=(size, size), mode="bilinear", antialias=True)[0]
        else:
            crop = functional.resized_crop(images[index], top, left, height, width, [size, size], antialias=True)
        crops[index] = crop.flip(-1) if mirror else crop
    return crops


def batched_resized_crops(
    images: torch.Tensor, boxes: torch.Tensor, size: int, flips: torch.Tensor | None = None
) -> torch.Tensor:
    """``resized_crops`` in one batched kernel (torchvision.ops.roi_align, aligned: bilinear samples at the output
    pixels' centres, as ``interpolate`` takes them; a box larger than ``size`` is averaged over ceil(box / size)
    samples per pixel, near the antialiased filter but not it), rounded back to uint8: one launch for the batch
    instead of several per image, which is what a GPU pays for.

    torchvision's own kernel is called (``torch.ops.torchvision.roi_align``), not ``torchvision.ops.roi_align``:
    under ``deterministic=True`` on a GPU that one swaps in a compiled pure-Python version for its backward's sake,
    which compiles in the middle of training and in eager mode holds a float per box, channel, output pixel and
    sample; crops need no backward, and the kernel's forward is deterministic (one thread per output value)."""
    import torchvision  # noqa: F401 - registers torch.ops.torchvision

    top, left, height, width = upload(boxes.float(), images.device).unbind(1)
    index = torch.arange(len(images), device=images.device, dtype=torch.float32)
    regions = torch.stack([index, left, top, left + width, top + height], dim=1)
    crops = torch.ops.torchvision.roi_align(images.float(), regions, 1.0, size, size, 0, True)
    if flips is not None:
        crops = torch.where(upload(flips, images.device)[:, None, None, None], crops.flip(-1), crops)
    return crops.round_().clamp_(0, 255).to(torch.uint8)


def eval_view(images: torch.Tensor, image_size: int, crop_fraction: float = 1.0) -> torch.Tensor:
    """What evaluation, predict and export see of uint8 square images of any side T: the central crop of side
    round(T x crop_fraction), resized (bilinear, antialiased) to image_size when it differs; the images unchanged
    when they already are image_size and crop_fraction is 1."""
    stored = images.shape[-1]
    side = round(stored * crop_fraction)
    if side == stored == image_size:
        return images
    start = (stored - side) // 2
    crop = images[..., start : start + side, start : start + side]
    if side == image_size:
        return crop.contiguous()
    resized = torch.nn.functional.interpolate(
        crop.float(), size=(image_size, image_size), mode="bilinear", antialias=True, align_corners=False
    )
    return resized.round_().clamp_(0, 255).to(torch.uint8)


def normalize(images: torch.Tensor, mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD) -> torch.Tensor:
    """uint8 (N, 3, H, W) to float32 normalised with a channel mean and std of 0..1 pixels (CIFAR-10's unless
    given: a folder dataset's come from its training images, ``data.records.DatasetInfo``)."""
    scaled_mean, scaled_std = _normalization(images.device, tuple(mean), tuple(std))
    return images.float().sub_(scaled_mean).div_(scaled_std)  # in place: one float copy, the same numbers


@functools.lru_cache(maxsize=8)
def _normalization(
    device: torch.device, mean: tuple[float, ...], std: tuple[float, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (1, 3, 1, 1) mean and std in pixel units on ``device``, made once per device (not at every batch) on
    the CPU and sent through ``upload``: ``torch.tensor(..., device=cuda)`` copies from pageable memory, which
    waits for the GPU's queue."""
    return (
        upload(torch.tensor(mean).view(1, 3, 1, 1) * 255, device),
        upload(torch.tensor(std).view(1, 3, 1, 1) * 255, device),
    )


Transform = Callable[[torch.Tensor], torch.Tensor]


def policy(name: str | None, magnitude: int | None = None) -> Transform | None:
    """torchvision.transforms.v2's augmentation policy for one uint8 image (3, H, W), or None for "none":
    TrivialAugmentWide (``magnitude``: its number of bins, default 31), RandAugment (magnitude, default 9) or
    AutoAugment with its CIFAR-10 policy."""
    if name in (None, "none"):
        return None
    from torchvision.transforms import v2

    if name == "trivialaugment":
        return v2.TrivialAugmentWide(num_magnitude_bins=31 if magnitude is None else magnitude)
    if name == "randaugment":
        return v2.RandAugment(magnitude=9 if magnitude is None else magnitude)
    return v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)


def random_erasing(probability: float) -> Transform | None:
    """torchvision's RandomErasing for one normalised image (erased to 0, the mean), or None when off."""
    if probability <= 0:
        return None
    from torchvision.transforms import v2

    return v2.RandomErasing(p=probability, value=0)


def brightness_contrast(inputs: torch.Tensor, amount: float, generator: torch.Generator) -> torch.Tensor:
    """Each normalised image shifted by b and scaled by c, drawn per image uniformly in -amount..amount and
    1-amount..1+amount (hiverge's cifar10_speedrun.py; on normalised data the scale is a contrast about the
    dataset's mean). torchvision's ColorJitter given a batch draws one factor for all of it."""
    if amount <= 0:
        return inputs
    shape = (len(inputs), 1, 1, 1)  # drawn on the CPU, as every draw here (a CPU generator), then sent
    shift = (upload(torch.rand(shape, generator=generator), inputs.device) * 2 - 1) * amount
    scale = (upload(torch.rand(shape, generator=generator), inputs.device) * 2 - 1) * amount + 1
    return inputs.add_(shift).mul_(scale)


def per_image(transform: Transform, images: torch.Tensor) -> torch.Tensor:
    """``transform`` on each image of a batch with its own random draws (v2 given a batch draws once for all)."""
    return torch.stack([transform(image) for image in images])


def mixing(
    mixup_alpha: float, cutmix_alpha: float, num_classes: int
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """torchvision's MixUp and/or CutMix on a (float images, int labels) batch, returning soft labels (N, classes);
    with both, one of the two per batch (as torchvision's reference script does). None when both are off."""
    from torchvision.transforms import v2

    chosen = [
        *([v2.MixUp(alpha=mixup_alpha, num_classes=num_classes)] if mixup_alpha > 0 else []),
        *([v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)] if cutmix_alpha > 0 else []),
    ]
    if not chosen:
        return None
    return chosen[0] if len(chosen) == 1 else v2.RandomChoice(chosen)

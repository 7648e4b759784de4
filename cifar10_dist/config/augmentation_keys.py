"""How training images are augmented: crops, flips, resizing, policies, erasing, colour, MixUp/CutMix, data selection
and the evaluation view. Fields of ``Config`` (``config.fields`` composes them; one flat set of keys for flags, YAML
and the API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from cifar10_dist.config.options import FRACTION, Bounds, option


@dataclass(frozen=True)
class AugmentationKeys:
    """How training images are augmented."""

    crop_padding: int = option(
        4,
        "pixels of padding before the random 32x32 crop (0: no crop)",
        short="padding before the random crop (0: none)",
        bounds=Bounds(0, 16, in_words="in 0..16 pixels"),
    )
    random_resized_crop: float = option(
        0.0,
        "train on random-resized crops: the smallest area fraction of a crop "
        "(e.g. 0.35, or torchvision's 0.08), aspect ratio 3/4..4/3, resized to "
        "image_size on the device; replaces the padded crop (0: off)",
        short="smallest area of a random-resized crop",
        bounds=Bounds(0, 1, high_open=True, note=" (0: off)"),
    )
    crop_fraction: float = option(
        1.0,
        "evaluation, predict and export see the central crop_fraction of each image "
        "resized to image_size (e.g. 0.875, torchvision's 224 of 256); a folder is stored "
        "at image_size / crop_fraction",
        short="central fraction evaluation sees",
        bounds=Bounds(0.5, 1, in_words="in [0.5, 1]"),
    )
    resize_start: float = option(
        1.0,
        "progressive resizing: epoch 1 trains at this fraction of image_size, growing "
        "per epoch (4-pixel steps) to full size by resize_until of training; evaluation at "
        "full size (1: off)",
        short="progressive resizing: first size fraction",
        bounds=Bounds(0.25, 1, in_words="in [0.25, 1]", note=" (1: off)"),
    )
    resize_until: float = option(
        0.75,
        "progressive resizing: the fraction of training by which images are full size",
        short="progressive resizing: full size from here",
        bounds=Bounds(0, 1, low_open=True),
    )
    crop_pad_mode: Literal["zeros", "reflect"] = option(
        "zeros",
        "padding for the crop: zeros or reflect",
        short="crop padding: zeros or reflect",
        choices_in_words="zeros or reflect",
    )
    flip: Literal["random", "alternating", "none"] = option(
        "random",
        "horizontal flip: random (per image), "
        "alternating (half the images pre-flipped, all flipped "
        "every other epoch) or none",
        short="horizontal flip: random, alternating, none",
    )
    auto_augment: Literal["none", "trivialaugment", "randaugment", "autoaugment"] = option(
        "none",
        "a torchvision.transforms.v2 policy per training image: none, trivialaugment, randaugment or "
        "autoaugment (its CIFAR-10 policy)",
        short="a torchvision augmentation policy",
    )
    auto_augment_magnitude: Optional[int] = option(
        None,
        "randaugment: magnitude 0..30 (default 9); trivialaugment: number of magnitude bins 2..31 (default 31)",
        short="the policy's magnitude",
    )
    random_erasing: float = option(
        0.0,
        "probability of erasing a random rectangle of each training image (torchvision's RandomErasing), 0..1",
        short="probability of erasing a rectangle",
        bounds=Bounds(0, 1, in_words="a probability in 0..1"),
    )
    color_jitter: float = option(
        0.0,
        "each training image's brightness shifted and contrast scaled by amounts drawn "
        "in +-this on the normalised batch (hiverge's CIFAR record: 0.15)",
        short="brightness and contrast jitter",
        bounds=FRACTION,
    )
    mixup_alpha: float = option(
        0.0,
        "MixUp's Beta(alpha, alpha) for training batches (0: off; with cutmix_alpha, one of the two per batch)",
        short="MixUp's alpha (0: off)",
        bounds=Bounds(0, in_words="0 (off) or more"),
    )
    cutmix_alpha: float = option(
        0.0,
        "CutMix's Beta(alpha, alpha) for training batches (0: off)",
        short="CutMix's alpha (0: off)",
        bounds=Bounds(0, in_words="0 (off) or more"),
    )

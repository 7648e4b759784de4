"""Random-resized crops and the evaluation view: boxes within torchvision's area and ratio bounds, drawn with a
fixed number of random numbers (exact resume), crops that are the box's pixels, the central crop resized; a
folder run with them resumes bit-exactly and evaluates alike at world sizes 1, 2, 3 (tests/test_image_folders.py)
and predict sees what evaluate sees there."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms.v2 import functional as F

from cifar10_dist.config import load_config
from cifar10_dist.data import augmentation
from cifar10_dist.errors import UserError


def test_boxes_lie_in_the_image_within_the_area_and_ratio_bounds():
    boxes = augmentation.random_resized_boxes(4000, 64, 0.35, torch.Generator().manual_seed(0))
    top, left, height, width = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + height <= 64).all() and (left + width <= 64).all()
    area, ratio = (height * width).double() / 64**2, width.double() / height
    rounding = 2 * 64 / 64**2 + 1 / 64**2  # a side rounded by half a pixel each way
    assert area.min() >= 0.35 - rounding and area.max() <= 1
    assert ratio.min() >= 3 / 4 * (1 - 1 / 16) and ratio.max() <= 4 / 3 * (1 + 1 / 16)
    torch.manual_seed(0)  # torchvision's own sampler, for the distribution: areas that do not fit are redrawn
    from torchvision.transforms import RandomResizedCrop

    theirs = torch.tensor(
        [RandomResizedCrop.get_params(torch.zeros(1, 64, 64), [0.35, 1.0], [3 / 4, 4 / 3])[2:] for _ in range(4000)]
    ).double()
    assert float(area.mean()) == pytest.approx(float((theirs[:, 0] * theirs[:, 1]).mean()) / 64**2, abs=0.015)
    assert float(torch.log(ratio).mean()) == pytest.approx(
        float(torch.log(theirs[:, 1] / theirs[:, 0]).mean()), abs=0.015
    )
    assert len({(int(row), int(column)) for row, column in zip(top, left)}) > 300  # positions vary, to both edges
    assert (top == 0).any() and (left == 0).any() and (top + height == 64).any() and (left + width == 64).any()


def test_the_draws_depend_on_the_seed_alone_and_use_a_fixed_count_of_random_numbers():
    first = augmentation.random_resized_boxes(50, 32, 0.08, torch.Generator().manual_seed(3))
    assert torch.equal(first, augmentation.random_resized_boxes(50, 32, 0.08, torch.Generator().manual_seed(3)))
    after = []
    for scale in (0.08, 0.9):  # other boxes, the same number of draws: what follows in the batch is unchanged
        generator = torch.Generator().manual_seed(3)
        augmentation.random_resized_boxes(50, 32, scale, generator)
        after.append(torch.rand(4, generator=generator))
    assert torch.equal(after[0], after[1])


def test_a_crop_is_the_boxes_pixels_resized():
    images = torch.randint(0, 256, (3, 3, 20, 20), dtype=torch.uint8)
    whole = torch.tensor([[0, 0, 20, 20]] * 3)
    assert torch.equal(augmentation.resized_crops(images, whole, 20), images)
    box = torch.tensor([[2, 5, 10, 10], [0, 0, 10, 10], [10, 10, 10, 10]])
    crops = augmentation.resized_crops(images, box, 10)  # same size: exactly the pixels of the box
    for image, crop, (top, left, height, width) in zip(images, crops, box.tolist()):
        assert torch.equal(crop, image[:, top : top + height, left : left + width])
    shrunk = augmentation.resized_crops(images, box, 7)  # torchvision's antialiased resize of each box
    for image, crop, (top, left, height, width) in zip(images, shrunk, box.tolist()):
        assert torch.equal(crop, F.resize(image[:, top : top + height, left : left + width], [7, 7], antialias=True))
    photos = torch.randint(0, 256, (6, 3, 64, 64), dtype=torch.uint8)
    boxes = augmentation.random_resized_boxes(6, 64, 0.08, torch.Generator().manual_seed(2))  # enlarged and shrunk
    flips = torch.tensor([True, False] * 3)
    cut = augmentation.resized_crops(photos, boxes, 56, flips)
    for photo, crop, (top, left, height, width), flip in zip(photos, cut, boxes.tolist(), flips.tolist()):
        theirs = F.resized_crop(photo, top, left, height, width, [56, 56], antialias=True)
        assert torch.equal(crop, theirs.flip(-1) if flip else theirs)


def test_a_flip_alone_draws_and_mirrors_as_the_general_crop_and_flip_does():
    images = torch.randint(0, 256, (9, 3, 6, 6), dtype=torch.uint8)
    fast = augmentation.augment(images, torch.Generator().manual_seed(4), padding=0)
    generator = torch.Generator().manual_seed(4)  # the general path, as a padding of 0 took it before
    torch.randint(0, 1, (2, 9), generator=generator)
    flips = torch.rand(9, generator=generator) < 0.5
    assert torch.equal(fast, torch.where(flips[:, None, None, None], images.flip(-1), images)) and flips.any()


def test_batched_crops_are_the_per_image_crops_inside_the_box_and_flip_alike():
    """The GPU's batched kernel (roi_align) samples where the per-image resize does: inside an enlarged box the
    same pixels (uint8 rounding apart); at its edges it reads the image's pixels beyond the box."""
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8, generator=generator)
    boxes = augmentation.random_resized_boxes(32, 32, 0.35, generator)
    flips = torch.rand(32, generator=generator) < 0.5
    each = augmentation.resized_crops(images, boxes, 28, flips).int()
    batched = augmentation.batched_resized_crops(images, boxes, 28, flips)
    assert batched.dtype == torch.uint8 and batched.shape == (32, 3, 28, 28)
    enlarged = (boxes[:, 2] <= 28) & (boxes[:, 3] <= 28)
    assert enlarged.sum() >= 10
    inside = (each[enlarged] - batched.int()[enlarged])[..., 1:-1, 1:-1].abs()
    assert inside.max() <= 3 and inside.float().mean() < 0.5
    unflipped = augmentation.batched_resized_crops(images, boxes, 28)
    assert torch.equal(batched[flips], unflipped[flips].flip(-1)) and torch.equal(batched[~flips], unflipped[~flips])


def test_the_evaluation_view_is_the_central_crop_resized():
    images = torch.randint(0, 256, (2, 3, 37, 37), dtype=torch.uint8)
    assert torch.equal(augmentation.eval_view(images, 32, 0.875), images[..., 2:34, 2:34])  # stored at 32 / 0.875
    small = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    assert augmentation.eval_view(small, 32, 1.0) is small
    expected = F.resize(small[..., 2:30, 2:30], [32, 32], antialias=True)  # CIFAR: the central 28, resized
    assert (augmentation.eval_view(small, 32, 0.875).int() - expected.int()).abs().max() <= 1


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("random_resized_crop", 1.0, "random_resized_crop=1.0 must be in [0, 1) (0: off)"),
        ("crop_fraction", 0.3, "crop_fraction=0.3 must be in [0.5, 1]"),
    ],
)
def test_bad_crop_settings_are_one_line(key, value, message):
    with pytest.raises(UserError) as refused:
        load_config(None, **{key: value})
    assert str(refused.value) == message


def test_a_folder_is_stored_at_image_size_over_crop_fraction():
    from cifar10_dist.data.folder_source import stored_size

    for size, fraction, stored in ((224, 0.875, 256), (28, 0.875, 32), (96, 1.0, 96), (128, 0.9, 142)):
        config = load_config(None, dataset="folder", image_size=size, crop_fraction=fraction)
        assert stored_size(config) == stored and round(stored * fraction) == size
        assert math.isclose(size / fraction, stored, abs_tol=0.5)

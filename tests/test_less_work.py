"""Faster by doing less work: progressive resizing (data/resizing.py) and data selection (training/loop/selection.py).
Sizes and selections are checked exactly, the airbench net at every size it is asked to take, refusals in one
line, and both levers together resume bit for bit with 2 gloo processes and evaluate alike at world sizes 1 and 2."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from cifar10_dist import models
from cifar10_dist.config import load_config
from cifar10_dist.data import batches, resizing
from cifar10_dist.data.datasets import DatasetInfo
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop.selection import HardestSelection
from cifar10_dist.training.loop.step import TrainStep
from tests.conftest import TINY, run_in_this_process

CLASSES = tuple("abcdefghij")


def test_the_side_grows_linearly_per_epoch_in_steps_of_4_to_full_size_by_the_given_fraction():
    ramp = resizing.schedule(start=0.5, until=0.75, num_epochs=8, full=32)
    assert ramp.sizes(8) == [16, 16, 20, 24, 24, 28, 32, 32]  # 0.5 + 0.5 * epoch / 6 of 32, rounded down to 4s
    assert ramp.describe(8) == (
        "16 px in epochs 1-2, 20 px in epoch 3, 24 px in epochs 4-5, 28 px in epoch 6, "
        "32 px in epochs 7-8 (full size 32 px)"
    )
    assert resizing.schedule(0.5, 0.5, 4, 128).sizes(4) == [64, 96, 128, 128]
    off = resizing.schedule(1.0, 0.75, 8, 32)
    assert not off.active and off.sizes(8) == [32] * 8


def test_the_airbench_net_takes_16_to_32_pixels_and_is_airbenchs_own_at_32():
    torch.manual_seed(0)
    model = models.build_model("airbench").eval()
    images = torch.randn(4, 3, 32, 32)
    original = nn.Sequential(*list(model.layers)[:-2], nn.MaxPool2d(3), nn.Flatten())  # airbench94's last pooling
    with torch.no_grad():
        assert torch.equal(model(images), model.head(original(model.whiten(images))) / 9)
        for side in (16, 20, 24, 28):
            assert model(torch.randn(2, 3, side, side)).shape == (2, 10)


def prepared_sides(config_overrides: dict, stored: int = 32, image_size: int = 32) -> list[int]:
    config = load_config(None, num_epochs=4, batch_size=8, **config_overrides)
    info = DatasetInfo(CLASSES, image_size=image_size, stored=stored)
    prepare = batches.train_batch_preparer(
        torch.device("cpu"), batches.TrainAugmentation.of(config), iterations_per_epoch=2, info=info
    )
    batch = (torch.randint(0, 256, (8, 3, stored, stored), dtype=torch.uint8), torch.randint(0, 10, (8,)))
    sides = []
    for iteration in range(1, 9):
        inputs, _ = prepare(batch, iteration)
        assert inputs.shape[-1] == inputs.shape[-2]
        sides.append(inputs.shape[-1])
    return sides


def test_each_epoch_trains_at_its_side_for_padded_and_for_random_resized_crops():
    assert prepared_sides({"resize_start": 0.5, "resize_until": 0.5}) == [16, 16, 24, 24, 32, 32, 32, 32]
    folder = {
        "resize_start": 0.5,
        "resize_until": 0.5,
        "random_resized_crop": 0.35,
        "dataset": "folder",
        "data_path": "unused",
        "image_size": 64,
    }
    assert prepared_sides(folder, stored=72, image_size=64) == [32, 32, 48, 48, 64, 64, 64, 64]
    assert prepared_sides({}) == [32] * 8


def test_a_resized_batch_is_the_full_batch_made_smaller():
    config = load_config(None, num_epochs=2, crop_padding=0, flip="none", resize_start=0.5, resize_until=0.5)
    prepare = batches.train_batch_preparer(
        torch.device("cpu"), batches.TrainAugmentation.of(config), 1, DatasetInfo(CLASSES)
    )
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    small, _ = prepare((images, torch.zeros(4, dtype=torch.long)), 1)
    full, _ = prepare((images, torch.zeros(4, dtype=torch.long)), 2)
    expected = nn.functional.interpolate(full, size=(16, 16), mode="bilinear", antialias=True, align_corners=False)
    assert torch.allclose(small, expected, atol=1e-5)


class Fixed(nn.Module):
    """Logits given per image by its first pixel: image i scores [v_i, 0, ...], so its loss is known."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.norm(images[:, :1])
        logits = torch.zeros(len(images), 3)
        logits[:, 0] = images[:, 0, 0, 0]
        return logits


def test_the_selection_keeps_the_highest_loss_images_in_order_and_leaves_batchnorm_as_it_was():
    model = Fixed().train()
    selection = HardestSelection(model, Precision("cpu", None), fraction=0.4, until=10)
    values = torch.tensor([5.0, -3.0, 0.0, -1.0, 4.0])  # target 0: the loss falls with the value
    inputs = values.view(5, 1, 1, 1).expand(5, 2, 2, 2).contiguous()
    before = {name: value.clone() for name, value in model.norm.state_dict().items()}
    chosen, targets = selection(inputs, torch.zeros(5, dtype=torch.long))
    assert chosen[:, 0, 0, 0].tolist() == [-3.0, -1.0]  # the two lowest logits, in the batch's order
    assert targets.tolist() == [0, 0]
    assert all(torch.equal(before[name], value) for name, value in model.norm.state_dict().items())
    assert model.norm.momentum == 0.1
    assert selection.applies(10) and not selection.applies(11)
    assert selection.kept(1) == 1


def test_a_selecting_step_trains_exactly_as_a_step_on_the_selected_images():
    def trained(select: bool) -> dict:
        torch.manual_seed(0)
        model = models.build_model("simple_cnn", {"width": 8})
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        precision = Precision("cpu", None)
        step = TrainStep(
            model,
            optimizer,
            nn.CrossEntropyLoss(),
            precision,
            selection=HardestSelection(model, precision, 0.5, until=3),
        )
        generator = torch.Generator().manual_seed(1)
        for _ in range(3):
            inputs = torch.randn(16, 3, 32, 32, generator=generator)
            targets = torch.randint(0, 10, (16,), generator=generator)
            if not select:  # what the selection would pick, given by hand
                inputs, targets = step.selection(inputs, targets)
            step(inputs, targets, select=select)
        return model.state_dict()

    selected, by_hand = trained(True), trained(False)
    assert all(torch.equal(selected[key], by_hand[key]) for key in selected)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--model=airbench", "--resize_start=0.25"],
            "resize_start=0.25: model='airbench' cannot take the first epoch's 8x8 images",
        ),
        (["--resize_start=0.2"], "resize_start=0.2"),
        (["--select_hardest_fraction=0"], "select_hardest_fraction=0"),
        (["--resize_until=0"], "resize_until=0"),
    ],
)
def test_levers_that_cannot_apply_are_refused_in_one_line(small_dataset, tmp_path, overrides, message):
    given = (
        [argument for argument in TINY if not argument.startswith("--model")]
        if "--model=airbench" in overrides
        else TINY
    )
    result = run_in_this_process("run", *given, *overrides, f"--data_path={small_dataset}", f"--output_path={tmp_path}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.slow
def test_resizing_and_selection_with_two_processes_resume_exactly_and_evaluate_alike(small_dataset, tmp_path):
    common = [
        "run",
        *TINY,
        "--num_epochs=3",
        "--num_warmup_epochs=1",
        "--resize_start=0.5",
        "--resize_until=0.67",
        "--select_hardest_fraction=0.5",
        "--select_hardest_until=0.8",
        "--backend=gloo",
        "--nproc_per_node=2",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--checkpoint_every=40",
    ]
    whole = run_in_this_process(*common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    middle = tmp_path / "whole" / "training_checkpoint_40.pt"  # inside epoch 3 (iterations 37-54), still selecting
    resumed = run_in_this_process(*common, "--run_name=resumed", f"--resume_from={middle}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ends = [
        torch.load(tmp_path / name / "training_checkpoint_54.pt", weights_only=True) for name in ("whole", "resumed")
    ]
    assert all(torch.equal(ends[0]["model"][key], ends[1]["model"][key]) for key in ends[0]["model"])
    checkpoint = tmp_path / "whole" / "training_checkpoint_54.pt"
    results = [
        json.loads(
            run_in_this_process("evaluate", f"--checkpoint={checkpoint}", "--json", "--num_workers=0", *launch)
            .stdout.strip()
            .splitlines()[-1]
        )
        for launch in ([], ["--backend=gloo", "--nproc_per_node=2"])
    ]
    assert results[0]["confusion_matrix"] == results[1]["confusion_matrix"]
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-6)

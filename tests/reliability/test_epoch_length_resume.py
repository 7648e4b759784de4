"""Exact resume with ``epoch_length`` set: Ignite takes a new pass over the data when the last one ends, also
mid-epoch, so epochs shorter than a pass continue it, and an epoch longer than one spans two. A resumed run starts
in the pass an uninterrupted run is in, with its shuffle, after its batches already seen (600 images at batch 32:
18 batches a pass)."""

from __future__ import annotations

import pytest

from cifar10_dist.data.batches import pass_started
from tests.conftest import TINY, assert_same_training_state, run_in_this_process


def test_the_pass_under_way_and_its_shuffle_follow_from_the_iteration():
    assert pass_started(0, 18, None) == (0, 0)
    assert pass_started(40, 18, None) == (2, 4)  # one pass an epoch: the epoch's own shuffle
    assert pass_started(20, 18, 7) == (2, 2)  # pass 1 began at step 18, in epoch 3 (steps 14-20 from 0)
    assert pass_started(40, 18, 25) == (1, 4)  # pass 2 began at step 36, in epoch 2 (steps 25-49)
    assert pass_started(36, 18, 25) == (1, 0)
    assert pass_started(14, 18, 7) == (0, 14)  # resumed in epoch 3, in the pass that began in epoch 1
    assert pass_started(25, 18, 25) == (0, 7)


@pytest.mark.parametrize(
    "epoch_length, epochs, checkpoint_every, resume_at, where",
    [
        (7, 4, 10, 20, "loader"),  # 28 steps: the resume at 20 lies mid-pass (pass 2) and mid-epoch (epoch 3)
        (25, 2, 20, 40, "loader"),  # 50 steps: at 40, mid-pass (pass 3) and mid-epoch (epoch 2)
        # resumed in a pass that began an epoch earlier: the next pass (step 19, epoch 3; step 37, epoch 2)
        # draws its own epoch's shuffle again
        (7, 3, 7, 14, "loader"),
        (25, 2, 25, 25, "loader"),
        (7, 3, 7, 14, "device"),  # the order and crops drawn on the device, per pass
    ],
)
def test_a_run_with_epoch_length_resumes_bit_exactly(
    small_dataset, tmp_path, epoch_length, epochs, checkpoint_every, resume_at, where
):
    on_device = ["--data_on_device=True", "--augment_per_pass=True"] if where == "device" else []
    common = [
        "run",
        *TINY,
        *on_device,
        f"--num_epochs={epochs}",
        f"--epoch_length={epoch_length}",
        f"--checkpoint_every={checkpoint_every}",
        "--train_eval_size=0",
        f"--validate_every={epochs}",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
    ]
    whole = run_in_this_process(*common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    checkpoint = tmp_path / "whole" / f"training_checkpoint_{resume_at}.pt"
    resumed = run_in_this_process(*common, "--run_name=resumed", f"--resume_from={checkpoint}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = f"training_checkpoint_{epochs * epoch_length}.pt"
    assert_same_training_state(tmp_path / "whole" / last, tmp_path / "resumed" / last)

"""The batch-size finder: on a CPU the sizes it timed with their speeds and a suggestion among them, verdicts
only beyond the spread, the GPU's growth and bisection (on a stand-in for memory here; on CUDA in tests/gpu),
and the learning rate carried to the batch by the optimizer's rule."""

from __future__ import annotations

import json
import math

import pytest

from cifar10_dist import api
from cifar10_dist.system.doctor import Timing
from cifar10_dist.training.before_training import batch_sizes
from tests.conftest import run_in_this_process

TINY_MODEL = {"model": "simple_cnn", "model_kwargs": {"width": 8}}


def test_the_cpu_finder_times_each_size_and_suggests_one_of_them_with_its_learning_rate():
    result = api.batch_size(None, [8, 32], budget_seconds=0.2, batch_size=16, learning_rate=0.2, **TINY_MODEL)
    assert [row.batch_size for row in result.speeds] == [8, 16, 32]  # the config's own added
    assert all(row.images_per_second > 0 and row.steps >= 3 for row in result.speeds)
    assert sum(row.verdict == "fastest" for row in result.speeds) == 1
    assert result.batch_size in (8, 16, 32) and result.device == "cpu"
    assert result.learning_rate == pytest.approx(0.2 * result.batch_size / 16)
    assert result.rule.startswith("linear")


def test_no_size_above_a_process_share_of_the_training_split_is_timed_or_suggested():
    """100 synthetic training images, 40% held out for val: 60 to train on, 30 per process of 2; the config's 512 is
    more than a run would accept, so neither it nor 64 is timed."""
    result = api.batch_size(
        None,
        [16, 32, 64],
        budget_seconds=0.1,
        batch_size=512,
        dataset="synthetic",
        synthetic_size=100,
        val_split=0.4,
        nproc_per_node=2,
        backend="gloo",
        **TINY_MODEL,
    )
    assert [row.batch_size for row in result.speeds] == [16]
    assert result.batch_size == 2 * 16 and result.world_size == 2
    assert result.reason == (
        "the config's 256 per process is more than the training split holds; 16 trains fastest "
        f"of the sizes that fit ({result.speeds[0].images_per_second:.0f} img/s); sizes capped "
        "at the 60 training images (30 per process)"
    )
    smaller_than_any = api.batch_size(
        None, [32], budget_seconds=0.1, batch_size=512, dataset="synthetic", synthetic_size=20, **TINY_MODEL
    )
    assert [row.batch_size for row in smaller_than_any.speeds] == [20] and smaller_than_any.batch_size == 20


def test_the_cli_prints_the_table_and_the_suggestion():
    result = run_in_this_process(
        "batch-size",
        "--model=simple_cnn",
        '--model_kwargs={"width": 8}',
        "--batch_sizes=8,32",
        "--budget_seconds=0.2",
        "--batch_size=16",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "simple_cnn at 32 px on cpu, one process (sizes per process):" in result.stdout
    assert result.stdout.count(" img/s  +-") == 3
    assert "suggested batch_size: " in result.stdout and "by the linear (SGD" in result.stdout
    as_json = run_in_this_process(
        "batch-size",
        "--model=simple_cnn",
        '--model_kwargs={"width": 8}',
        "--batch_sizes=8",
        "--budget_seconds=0.1",
        "--batch_size=8",
        "--json",
    )
    assert json.loads(as_json.stdout)["speeds"][0]["batch_size"] == 8


def test_bad_batch_sizes_are_refused_in_one_line():
    result = run_in_this_process("batch-size", "--batch_sizes=64,abc")
    assert result.returncode == 2
    assert "batch_sizes=" in result.stderr and "must be whole numbers >= 1" in result.stderr


def timing(batch: int, seconds: list[float]) -> Timing:
    return Timing(batch, seconds[0], tuple(seconds))


def test_a_size_is_called_slower_only_when_its_band_clears_the_fastest():
    rows = batch_sizes.compared(
        [
            timing(64, [0.100, 0.101, 0.102, 0.103]),  # 630 img/s, tight
            timing(128, [0.150, 0.190, 0.200, 0.260]),  # ~660 img/s, wide: overlaps 256's band
            timing(256, [0.370, 0.372, 0.374, 0.376]),  # ~685 img/s: the fastest
        ]
    )
    assert [row.verdict for row in rows] == ["slower", "no difference measurable from the fastest", "fastest"]
    assert rows[2].images_per_second == pytest.approx(256 / 0.373)


def test_the_gpu_search_doubles_then_bisects_to_the_largest_batch_that_fits():
    asked = []

    def fits(batch: int) -> bool:
        asked.append(batch)
        return batch <= 700

    largest = batch_sizes.largest_fitting(fits, 32)
    assert 700 - 700 // 16 <= largest <= 700
    assert asked[:6] == [32, 64, 128, 256, 512, 1024]  # doubled until it failed, then bisected
    assert batch_sizes.largest_fitting(lambda batch: False, 32) == 0
    assert batch_sizes.largest_fitting(lambda batch: True, 32, limit=256) == 256


def test_adamw_scales_the_learning_rate_by_the_square_root():
    config = api.resolve(None, optimizer="adamw", learning_rate=0.001, batch_size=256)
    learning_rate, rule = batch_sizes.scaled_learning_rate(config, 1024)
    assert learning_rate == pytest.approx(0.001 * math.sqrt(4))
    assert rule.startswith("square root")

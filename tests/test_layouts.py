"""channels_last=auto (training/setup/layouts.py): settled by the model and the device, logged, saved in the run's
config and provenance, without changing the run's random draws."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from torch import nn

from cifar10_dist import models
from cifar10_dist.system import layout_numerics
from cifar10_dist.training.setup import layouts
from tests.conftest import TINY, TINY_WIDTH, run_in_this_process


def convolutional() -> nn.Module:
    return models.build_model("simple_cnn", {"width": TINY_WIDTH})


def linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))


CHECKED = re.compile(
    r"; fp32 error against float64 (\S+) channels-last, (\S+) contiguous \(\d+\.\dx, 6 layers\): "
    r"within fp32 noise\)$"
)


@pytest.mark.parametrize(
    ("device", "build", "expected"),
    [
        ("cpu", convolutional, True),
        ("cuda", convolutional, True),
        ("cpu", linear, False),
        ("xla", convolutional, False),
    ],
)
def test_auto_is_on_for_convolutions_on_cpus_and_cuda_and_off_elsewhere(device, build, expected):
    chosen, why = layouts.choose("auto", torch.device(device), build)
    assert chosen is expected
    if (device, expected) == ("cpu", True):  # on a CPU the numbers are checked too, and the check is said
        head, tail = why.split(";", 1)
        assert head == "channels_last=auto: on (3 2D convolutions, which cpu runs faster channels-last"
        channels_last, contiguous = (float(error) for error in CHECKED.search(why).groups())
        assert 0 < contiguous < 1e-5 and 0 < channels_last < 1e-5
        return
    assert (
        why
        == {
            ("cuda", True): "channels_last=auto: on (3 2D convolutions, which cuda runs faster channels-last)",
            ("cpu", False): "channels_last=auto: off (the model has no 2D convolutions)",
            ("xla", False): "channels_last=auto: off (xla: not measured faster there)",
        }[device, expected]
    )


class LessExactChannelsLast(nn.Conv2d):
    """A convolution that computes in bf16 when its input is channels-last, as an implicit reduced-precision kernel
    of one layout would (oneDNN's fpmath mode, a bug)."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous():
            return super().forward(images.bfloat16().to(images.dtype))
        return super().forward(images)


def less_exact_channels_last() -> nn.Module:
    return nn.Sequential(
        LessExactChannelsLast(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


def test_auto_stays_off_on_a_cpu_where_channels_last_changes_the_numbers_beyond_fp32_noise():
    chosen, why = layouts.choose("auto", torch.device("cpu"), less_exact_channels_last)
    assert chosen is False
    assert why.startswith(
        "channels_last=auto: off (it changes this model's numbers on this CPU: fp32 error against float64 "
    )
    assert why.endswith("beyond fp32 noise (over 10x))")
    numerics = layout_numerics.check(less_exact_channels_last)
    assert numerics.channels_last_error > 100 * numerics.contiguous_error  # bf16's 8 bits against fp32's 24


def test_auto_stays_off_for_a_model_whose_numbers_cannot_be_checked():
    def fixed_size() -> nn.Module:  # takes 64 px images only: the check's random 32 px images are refused
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 62 * 62, 10))

    chosen, why = layouts.choose("auto", torch.device("cpu"), fixed_size)
    assert chosen is False
    assert why.startswith("channels_last=auto: off (its numerics could not be checked on this CPU: ")
    assert layouts.choose("auto", torch.device("cpu"), fixed_size, image_size=64)[0] is True


def test_a_given_setting_is_kept_whatever_the_model():
    assert layouts.choose(False, torch.device("cpu"), convolutional) == (False, "channels_last=False (as given)")
    assert layouts.choose(True, torch.device("cpu"), linear) == (True, "channels_last=True (as given)")


def test_counting_convolutions_leaves_the_random_state_alone():
    def needs_real_tensors() -> nn.Module:  # cannot be built on the meta device: built on the CPU instead
        torch.randn(3).sum().item()
        return convolutional()

    for build in (lambda: models.build_model("resnet18"), needs_real_tensors):
        torch.manual_seed(3)
        expected = torch.rand(4)
        torch.manual_seed(3)
        assert layouts.convolutions(build) > 0
        assert torch.equal(torch.rand(4), expected)


def test_a_run_left_at_auto_trains_channels_last_here_and_records_the_choice(small_dataset, tmp_path):
    given = [argument for argument in TINY if not argument.startswith("--channels_last")]
    result = run_in_this_process(
        "run",
        *given,
        "--num_epochs=1",
        "--num_warmup_epochs=0",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=auto",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    why = json.loads((tmp_path / "auto" / "provenance.json").read_text())["memory_format"]
    assert why.startswith("channels_last=auto: on (3 2D convolutions, which cpu runs faster channels-last; ")
    assert CHECKED.search(why)
    assert f"memory format: {why}" in result.stderr
    assert yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())["channels_last"] is True

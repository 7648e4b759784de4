"""channels_last=auto (training/layouts.py): settled by the model and the device, logged, saved in the run's config
and provenance, without changing the run's random draws."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

from cifar10_dist import models
from cifar10_dist.training import layouts
from tests.conftest import TINY, TINY_WIDTH, run_in_process


def convolutional() -> nn.Module:
    return models.build_model("simple_cnn", {"width": TINY_WIDTH})


def linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))


@pytest.mark.parametrize(("device", "build", "expected"), [
    ("cpu", convolutional, True), ("cuda", convolutional, True), ("cpu", linear, False), ("xla", convolutional, False),
])
def test_auto_is_on_for_convolutions_on_cpus_and_cuda_and_off_elsewhere(device, build, expected):
    chosen, why = layouts.choose("auto", torch.device(device), build)
    assert chosen is expected
    assert why == {("cpu", True): "channels_last=auto: on (3 2D convolutions, which cpu runs faster channels-last)",
                   ("cuda", True): "channels_last=auto: on (3 2D convolutions, which cuda runs faster channels-last)",
                   ("cpu", False): "channels_last=auto: off (the model has no 2D convolutions)",
                   ("xla", False): "channels_last=auto: off (xla: not measured faster there)"}[device, expected]


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
    result = run_in_process("run", *given, "--num_epochs=1", "--num_warmup_epochs=0",
                            f"--data_path={small_dataset}",
                            f"--output_path={tmp_path}", "--run_name=auto")
    assert result.returncode == 0, result.stderr[-2000:]
    why = "channels_last=auto: on (3 2D convolutions, which cpu runs faster channels-last)"
    assert f"memory format: {why}" in result.stderr
    assert yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())["channels_last"] is True
    assert json.loads((tmp_path / "auto" / "provenance.json").read_text())["memory_format"] == why

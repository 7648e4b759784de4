"""The Muon recipe's parts: SGD with torch.optim.Muon for the convolution filters (against the airbench94_muon
record's update rule), its param groups and schedule, configs/fast_muon.yaml, its exact resume with 2 gloo
processes, and its one-line errors."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn

from cifar10_dist import models, preflight
from cifar10_dist.config import load_config
from cifar10_dist.errors import UserError
from cifar10_dist.training.setup import optimizers
from cifar10_dist.training.setup import schedules as lr_schedules
from tests.conftest import REPO, assert_same_training_state, run_in_this_process
from tests.test_recipe import SMALL, lrs_during

MUON_YAML = REPO / "configs" / "fast_muon.yaml"


def record_update(
    weight: torch.Tensor,
    gradient: torch.Tensor,
    buffer: torch.Tensor,
    lr: float,
    momentum: float,
    nesterov: bool = True,
    steps: int = 3,
) -> None:
    """The record's Muon step, restated in float64: summed momentum, Nesterov, the filter rescaled to norm
    sqrt(out_channels), the quintic Newton-Schulz iteration (3.4445, -4.7750, 2.0315) on the flattened update."""
    buffer.mul_(momentum).add_(gradient)
    update = gradient + momentum * buffer if nesterov else buffer
    weight.mul_(math.sqrt(len(weight)) / weight.norm())
    x = update.reshape(len(update), -1).double()
    x = x / (x.norm() + 1e-7)
    wide = x.size(0) > x.size(1)
    x = x.T if wide else x
    for _ in range(steps):
        gram = x @ x.T
        x = 3.4445 * x + (-4.7750 * gram + 2.0315 * gram @ gram) @ x
    x = x.T if wide else x
    weight.add_(x.view(weight.shape).to(weight.dtype), alpha=-lr)


def relative_step_errors(channels_last: bool, nesterov: bool = True) -> list[float]:
    """Three steps of our optimizer on a small airbench network; per step and filter, how far our filter update is
    from the record's (float64) on the same gradients, relative to the update's size."""
    torch.manual_seed(0)
    model = models.build_model("airbench", {"widths": [16, 32, 32]})
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=layout)
    config = load_config(MUON_YAML)
    optimizer, _ = optimizers.build_optimizer(model, config, total_iterations=100)
    filters = optimizers.convolution_filters(model)
    buffers = [torch.zeros_like(f, memory_format=torch.contiguous_format) for f in filters]
    errors = []
    for _ in range(3):
        images = torch.randn(8, 3, 32, 32).contiguous(memory_format=layout)
        nn.functional.cross_entropy(model(images), torch.randint(0, 10, (8,))).backward()
        before = [f.detach().clone().contiguous() for f in filters]
        expected = [b.clone() for b in before]
        for weight, f, buffer in zip(expected, filters, buffers):
            record_update(weight, f.grad.contiguous(), buffer, 0.24, 0.6, nesterov)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for weight, start, f in zip(expected, before, filters):
            rescaled = start * math.sqrt(len(start)) / start.norm()
            ours, theirs = f.detach().contiguous() - rescaled, weight - rescaled
            errors.append(float((ours - theirs).norm() / theirs.norm()))
    return errors


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_the_filters_follow_the_records_muon_update(channels_last):
    """torch.optim.Muon runs Newton-Schulz in bf16 (about 2% from float64); a wrong column order, momentum form or
    missing rescaling would be off by far more: the same comparison without Nesterov is shown to fail."""
    errors = relative_step_errors(channels_last)
    assert len(errors) == 18 and max(errors) < 0.05, errors
    assert max(relative_step_errors(channels_last, nesterov=False)) > 0.1


def test_muon_groups_and_their_schedule():
    config = load_config(MUON_YAML, learning_rate=1.0, weight_decay=0.01)
    model = models.build_model("airbench")
    optimizer, schedules = optimizers.build_optimizer(model, config, total_iterations=100)
    assert isinstance(optimizer, optimizers.SGDWithMuon)
    others, norm_biases, whitening, filters = optimizer.param_groups
    assert [p is model.head.weight for p in others["params"]] == [True]  # the head only: filters go to Muon
    assert len(norm_biases["params"]) == 6 and norm_biases["lr"] == 64.0
    assert whitening["params"][0] is model.whiten.bias and whitening["lr"] == 64.0
    assert whitening["weight_decay"] == pytest.approx(0.01 / 64)
    assert len(filters["params"]) == 6 and all(p.ndim == 4 for p in filters["params"]) and filters["lr"] == 0.24
    trained = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert sorted(trained) == sorted(id(p) for p in model.parameters() if p.requires_grad)
    scheduler = lr_schedules.create_lr_scheduler(optimizer, 1.0, 0, 100, start=1.0, end=0.0, group_schedules=schedules)
    lrs = lrs_during(optimizer, scheduler, 100)
    assert lrs[0] == pytest.approx([1.0, 64.0, 64.0, 0.24])
    assert lrs[50] == pytest.approx([0.5, 32.0, 0.0, 0.12])  # whitening bias trained until 30
    optimizer.step()  # no gradients yet: nothing moves, nothing fails
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(lrs[99][3])


def test_fast_muon_yaml_holds_the_records_values_converted_to_our_loss_and_head():
    config = load_config(MUON_YAML)
    assert (config.batch_size, config.num_epochs, config.num_warmup_epochs, config.lr_end) == (2000, 8, 0, 0)
    assert (config.muon_lr, config.muon_momentum, config.muon_ns_steps) == (0.24, 0.6, 3)
    assert not config.periodic_averaging and config.tta == 2 and config.label_smoothing == 0.2
    # record: summed loss, head lr 0.67 with unit-std weights / 256; ours: mean loss, head / 9
    assert config.learning_rate == pytest.approx(0.67 * 2000 * (9 / 256) ** 2, rel=1e-3)
    assert config.learning_rate * config.bias_lr_scale == pytest.approx(0.053 * 2000, rel=2e-3)
    assert config.whitening_bias_lr_scale == config.bias_lr_scale
    assert config.learning_rate * config.weight_decay == pytest.approx(2e-6 * 2000, rel=1e-3)


# 640 synthetic images at batch 64: 10 iterations per epoch, 3 epochs; checkpoints at 12, 24 and 30
MUON_TINY = [
    f"--config={MUON_YAML}",
    *SMALL,
    '--model_kwargs={"widths": [16, 32, 32]}',
    "--batch_size=64",
    "--num_epochs=3",
    "--validate_every=3",
    "--checkpoint_every=12",
    "--tta=0",
]


@pytest.mark.slow  # two processes, a resume
def test_muon_recipe_with_two_processes_resumes_to_the_identical_state(tmp_path):
    """SGD + Muon through idist.auto_optim with 2 gloo processes, bf16, channels_last: resumed at iteration 24, the
    weights, both optimizers' states (Muon's momentum buffers) and the schedule end as in the uninterrupted run."""
    launch = ["--backend=gloo", "--nproc_per_node=2", f"--output_path={tmp_path}"]
    reference = run_in_this_process("run", *MUON_TINY, *launch, "--run_name=ref")
    assert reference.returncode == 0, reference.stderr[-3000:]
    metrics = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    assert metrics["iterations"] == 30 and metrics["test"]["accuracy"] > 0.3  # chance is 0.1
    resumed = run_in_this_process(
        "run",
        *MUON_TINY,
        *launch,
        "--run_name=resumed",
        f"--resume_from={tmp_path / 'ref' / 'training_checkpoint_24.pt'}",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final_a, final_b = (tmp_path / name / "training_checkpoint_30.pt" for name in ("ref", "resumed"))
    assert_same_training_state(final_a, final_b)
    muon_state = torch.load(final_a, weights_only=True)["optimizer"]["muon"]["state"]
    assert len(muon_state) == 6 and all(s["momentum_buffer"].abs().sum() > 0 for s in muon_state.values())
    sgd_checkpoint = run_in_this_process(
        "run", *MUON_TINY, "--muon_lr=None", f"--output_path={tmp_path}", "--run_name=sgd", f"--resume_from={final_a}"
    )
    assert sgd_checkpoint.returncode == 2
    assert re.search(
        r"was trained with other values of keys that shape training \(muon_lr [0-9.e-]+ then, None now\)",
        sgd_checkpoint.stderr,
    ), sgd_checkpoint.stderr[-2000:]


def test_muon_refuses_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "dense.py").write_text(
        "from torch import nn\n\n\ndef net():\n    return nn.Sequential(nn.Flatten(), nn.Linear(3072, 10))\n"
    )
    result = run_in_this_process(
        "run",
        *MUON_TINY,
        f"--model={tmp_path / 'dense.py'}:net",
        "--model_kwargs=None",
        f"--output_path={tmp_path}",
        "--run_name=dense",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: muon_lr=0.24: model={tmp_path / 'dense.py'}:net has no trainable convolution filters for Muon to "
        "train; leave muon_lr unset"
    )
    assert not (tmp_path / "dense").exists() or not any((tmp_path / "dense").glob("training_checkpoint_*.pt"))
    for flag, message in (
        ("--muon_lr=0", "muon_lr=0.0 must be greater than 0 (or None: SGD only)"),
        ("--muon_momentum=1", "muon_momentum=1.0 must be in [0, 1)"),
        ("--muon_ns_steps=0", "muon_ns_steps=0 must be in 1..20"),
    ):
        bad = run_in_this_process("run", f"--config={MUON_YAML}", flag)
        assert (bad.returncode, bad.stderr) == (2, f"error: {message}\n")
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(
        UserError,
        match=r"^\S+fast_muon.yaml line \d+: muon_lr=0.24 needs torch.optim.Muon \(torch 2.9 or newer\), and this "
        r"torch is .*: upgrade torch \(pip install 'torch>=2.9'\) or leave muon_lr "
        r"unset$",
    ):
        preflight.check_before_launch(load_config(MUON_YAML))

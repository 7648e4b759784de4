"""Gradient compression (issue 74): fp16, bf16 and PowerSGD through DDP's communication hooks, recorded in the plan
and provenance; PowerSGD's state (step, P and Q, every rank's error feedback) in the checkpoint, so a resume ends
bit-identical; one line where it cannot work; nothing registered without it."""

from __future__ import annotations

import json

import pytest
import torch

from cifar10_dist.config import load_config
from cifar10_dist.errors import UserError
from tests.conftest import TINY, assert_same_training_state, run_in_process, run_log

SPAWN = ["--backend=gloo", "--nproc_per_node=2"]
RUN = [*TINY, "--checkpoint_every=18", "--powersgd_start_step=4"]  # 36 iterations: checkpoints 18 and 36


@pytest.mark.parametrize("kind, planned", [("bf16", "bf16"), ("powersgd", "powersgd rank 2 from step 4")])
def test_compressed_runs_train_record_it_and_a_powersgd_resume_is_exact(small_dataset, tmp_path, kind, planned):
    common = [*RUN, *SPAWN, f"--grad_compression={kind}", f"--data_path={small_dataset}", f"--output_path={tmp_path}"]
    whole = run_in_process("run", *common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    log = run_log(whole, tmp_path / "whole")
    assert f"grad_compression  {planned}" in log  # the plan's row
    assert json.loads((tmp_path / "whole" / "provenance.json").read_text())["grad_compression"] == planned
    metrics = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] > 0.3  # it learns (chance: 0.1)
    if kind != "powersgd":
        return
    state = torch.load(tmp_path / "whole" / "training_checkpoint_18.pt", weights_only=True)["grad_compression"]
    assert state["iter"] == 18 and all(errors.shape[0] == 2 for errors in state["errors"].values())  # both ranks'
    resumed = run_in_process(
        "run", *common, "--run_name=resumed", f"--resume_from={tmp_path / 'whole' / 'training_checkpoint_18.pt'}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "for PowerSGD's bucket layout" in run_log(resumed, tmp_path / "resumed")
    assert_same_training_state(
        tmp_path / "whole" / "training_checkpoint_36.pt", tmp_path / "resumed" / "training_checkpoint_36.pt"
    )


def test_without_a_process_group_compression_is_refused_in_one_line():
    with pytest.raises(
        UserError,
        match=r"^grad_compression=bf16 compresses the gradients processes exchange, through "
        r"DDP's communication hooks \(backends gloo and nccl\): this run is one "
        r"process without a process group; leave grad_compression=none, or launch",
    ):
        load_config(None, grad_compression="bf16")
    with pytest.raises(UserError, match="backend=xla-tpu has none; leave grad_compression=none"):
        load_config(None, grad_compression="powersgd", backend="xla-tpu", nproc_per_node=8)
    with pytest.raises(UserError, match=r"powersgd_rank=0 must be in 1\.\.64"):
        load_config(None, powersgd_rank=0)


def test_at_world_size_one_compression_says_it_does_nothing(small_dataset, tmp_path):
    result = run_in_process(
        "run",
        *TINY,
        "--num_epochs=1",
        "--num_warmup_epochs=0.5",
        "--backend=gloo",
        "--nproc_per_node=1",
        "--grad_compression=fp16",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=one",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = run_log(result, tmp_path / "one")
    assert "grad_compression=fp16 does nothing at world size 1: there is no exchange of gradients to compress" in log
    assert (
        json.loads((tmp_path / "one" / "provenance.json").read_text())["grad_compression"]
        == "none (fp16 asked: world size 1)"
    )


def test_without_compression_nothing_is_registered_and_nothing_kept():
    from torch import nn

    from cifar10_dist import checkpoint_layout
    from cifar10_dist.training.setup import compression

    model = nn.Linear(2, 2)
    assert compression.attach(model, load_config(None)) is None
    assert checkpoint_layout.COMPRESSION not in checkpoint_layout.training_contents(None, model, None, None)


def test_the_scaling_estimate_counts_the_ring_and_each_compressions_bytes():
    from torch import nn

    from cifar10_dist.system import scaling

    model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 10))  # 131,584 + 5,130 floats
    assert scaling.wire_bytes(model) == 4 * (256 * 512 + 512 + 512 * 10 + 10)
    assert scaling.wire_bytes(model, "bf16") == scaling.wire_bytes(model, "fp16") == scaling.wire_bytes(model) // 2
    # rank 2: P and Q of each matrix (each gains at least torch's min_compression_rate, 2); the biases whole
    assert scaling.wire_bytes(model, "powersgd", rank=2) == 4 * (2 * (512 + 256) + 512 + 2 * (10 + 512) + 10)
    assert scaling.wire_bytes(nn.Linear(8, 4), "powersgd", rank=2) == 4 * (8 * 4 + 4)  # too small to gain: whole
    found = scaling.estimate(0.1, 12_500_000, scaling.link_bytes_per_second("100mbit"), 4, 64)
    exchange = 1.5 / scaling.WIRE_EFFICIENCY + 6 * scaling.LATENCY_SECONDS  # 2 (N-1)/N of 1 s, and 2 (N-1) hops
    assert found.seconds_per_step == pytest.approx(0.1 + exchange - scaling.OVERLAP * 0.1)
    assert found.images_per_second == pytest.approx(4 * 64 / found.seconds_per_step)
    with pytest.raises(ValueError, match="link='fast': give its speed as 100mbit, 1gbit"):
        scaling.link_bytes_per_second("fast")


def test_doctor_estimates_the_probed_model_over_a_link_and_refuses_a_link_it_cannot_read():
    from cifar10_dist import api

    report = api.doctor(model="simple_cnn", batch_size=8, budget_seconds=0.2, link="100mbit")
    assert report.scaling[0].startswith("on a 100mbit link (12.5 MB/s), a step of ")
    assert [line.split(":")[0].strip() for line in report.scaling[1:]] == ["2 nodes", "4 nodes", "8 nodes", "16 nodes"]
    assert "bf16" in report.scaling[1] and "powersgd" in report.scaling[1]
    with pytest.raises(UserError, match="link='10 gigs': give its speed as"):
        api.doctor(model="simple_cnn", batch_size=8, budget_seconds=0.2, link="10 gigs")

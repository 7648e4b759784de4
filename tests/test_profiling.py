"""profile=N: a trace that loads as JSON, a table of real operators, each part's share of the time, and the
same final weights as an unprofiled run."""

from __future__ import annotations

import json

import torch

from cifar10_dist.training.before_training import profiling
from tests.conftest import TINY, assert_same_nested, run_in_this_process

SYNTHETIC = ["--dataset=synthetic", "--synthetic_size=320", *TINY]


def test_a_profiled_run_writes_a_trace_and_the_top_operators_and_ends_with_the_same_weights(tmp_path):
    profiled = run_in_this_process("run", *SYNTHETIC, "--profile=3", f"--output_path={tmp_path}", "--run_name=profiled")
    assert profiled.returncode == 0, profiled.stderr[-2000:]
    plain = run_in_this_process("run", *SYNTHETIC, f"--output_path={tmp_path}", "--run_name=plain")
    assert plain.returncode == 0, plain.stderr[-2000:]
    run_dir = tmp_path / "profiled"
    trace = json.loads((run_dir / "profile" / "rank0.pt.trace.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("convolution" in name for name in names)
    table = (run_dir / "profile" / "top_operators.txt").read_text()
    assert table.startswith("3 training iterations after 5 of warm-up")
    assert "convolution" in table and "Self CPU" in table
    summary = json.loads((run_dir / "summary.json").read_text())["profile"]
    assert summary["iterations_traced"] == 3
    assert {"training step", "data loading", "evaluation"} <= set(summary["shares"])
    assert abs(sum(summary["shares"].values()) - 1) < 1e-3
    log = (run_dir / "run.log").read_text()
    assert "profile: top operators by self time over 3 iterations" in log
    assert "profile: where the run's time went (HandlersTimeProfiler" in log
    [a], [b] = (sorted((tmp_path / name).glob("training_checkpoint_*.pt")) for name in ("profiled", "plain"))
    assert_same_nested(torch.load(a, weights_only=True)["model"], torch.load(b, weights_only=True)["model"], "model")


def test_a_run_shorter_than_the_window_ends_its_trace_at_the_end(tmp_path):
    result = run_in_this_process("run", *SYNTHETIC, "--profile=500", f"--output_path={tmp_path}", "--run_name=short")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "short" / "summary.json").read_text())["profile"]
    assert summary["iterations_traced"] == 20 - profiling.WARMUP  # 320 images, batch 32, 2 epochs: 20 iterations
    assert (tmp_path / "short" / "profile" / "rank0.pt.trace.json").is_file()
    assert (
        "WARNING profile: this launch has 20 training iterations, fewer than 5 of warm-up and the 500 asked: "
        "tracing the last 15 after 5 of warm-up"
    ) in result.stderr


def test_a_launch_shorter_than_the_warm_up_is_traced_whole_and_says_so(tmp_path):
    result = run_in_this_process(
        "run",
        "--dataset=synthetic",
        "--synthetic_size=96",
        *TINY,
        "--num_epochs=1",
        "--num_warmup_epochs=0",
        "--profile=5",
        f"--output_path={tmp_path}",
        "--run_name=tiny",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "tiny" / "summary.json").read_text())["profile"]
    assert (summary["iterations_traced"], summary["warmup_iterations"]) == (3, 0)  # 96 images, batch 32
    trace = json.loads((tmp_path / "tiny" / "profile" / "rank0.pt.trace.json").read_text())
    assert any("convolution" in event.get("name", "") for event in trace["traceEvents"])
    assert (
        "WARNING profile: this launch has 3 training iterations, fewer than 5 of warm-up and the 5 asked: "
        "tracing all 3 with no warm-up"
    ) in result.stderr
    if not torch.cuda.is_available():  # no CUDA activity asked for, and none of its library's errors printed
        assert "gpuGetDeviceCount" not in result.stderr and "ERROR" not in result.stderr


def test_the_shares_name_each_part_and_leave_out_what_took_no_time():
    rows = [
        ["attach_validation.<locals>.maybe_validate", "EPOCH_COMPLETED", 2.0, "", "", "", ""],
        ["RunProfiler._maybe_stop", "ITERATION_COMPLETED", 0.5, "", "", "", ""],
        ["PiecewiseLinear", "ITERATION_STARTED", "not triggered", "", "", "", ""],
        ["Total", "", 2.5, "", "", "", ""],
        ["Processing", "None", 6.0, "", "", "", ""],
        ["Dataflow", "None", 1.5, "", "", "", ""],
    ]
    assert profiling.time_shares(rows) == {
        "training step": 6.0,
        "evaluation": 2.0,
        "data loading": 1.5,
        "profiler": 0.5,
    }

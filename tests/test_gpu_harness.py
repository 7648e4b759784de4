"""The GPU check harness on a machine without a GPU: scripts/gpu_check.sh says so in one line and creates
nothing, the gpu tests skip with that reason, the report writer and the benchmark's peer parsing work."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, cli_env, run_forked

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run scripts/gpu_check.sh")


def test_gpu_check_without_cuda_is_one_line_and_creates_nothing(tmp_path):
    out = tmp_path / "report"
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), f"--out={out}"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no CUDA GPU on this machine (torch ") and result.stdout.count("\n") == 1
    assert result.stdout.endswith("sees none): nothing to check\n") and result.stderr == ""
    assert list(tmp_path.iterdir()) == []


def test_gpu_check_refuses_a_bad_argument(tmp_path):
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--data=x"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "unknown argument '--data=x'" in result.stderr


def test_gpu_tests_skip_saying_why():
    result = run_forked("-m", "gpu", "tests/gpu", "-q", "-rs", "-p", "no:cacheprovider", cwd=REPO, module="pytest")
    assert result.returncode == 0, result.stdout[-2000:]
    outcomes = re.search(r"^(\d+) skipped in [0-9.]+s", result.stdout, re.MULTILINE)  # no other outcome at all
    assert outcomes and int(outcomes.group(1)) >= 10, result.stdout[-500:]
    assert "no CUDA GPU here (torch.cuda.is_available() is False): the gpu checks need one" in result.stdout


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.gpu.test_gpu_paths" name="test_no_backend_run" time="12.5"/>
<testcase classname="tests.gpu.test_gpu_paths" name="test_fp16" time="30.1"><failure message="assert 0.61 &lt; 0.03">
trace</failure></testcase>
<testcase classname="tests.gpu.test_gpu_paths" name="test_two_gpus" time="0.01">
<skipped message="needs 2 GPUs, 1 visible"/></testcase></testsuite></testsuites>"""


def test_the_report_lists_every_check_with_its_outcome_and_figures(tmp_path):
    from benchmarks import gpu_report as report_module

    (tmp_path / "pytest.xml").write_text(JUNIT)
    (tmp_path / "checks.jsonl").write_text(
        json.dumps({"test": "test_no_backend_run", "name": "peak GPU memory allocated", "value": 812.0, "unit": "MiB"})
        + "\n"
    )
    (tmp_path / "benchmark.json").write_text(json.dumps({"table": "H100, torch 2.x\nfull epoch fast.yaml: 9000 img/s"}))
    env = {
        "date": "2026-11-23",
        "gpus": ["NVIDIA H100 80GB HBM3"],
        "driver": "580.1",
        "cuda": "13.0",
        "cudnn": 91000,
        "torch": "2.14.1",
        "python": "3.11.7",
        "host": "node1",
    }
    report = report_module.build(tmp_path, env)
    assert (report["passed"], report["failed"], report["skipped"]) == (1, 1, 1)
    markdown = (tmp_path / "gpu_report.md").read_text()
    assert "NVIDIA H100 80GB HBM3; driver 580.1, CUDA 13.0, cuDNN 91000, torch 2.14.1" in markdown
    assert "| test_no_backend_run | passed | peak GPU memory allocated: 812 MiB |" in markdown
    assert "| test_fp16 | failed (assert 0.61 < 0.03) |  |" in markdown
    assert "| test_two_gpus | skipped (needs 2 GPUs, 1 visible) |  |" in markdown
    assert "full epoch fast.yaml: 9000 img/s" in markdown
    saved = json.loads((tmp_path / "gpu_report.json").read_text())
    assert saved["checks"][0]["figures"][0]["value"] == 812.0 and saved["environment"]["gpus"] == env["gpus"]


PEER_OUTPUT = """---------------------------------------------------------------------------------------------
|  run     |  epoch  |  train_loss  |  train_acc  |  val_acc  |  tta_val_acc  |  total_time_seconds  |
---------------------------------------------------------------------------------------------
|       0  |      0  |      0.0011  |     0.5508  |   0.6038  |               |              0.3790  |
|          |      1  |      0.0007  |     0.7363  |   0.8140  |               |              0.7311  |
|          |      9  |      0.0004  |     0.9238  |   0.9350  |               |              3.6411  |
|          |   eval  |      0.0004  |     0.9238  |   0.9350  |       0.9402  |              3.8299  |
---------------------------------------------------------------------------------------------
"""


def test_the_benchmark_reads_the_peers_table_and_sums_up_seeds_epochs_and_the_gpus_busy_time():
    from benchmarks import gpu as bench
    from benchmarks.peer import parse_peer_table

    peer = parse_peer_table(PEER_OUTPUT)
    assert peer["accuracy"] == 0.9402 and peer["training_seconds"] == 3.6411  # the last epoch row: without TTA
    assert peer["tta_seconds"] == pytest.approx(3.8299 - 3.6411) and peer["accuracy_without_tta"] == 0.935
    assert peer["train_loss"] == 0.0004
    assert peer["curve"] == [(0.379, 0.6038), (0.7311, 0.814), (3.6411, 0.935)]
    # epoch 1 took 0.379 s, epochs 2 and 3 0.3521 and 2.91 s (median 1.631)
    assert bench.epoch_seconds(peer["curve"]) == (0.379, pytest.approx(1.631, abs=1e-4))
    assert bench.epoch_seconds([(2.0, 0.5)]) == (2.0, None) and bench.epoch_seconds([]) == (None, None)
    runs = {
        "ours": {
            "0": {"accuracy": 0.94, "training_seconds": 3.0, "first_epoch_seconds": 0.5, "steady_epoch_seconds": 0.25},
            "1": {"accuracy": 0.92, "training_seconds": 4.0, "first_epoch_seconds": 0.7, "steady_epoch_seconds": 0.35},
            "2": {"failed": "our benchmark run failed (exit 1)"},
        },
        "peer": {"0": {**peer, "first_epoch_seconds": 0.379, "steady_epoch_seconds": 1.631}, "1": "skipped"},
    }
    runs["ours:fast_muon"] = {
        "0": {"accuracy": 0.94, "training_seconds": 1.8, "first_epoch_seconds": 0.2, "steady_epoch_seconds": 0.2}
    }
    summary = bench.summarise(runs)
    assert summary["ours:fast_muon"]["seeds"] == 1
    assert summary["training_seconds_ours_fast_muon_over_peer"] == pytest.approx(1.8 / 3.6411)
    assert summary["ours"]["seeds"] == 2 and summary["ours"]["accuracy"] == pytest.approx(0.93)
    assert summary["training_seconds_ours_over_peer"] == pytest.approx(3.5 / 3.6411)
    assert summary["steady_epoch_seconds_ours_over_peer"] == pytest.approx(0.3 / 1.631)
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 100},
            {"ph": "X", "cat": "kernel", "ts": 10, "dur": 20},
            {"ph": "X", "cat": "kernel", "ts": 20, "dur": 20},  # overlaps the first: 30 in all
            {"ph": "X", "cat": "gpu_memcpy", "ts": 90, "dur": 30},
            {"ph": "i", "cat": "kernel", "ts": 500},
        ]
    }  # an instant: no interval
    assert bench.busy_share(trace) == {"busy_share": 60 / 120, "busy_ms": 0.06, "span_ms": 0.12, "kernels": 2}
    assert bench.busy_share({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1}]}) is None


def test_the_benchmark_refuses_an_unknown_part_in_one_line(monkeypatch):
    from benchmarks import gpu as bench

    monkeypatch.setattr(sys, "argv", ["gpu.py", "--data_path=x", "--device=cpu", "--parts=race,speed"])
    with pytest.raises(SystemExit) as refusal:  # (python -m benchmarks.gpu prints it and exits 1)
        bench.main()
    assert refusal.value.code == (
        "--parts: unknown speed: choose from race, levers, resnet, profile, compile, throughput, accuracy"
    )


def test_the_recipe_benchmark_appends_runs_and_takes_time_ratios_within_one_invocation(tmp_path):
    from benchmarks import recipes, records

    path = tmp_path / "runs.json"

    def run(recipe, invocation, accuracy, seconds, seed=0, **extra):
        records.append_run(
            path,
            {
                "recipe": recipe,
                "seed": seed,
                "invocation": invocation,
                "accuracy": accuracy,
                "training_seconds": seconds,
                "outside": {"evaluation": 10.0, "other": 5.0},
                **extra,
            },
        )

    run("peer", "A", 0.9069, 2700.0)
    run("muon", "A", 0.9080, 1800.0)
    run("fast", "B", 0.9059, 1000.0)  # another invocation: another phase of the machine
    run("fast", "B", 0.9061, 1100.0, seed=1)
    run("muon", "D", 0.9080, 1500.0)  # seed 0 again: its accuracy counts once, its time again
    run("muon", "C", 0.1, 1.0, quick=True)
    run("muon7", "A", 0.9050, 1350.0)
    run("lean_record", "E", 0.8980, 240.0)  # a name wider than the column: the columns widen with it
    runs = json.loads(path.read_text())["runs"]
    assert [r["recipe"] for r in runs] == ["peer", "muon", "fast", "fast", "muon", "muon", "muon7", "lean_record"]
    lines = recipes.table(runs).splitlines()
    assert lines[1].split() == ["peer", "1", "1", "90.69%", "-", "45.0", "15", "-"]
    assert lines[2].split() == ["fast", "2", "2", "90.60%", "0.01%", "17.5", "15", "no"]
    assert lines[3].split() == ["muon", "2", "1", "90.80%", "-", "27.5", "15", "peer"]
    assert lines[4].split() == ["muon7", "1", "1", "90.50%", "-", "22.5", "15", "no"]
    assert lines[5].split() == ["lean_record", "1", "1", "89.80%", "-", "4.0", "15", "no"]
    assert lines[0].index("runs") + 3 == lines[1].index("1") == lines[5].index(" 1") + 1  # the columns line up
    # none across A and B
    assert lines[6:] == ["training-time ratios in invocation A: muon/peer 0.67, muon7/muon 0.75, muon7/peer 0.50"]
    assert recipes.table(runs, quick=True).splitlines()[1].split()[:4] == ["muon", "1", "1", "10.00%"]


def test_the_per_step_benchmark_times_the_peers_network_ours_and_ours_with_the_whitening_bias_frozen(tmp_path):
    """``--per_step`` in its own process (it adapts torch to the peer's code): three networks, each round's
    seconds and their median in the JSON with the command, commit and machine; the table names all three."""
    out = tmp_path / "per_step.json"
    result = run_forked(
        "--per_step",
        "--batch_size=4",
        "--steps=1",
        "--rounds=2",
        f"--per_step_json={out}",
        cwd=REPO,
        module="benchmarks.recipes",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(out.read_text())
    assert measured["command"].endswith(f"--rounds=2 --per_step_json={out}") and measured["commit"]
    assert [row["network"] for row in measured["rows"]] == [
        "peer: airbench make_net94",
        "ours: models.AirbenchNet",
        "ours, whitening bias frozen",
    ]
    assert all(len(row["seconds"]) == 2 and row["median"] > 0 for row in measured["rows"])
    lines = result.stdout.splitlines()
    assert lines[0].startswith("batch 4, 1 steps x 2 interleaved rounds, ") and len(lines) == 5
    assert lines[2].split()[-1] == "1.000" and lines[4].startswith("ours, whitening bias frozen")


@pytest.mark.slow
def test_the_peers_own_code_runs_on_the_cpu_through_the_recipe_benchmark(tmp_path):
    """airbench94's train94 from the installed package, adapted to the CPU in its own process, on our on-disk
    data (1,024 training images: one step of its batch), then its printed table read back."""
    from benchmarks import peer as peer_code
    from tests.conftest import write_dataset

    data_path = write_dataset(tmp_path / "data", 1024, 200)
    peer = peer_code.run_peer(str(data_path), "cpu", seed=0, quick=True)
    assert len(peer["curve"]) == 1 and 0 <= peer["accuracy"] <= 1
    assert math.isfinite(peer["train_loss"])  # autocast around the whitening init made it NaN from the start
    assert peer["training_seconds"] > 0 and peer["tta_seconds"] > 0 and peer["wall_seconds"] > peer["training_seconds"]
    assert torch.nn.Module.half is not None and torch.zeros(1).half().dtype == torch.float16  # this process untouched


STAND_IN_TUTORIAL = '''
from ignite.engine import Engine, Events
from ignite.utils import setup_logger
from torchvision import datasets

config = {"data_path": "cifar10", "output_path": "out", "num_epochs": 5, "validate_every": 3}


def create_supervised_trainer():
    """The tutorial's trainer: its output is {"batch loss": ...} (here 2.0, 3.0, 2.5 in each epoch)."""
    return Engine(lambda engine, batch: {"batch loss": (2.0, 3.0, 2.5)[batch]})


def run():
    """The tutorial's shape: reads CIFAR10 with download=False, logs through Ignite's engine and its log_metrics."""
    train = datasets.CIFAR10(root=config["data_path"], train=True, download=False)
    trainer = create_supervised_trainer()
    trainer.logger = logger = setup_logger(name="CIFAR10-Training")

    def run_validation(engine):
        logger.info(f"\\nEpoch {engine.state.epoch} - Evaluation time (seconds): 0.01 - val metrics:\\n "
                    f"\\tAccuracy: {len(train) / 1000}\\n\\tLoss: 1.0")

    trainer.add_event_handler(Events.EPOCH_COMPLETED(every=config["validate_every"]) | Events.COMPLETED,
                              run_validation)
    trainer.run(range(3), max_epochs=config["num_epochs"])
'''


def test_the_tutorial_benchmark_reads_the_tutorials_log_and_data_despite_checksums(tmp_path):
    """A stand-in with the tutorial's data reading and logging (Ignite's own epoch lines): the benchmark's
    driver gets it past torchvision's md5 checks on our re-encoded data, and reads epochs and accuracy back."""
    from benchmarks import tutorial as bench
    from tests.conftest import write_dataset

    data_path = write_dataset(tmp_path / "data", 200, 10)
    (tmp_path / "tutorial.py").write_text(STAND_IN_TUTORIAL)
    run = bench.run_tutorial(str(tmp_path / "tutorial.py"), str(data_path), tmp_path / "out", num_epochs=5, seed=7)
    assert run["accuracy"] == 0.2 and run["seed"] == 7  # 200 training images read
    assert sorted(run["epoch_seconds"]) == ["1", "2", "3", "4", "5"] and run["training_only_epochs"] == ["1", "2", "4"]
    assert (run["first_loss"], run["first_epoch_max_loss"], run["first_epoch_max_loss_iteration"]) == (2.0, 3.0, 2)
    ours = {
        "entry": "ours",
        "seed": 7,
        "accuracy": 0.5,
        "wall_seconds": 5.0,
        "epoch_seconds": {"1": 1.0, "2": 3.0},
        "training_only_epochs": ["1", "2"],
        "first_epoch_max_loss": 2.5,
    }
    run.update(wall_seconds=10.0, epoch_seconds={"1": 4, "2": 4, "3": 9, "4": 4, "5": 4})
    assert bench.table(bench.summarise([run, ours])).splitlines()[-1] == (
        "ours / tutorial: wall 0.500, training-only epoch 0.500; mean accuracy +30.00 points; ours' lowest seed "
        "+30.00 points from the tutorial's mean"
    )


def small_history(folder: Path, count: int) -> list[str]:
    """A git repository in ``folder`` with ``count`` commits that each change cifar10_dist/; their shas, oldest
    first."""
    folder.mkdir()
    environment = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    environment["GIT_COMMITTER_EMAIL"] = "t@t"

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(folder), *args], env=environment, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    git("init", "-q")
    (folder / "cifar10_dist").mkdir()
    shas = []
    for index in range(count):
        (folder / "cifar10_dist" / "change.txt").write_text(str(index))
        git("add", ".")
        git("commit", "-q", "-m", f"change {index}")
        shas.append(git("rev-parse", "--short", "HEAD"))
    return shas


@pytest.mark.parametrize("first_bad", [6, 1, None])
def test_the_bisect_finds_the_first_commit_below_the_threshold_measuring_each_once(monkeypatch, tmp_path, first_bad):
    """benchmarks.bisect's search over 10 commits of a small repository whose runs score 0.91 before the first bad
    one and 0.90 from it (the runs themselves rehearsed with --device=cpu --quick: the real ones need a GPU). Each
    commit it measures is a worktree of its own; at the end the repository lists none of them and no folder of
    theirs is left."""
    import argparse
    import contextlib
    import tempfile

    from benchmarks import bisect

    repo = tmp_path / "history"
    shas = small_history(repo, 10)
    measured = []

    def run(source, data_path, seed, flags, environment, quick):
        index = shas.index(source.name)
        assert (source / "cifar10_dist" / "change.txt").read_text() == str(index)  # the commit's own files
        measured.append((index, seed))
        return {
            "seed": seed,
            "seconds": 1.0,
            "accuracy": 0.90 if first_bad is not None and index >= first_bad else 0.91,
        }

    monkeypatch.setattr(bisect, "history", lambda bundle: contextlib.nullcontext(repo))
    monkeypatch.setattr(bisect, "run_fast", run)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    args = argparse.Namespace(
        part="bisect",
        device="cpu",
        data_path="d",
        good=shas[0],
        bad=shas[-1],
        seeds=[0, 1],
        threshold=0.9035,
        budget_minutes=5.0,
        history=None,
        json=str(tmp_path / "b.json"),
        quick=True,
    )
    bisect.bisect(args)
    found = json.loads((tmp_path / "b.json").read_text())
    expected = f"first bad commit: {shas[first_bad]}" if first_bad is not None else "the ends do not differ here"
    assert found["conclusion"].startswith(expected), found["conclusion"]
    commits_measured = [index for index, seed in measured if seed == 0]
    assert len(commits_measured) == len(set(commits_measured)) <= 2 + math.ceil(math.log2(10))
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.splitlines()) == 1 and str(repo) in listed  # only the repository's own
    assert list(temporary.iterdir()) == []  # no worktree folder left
    assert [run["seed"] for run in found["runs"]] == [0, 1] * len(commits_measured)

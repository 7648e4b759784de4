"""Real gloo processes: internal spawning, torchrun, and evaluation that is exact at any world size."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.conftest import TINY, run_forked, run_in_this_process, run_torchrun_forked


def final_metrics(stdout: str) -> tuple[float, float, int]:
    match = re.search(r"final test: accuracy ([0-9.]+)(?:, top-5 [0-9.]+)?, loss ([0-9.]+) \((\d+) images\)", stdout)
    assert match, stdout
    return float(match.group(1)), float(match.group(2)), int(match.group(3))


def test_two_spawned_gloo_processes_train_together(spawned_run):
    result, output = spawned_run
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy, _, count = final_metrics(result.stdout)
    assert count == 301 and accuracy > 0.2
    (run_dir,) = output.iterdir()
    assert re.fullmatch(r"simple_cnn_backend-gloo-2_\d{8}-\d{6}", run_dir.name)
    checkpoint = torch.load(sorted(run_dir.glob("training_checkpoint_*.pt"))[-1], weights_only=True)
    assert checkpoint["meta"]["world_size"] == 2
    # 600 images, global batch 32 = 16 per process: 18 iterations per epoch, 2 epochs
    assert checkpoint["trainer"]["iteration"] == 36
    assert "distributed: backend gloo, world size 2" in result.stderr


@pytest.mark.slow
def test_torchrun_with_two_gloo_processes_trains_and_reports_once(small_dataset, tmp_path):
    result = run_torchrun_forked(
        2,
        "run",
        *TINY,
        "--backend=gloo",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=torchrun",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("final test:") == 1  # only rank 0 reports
    assert final_metrics(result.stdout)[2] == 301
    checkpoint = torch.load(tmp_path / "torchrun" / "training_checkpoint_36.pt", weights_only=True)
    assert checkpoint["meta"]["world_size"] == 2


def test_evaluation_is_identical_at_world_sizes_1_2_and_3(spawned_run, small_dataset):
    _, output = spawned_run
    (run_dir,) = output.iterdir()
    checkpoint = run_dir / "training_checkpoint_36.pt"
    launches = {
        1: ["--num_workers=0"],
        2: ["--backend=gloo", "--nproc_per_node=2", "--num_workers=2"],  # DataLoader
        3: ["--backend=gloo", "--nproc_per_node=3", "--num_workers=0"],
    }  # workers: 1 each
    results = {}
    for world_size, launch in launches.items():
        result = run_in_this_process(
            "evaluate",
            f"--checkpoint={checkpoint}",
            f"--data_path={small_dataset}",
            "--json",
            "--batch_size=64",
            *launch,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        results[world_size] = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["num_samples"] for r in results.values()] == [301, 301, 301]
    assert results[1]["accuracy"] == results[2]["accuracy"] == results[3]["accuracy"]
    matrix = results[1]["confusion_matrix"]
    assert matrix == results[2]["confusion_matrix"] == results[3]["confusion_matrix"]
    assert sum(map(sum, matrix)) == 301 and sum(matrix[i][i] for i in range(10)) == round(results[1]["accuracy"] * 301)
    assert results[1]["per_class_accuracy"] == results[2]["per_class_accuracy"] == results[3]["per_class_accuracy"]
    saved = json.loads((run_dir / "confusion_training_checkpoint_36.json").read_text())
    assert saved["confusion_matrix"] == matrix
    assert (run_dir / "confusion_training_checkpoint_36.png").stat().st_size > 10_000
    assert results[2]["loss"] == pytest.approx(results[1]["loss"], abs=1e-5)
    assert results[3]["loss"] == pytest.approx(results[1]["loss"], abs=1e-5)
    # the calibration bins count the same images at every world size; the ECE agrees to float rounding
    assert (
        results[1]["reliability"]["images"]
        == results[2]["reliability"]["images"]
        == results[3]["reliability"]["images"]
    )
    assert results[2]["ece"] == pytest.approx(results[1]["ece"], abs=1e-5)
    assert results[3]["ece"] == pytest.approx(results[1]["ece"], abs=1e-5)


def test_a_user_error_inside_spawned_workers_is_one_line(tmp_path):
    result = run_forked(
        "run",
        *TINY,
        "--backend=gloo",
        "--nproc_per_node=2",
        f"--data_path={tmp_path / 'empty'}",
        f"--output_path={tmp_path / 'out'}",
        "--download=False",
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "error: CIFAR-10 not found: put cifar-10-python.tar.gz" in result.stderr
    assert not (tmp_path / "out").exists()

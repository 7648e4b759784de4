"""Exact resume: interrupted runs end with bit-identical weights, optimizer state and metrics."""

from __future__ import annotations

import json
import shutil
import signal

import pytest

from tests.conftest import (LONG, SPAWN_2, TINY, assert_same_training_state, run_cli, run_in_process, start_cli,
                            stop_all, wait_for_file)

LAUNCH = {1: [], 2: SPAWN_2}
# 600 images, global batch 32: 18 iterations per epoch, 72 in all; checkpoints every 25: 50 and 72 (end) kept
RUN = [*LONG, "--checkpoint_every=25"]
FINAL = "training_checkpoint_72.pt"


@pytest.fixture(params=[1, 2], ids=["1-process", "2-gloo-processes"])
def reference(request, small_dataset):
    """The shared uninterrupted run (conftest.long_reference_run): (world size, data_path, run folder)."""
    world_size = request.param
    name = "long_reference" if world_size == 1 else "long_spawned_reference"
    found = request.getfixturevalue(name)
    return world_size, small_dataset, found if found.is_dir() else found.parent


def test_resume_mid_epoch_ends_with_identical_state_and_metrics(reference, tmp_path):
    world_size, data_path, ref_dir = reference
    checkpoint = ref_dir / "training_checkpoint_50.pt"  # epoch 3, 14 of 18 iterations done
    result = run_in_process("run", *RUN, *LAUNCH[world_size], f"--data_path={data_path}", f"--output_path={tmp_path}",
                            "--run_name=resumed", f"--resume_from={checkpoint}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_training_state(ref_dir / FINAL, tmp_path / "resumed" / FINAL)
    reference_metrics = json.loads((ref_dir / "metrics.json").read_text())
    resumed_metrics = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    assert resumed_metrics["test"] == reference_metrics["test"]
    assert resumed_metrics["train"] == reference_metrics["train"]


def test_preempted_run_resumed_with_auto_matches_the_uninterrupted_run(reference, tmp_path):
    """A stop signal at whatever iteration the run has reached, then the identical command with resume_from=auto.

    One process gets SIGUSR1 (Slurm's usual warning signal); the 2-process run gets SIGTERM on the spawning
    parent only, which passes it on to its workers.
    """
    world_size, data_path, ref_dir = reference
    command = ["run", *RUN, *LAUNCH[world_size], f"--data_path={data_path}", f"--output_path={tmp_path}",
               "--run_name=job", "--resume_from=auto", "--checkpoint_every=3"]
    process = start_cli(*command)
    try:
        wait_for_file(tmp_path / "job", "training_checkpoint_*.pt", process)
        stop_signal = signal.SIGUSR1 if world_size == 1 else signal.SIGTERM
        process.send_signal(stop_signal)
        _, stderr = process.communicate(timeout=120)
    finally:
        stop_all(process)
    assert process.returncode == 75, stderr[-3000:]
    assert f"on {stop_signal.name}: checkpoint written; run the same command with --resume_from=auto" in stderr
    stopped_at = int(stderr.split("stopped at iteration ")[1].split()[0])
    assert (tmp_path / "job" / f"training_checkpoint_{stopped_at}.pt").is_file()
    assert stopped_at < 72

    again = (run_in_process if world_size == 1 else run_cli)(*command)  # the tests read rank 0's log
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"continuing from {tmp_path / 'job' / f'training_checkpoint_{stopped_at}.pt'}" in again.stderr
    assert_same_training_state(ref_dir / "training_checkpoint_72.pt", tmp_path / "job" / "training_checkpoint_72.pt")
    assert json.loads((tmp_path / "job" / "metrics.json").read_text())["test"] == json.loads(
        (ref_dir / "metrics.json").read_text()
    )["test"]


def test_auto_resume_without_checkpoint_starts_fresh_and_after_the_end_only_evaluates(small_dataset, tmp_path):
    command = ["run", *TINY, "--num_epochs=2", f"--data_path={small_dataset}", f"--output_path={tmp_path}",
               "--run_name=auto", "--resume_from=auto"]
    first = run_in_process(*command)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "no checkpoint, starting fresh" in first.stderr
    again = run_in_process(*command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "from the end of training: evaluating only" in again.stderr
    assert "epoch 1/2" not in again.stderr
    assert again.stdout.splitlines()[0] == first.stdout.splitlines()[0]  # the same final test metrics


def test_auto_resume_skips_a_truncated_newest_checkpoint(reference, tmp_path):
    world_size, data_path, ref_dir = reference
    run_dir = tmp_path / "ref"
    shutil.copytree(ref_dir, run_dir)
    newest = run_dir / "training_checkpoint_72.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    runner = run_in_process if world_size == 1 else run_cli  # the test reads rank 0's log
    result = runner("run", *RUN, *LAUNCH[world_size], f"--data_path={data_path}", f"--output_path={tmp_path}",
                    "--run_name=ref", "--resume_from=auto")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipping training_checkpoint_72.pt: checkpoint" in result.stderr
    assert f"continuing from {run_dir / 'training_checkpoint_50.pt'}" in result.stderr
    assert_same_training_state(ref_dir / "training_checkpoint_72.pt", newest)

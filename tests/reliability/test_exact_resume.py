"""Exact resume: interrupted runs end with bit-identical weights, optimizer state and metrics."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal

import pytest

from tests.conftest import (
    LONG,
    SLOWLY,
    SPAWN_2,
    TINY,
    assert_same_training_state,
    run_in_this_process,
    run_log,
    start_forked,
    stop_all,
    wait_for_file,
    write_dataset,
)

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
    result = run_in_this_process(
        "run",
        *RUN,
        *LAUNCH[world_size],
        f"--data_path={data_path}",
        f"--output_path={tmp_path}",
        "--run_name=resumed",
        f"--resume_from={checkpoint}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_training_state(ref_dir / FINAL, tmp_path / "resumed" / FINAL)
    reference_metrics = json.loads((ref_dir / "metrics.json").read_text())
    resumed_metrics = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    assert resumed_metrics["test"] == reference_metrics["test"]
    assert resumed_metrics["train"] == reference_metrics["train"]


@pytest.mark.slow
def test_preempted_run_resumed_with_auto_matches_the_uninterrupted_run(reference, tmp_path, slow_cnn):
    """A stop signal at whatever iteration the run has reached, then the identical command with resume_from=auto.

    One process gets SIGUSR1 (Slurm's usual warning signal); the 2-process run gets SIGTERM on the spawning
    parent only, which passes it on to its workers.
    """
    world_size, data_path, ref_dir = reference
    command = [
        "run",
        *RUN,
        *LAUNCH[world_size],
        f"--model={slow_cnn}",
        f"--data_path={data_path}",
        f"--output_path={tmp_path}",
        "--run_name=job",
        "--resume_from=auto",
        "--checkpoint_every=3",
    ]
    process = start_forked(*command, env=SLOWLY)
    try:
        wait_for_file(tmp_path / "job", "training_checkpoint_*.pt", process)
        stop_signal = signal.SIGUSR1 if world_size == 1 else signal.SIGTERM
        process.send_signal(stop_signal)
        _, stderr = process.communicate(timeout=120)
    finally:
        stop_all(process)
    assert process.returncode == 75, stderr[-3000:]
    assert f"on {stop_signal.name}: checkpoint {tmp_path / 'job'}/training_checkpoint_" in stderr
    assert stderr.strip().splitlines()[-1].endswith(" written; continue with --resume_from=auto --run_name=job")
    stopped_at = int(stderr.split("stopped at iteration ")[1].split()[0])
    assert (tmp_path / "job" / f"training_checkpoint_{stopped_at}.pt").is_file()
    assert stopped_at < 72

    again = run_in_this_process(*command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"continuing from {tmp_path / 'job' / f'training_checkpoint_{stopped_at}.pt'}" in run_log(
        again, tmp_path / "job"
    )
    assert_same_training_state(ref_dir / "training_checkpoint_72.pt", tmp_path / "job" / "training_checkpoint_72.pt")
    assert (
        json.loads((tmp_path / "job" / "metrics.json").read_text())["test"]
        == json.loads((ref_dir / "metrics.json").read_text())["test"]
    )


def test_auto_resume_without_checkpoint_starts_fresh_and_after_the_end_only_evaluates(small_dataset, tmp_path):
    command = [
        "run",
        *TINY,
        "--num_epochs=2",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=auto",
        "--resume_from=auto",
    ]
    first = run_in_this_process(*command)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "no checkpoint, starting fresh" in first.stderr
    again = run_in_this_process(*command)
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
    result = run_in_this_process(
        "run",
        *RUN,
        *LAUNCH[world_size],
        f"--data_path={data_path}",
        f"--output_path={tmp_path}",
        "--run_name=ref",
        "--resume_from=auto",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = run_log(result, run_dir)
    assert "skipping training_checkpoint_72.pt: checkpoint" in log
    assert f"continuing from {run_dir / 'training_checkpoint_50.pt'}" in log
    assert_same_training_state(ref_dir / "training_checkpoint_72.pt", newest)


# A linear model that writes, per rank and training step, a fingerprint of every image it is fed (no crop, no
# flip: the fingerprint of an image is the same in every run)
SEEN_MODEL = """
import os

import torch.distributed as dist
from torch import nn


class Seen(nn.Module):
    def __init__(self):  # (the folder from the environment: a resume keeps the model's keyword arguments)
        super().__init__()
        self.folder, self.net = os.environ["SEEN_FOLDER"], nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))

    def forward(self, images):
        if self.training:
            rank = dist.get_rank() if dist.is_initialized() else 0
            prints = [",".join(f"{value:.4f}" for value in row) for row in images.flatten(1)[:, :12].tolist()]
            with open(f"{self.folder}/rank{rank}.txt", "a") as seen:
                seen.write(" ".join(prints) + "\\n")
        return self.net(images)


def seen():
    return Seen()
"""
# 960 synthetic training images, global batch 96 (48 per process at 2, 32 at 3): 10 steps an epoch either way
SEEN_RUN = [
    "--figures=False",
    "--dataset=synthetic",
    "--synthetic_size=960",
    "--batch_size=96",
    "--num_epochs=2",
    "--num_warmup_epochs=0",
    "--crop_padding=0",
    "--flip=none",
    "--train_eval_size=0",
    "--num_workers=0",
    "--validate_every=2",
    "--learning_rate=0.01",
    "--backend=gloo",
]


def seen_images(folder, steps):
    """Fingerprints of the images the processes trained on at the given steps (1-based, counted in this run)."""
    images = []
    for path in sorted(folder.glob("rank*.txt")):
        lines = path.read_text().splitlines()
        images += [image for step in steps for image in lines[step - 1].split()]
    return images


def run_seen(tmp_path, name, processes, *extra):
    """A run of the Seen model, in this process."""
    folder = tmp_path / f"seen-{name}"
    folder.mkdir()
    os.environ["SEEN_FOLDER"] = str(folder)  # the spawned workers take the launcher's environment
    try:
        return folder, run_in_this_process(
            "run",
            *SEEN_RUN,
            f"--nproc_per_node={processes}",
            f"--output_path={tmp_path}",
            f"--run_name={name}",
            f"--model={tmp_path / 'seen.py'}:seen",
            *extra,
        )
    finally:
        del os.environ["SEEN_FOLDER"]


@pytest.mark.slow
def test_resume_at_another_world_size_sees_each_image_of_the_epoch_once_and_says_so(tmp_path):
    """2 processes to 3 (after step 18 of 20: 8 of epoch 2's 10 steps done) and 3 to 2 (after step 14): epoch 2
    trains on every one of the 960 images exactly once, a warning says so, and summary.json records the change."""
    (tmp_path / "seen.py").write_text(SEEN_MODEL)
    runs = {}
    for name, processes, resume, every in (
        ("two", 2, None, 18),
        ("two-to-three", 3, "two/training_checkpoint_18.pt", 100),
        ("three", 3, None, 14),
        ("three-to-two", 2, "three/training_checkpoint_14.pt", 100),
    ):
        extra = [f"--checkpoint_every={every}"] + ([f"--resume_from={tmp_path / resume}"] if resume else [])
        runs[name] = run_seen(tmp_path, name, processes, *extra)
        assert runs[name][1].returncode == 0, runs[name][1].stderr[-3000:]
    everything = sorted(seen_images(runs["two"][0], range(11, 21)))
    assert len(everything) == len(set(everything)) == 960  # an uninterrupted epoch: every image once
    for first, then, done in (("two", "two-to-three", 18), ("three", "three-to-two", 14)):
        epoch_2 = seen_images(runs[first][0], range(11, done + 1)) + seen_images(runs[then][0], range(1, 21 - done))
        assert sorted(epoch_2) == everything, f"{first} -> {then}: images repeated or skipped"
    logged = run_log(runs["two-to-three"][1], tmp_path / "two-to-three")  # rank 0's log: run.log
    warning = [line for line in logged.splitlines() if "resuming at world size" in line]
    assert len(warning) == 1 and warning[0].endswith(
        "WARNING resuming at world size 3 from a checkpoint written at world size 2 (iteration 18, epoch 2): the rest "
        "of epoch 2 sees exactly the images an uninterrupted run would, each once; augmentation and BatchNorm "
        "statistics are per process, so the result will differ from an uninterrupted run at world size 2"
    ), warning
    summary = json.loads((tmp_path / "three-to-two" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["world_size_changes"] == [
        {"iteration": 14, "checkpoint_world_size": 3, "world_size": 2, "same_images": True}
    ]
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["world_size_changes"] == []


@pytest.mark.slow
def test_a_finished_run_resumed_at_another_world_size_only_evaluates(small_dataset, long_spawned_reference, tmp_path):
    """The 2-process RUN's last checkpoint (72 steps, epochs of 18) resumed with 3 processes, whose pass has 20
    steps of 30 images: it evaluates the model as its own run did and trains nothing (the trainer keeps the
    checkpoint's epochs; counted in 20-step epochs the run looked unfinished, and Ignite trained it anew)."""
    resumed = run_in_this_process(
        "run",
        *RUN,
        "--backend=gloo",
        "--nproc_per_node=3",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=again",
        f"--resume_from={long_spawned_reference}",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged = run_log(resumed, tmp_path / "again")  # rank 0's log: run.log
    assert (
        "INFO resuming at world size 3 a run that finished training at world size 2 (iteration 72, epoch 4): this "
        "run only evaluates" in logged
    ), logged[-3000:]
    assert not list((tmp_path / "again").glob("training_checkpoint_*.pt"))
    ours, theirs = (
        json.loads((run / "metrics.json").read_text()) for run in (tmp_path / "again", long_spawned_reference.parent)
    )
    assert ours["iterations"] == theirs["iterations"] == 72
    assert ours["test"]["accuracy"] == theirs["test"]["accuracy"]
    assert ours["test"]["loss"] == pytest.approx(theirs["test"]["loss"], abs=1e-5)


def test_a_resume_on_changed_images_is_refused_in_one_line_unless_asked_and_then_recorded(tmp_path):
    from tests.test_image_folders import FOLDER_RUN, write_image, write_image_folder

    root = write_image_folder(tmp_path / "data", train=10, test=3)  # 30 training images, 2 steps of 15 an epoch
    command = [
        "run",
        *FOLDER_RUN,
        f"--data_path={root}",
        "--image_size=24",
        "--train_eval_size=0",
        "--checkpoint_every=2",
        f"--output_path={tmp_path}",
        "--run_name=job",
        "--resume_from=auto",
    ]
    first = run_in_this_process(*command)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "job"
    (run_dir / "training_checkpoint_6.pt").unlink()  # as if stopped after iteration 4 of 6
    before = {path.name: path.read_bytes() for path in run_dir.glob("[!.]*") if path.is_file()}  # not the lock
    recorded = json.loads((run_dir / "provenance.json").read_text())["dataset"]
    assert recorded["images"] == {"train": 30, "test": 9}
    for index in range(5):
        write_image(root / "train" / "cat" / f"new{index}.png", (200, 40, 40), (32, 32), 900 + index)

    refused = run_in_this_process(*command)
    assert refused.returncode == 2, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: checkpoint '{run_dir / 'training_checkpoint_4.pt'}' was made with other data: "
        f"sha256 {recorded['sha256'][:12]}... then, "
    )
    assert (
        "now; images then train 30, test 9, now train 35, test 9: resuming would not continue the same run "
        "(another epoch length, another shuffle); resume on the data it was made with, start afresh (another "
        "--run_name, or --overwrite), or give --resume_on_changed_data=True to go on anyway (recorded in "
        "provenance)"
    ) in last
    assert "Traceback" not in refused.stderr
    after = {path.name: path.read_bytes() for path in run_dir.glob("[!.]*") if path.is_file()}
    assert after == before  # nothing written: config, provenance, checkpoints, metrics, log as they were

    going_on = run_in_this_process(*command, "--resume_on_changed_data=True")
    assert going_on.returncode == 0, going_on.stderr[-3000:]
    assert "going on as asked (resume_on_changed_data)" in going_on.stderr
    change = json.loads((run_dir / "provenance.json").read_text())["resumed_on_changed_data"]
    assert change["sha256_then"] == recorded["sha256"] != change["sha256_now"]
    assert (change["images_then"], change["images_now"]) == ({"train": 30, "test": 9}, {"train": 35, "test": 9})
    from cifar10_dist.outputs.provenance import DataChange, Provenance  # read back typed, written back the same

    read = Provenance.from_dict(json.loads((run_dir / "provenance.json").read_text()))
    assert isinstance(read.resumed_on_changed_data, DataChange)
    assert read.resumed_on_changed_data.images_now == {"train": 35, "test": 9}
    assert read.to_dict()["resumed_on_changed_data"] == change


def test_a_resume_on_changed_cifar_files_is_refused_too(long_reference, tmp_path):
    other = write_dataset(tmp_path / "other", 600, 301, seed=1)  # the same shape, other pixels and labels
    checkpoint = long_reference / "training_checkpoint_50.pt"
    result = run_in_this_process(
        "run",
        *RUN,
        f"--data_path={other}",
        f"--output_path={tmp_path}",
        "--run_name=job",
        f"--resume_from={checkpoint}",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert (
        f"error: checkpoint '{checkpoint}' was made with other data: sha256 " in result.stderr.strip().splitlines()[-1]
    )
    assert "images then train 600, test 301, now train 600, test 301" in result.stderr


def test_a_warm_up_is_undone_bit_for_bit_and_counted_apart(
    long_reference, long_spawned_reference, small_dataset, tmp_path
):
    """warm_up_steps=3 (what auto gives on a GPU): 3 steps at the run's learning rate before the timed training,
    then undone, so a 2-process run and a 1-process run resumed mid-epoch (the sampler's position untouched by
    the warm-up's batch) end with the references' weights, optimizer state and position; the seconds are
    recorded apart from the training time."""
    whole = run_in_this_process(
        "run",
        *RUN,
        *SPAWN_2,
        "--warm_up_steps=3",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=whole",
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert_same_training_state(long_spawned_reference, tmp_path / "whole" / FINAL)
    resumed = run_in_this_process(
        "run",
        *RUN,
        "--warm_up_steps=3",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=resumed",
        f"--resume_from={long_reference / 'training_checkpoint_50.pt'}",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training_state(long_reference / FINAL, tmp_path / "resumed" / FINAL)
    log = run_log(resumed, tmp_path / "resumed")
    assert re.search(r"warm-up: 3 training steps on a batch of the real shapes in [0-9.]+ s, then undone", log), log
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    warm_ups = [
        json.loads(line)
        for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
        if '"warm_up"' in line
    ]
    assert [(w["iteration"], w["steps"]) for w in warm_ups] == [(50, 3)]
    assert summary["warm_up_time"] == pytest.approx(warm_ups[0]["seconds"]) and summary["warm_up_time"] > 0
    reference = json.loads((long_reference / "summary.json").read_text())
    assert reference["warm_up_time"] is None  # auto on a CPU: none

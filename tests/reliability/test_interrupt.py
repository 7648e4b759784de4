"""Ctrl-C is an agreed stop: every process saves the current iteration and the run ends with one line and exit
code 130 (a second Ctrl-C ends at once); and a run folder belongs to one run at a time. Real processes, real
signals."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from cifar10_dist import api, load_config
from cifar10_dist.errors import Interrupted
from tests.conftest import (
    LONG,
    SLOWLY,
    TINY,
    assert_same_training_state,
    run_in_this_process,
    run_log,
    start_forked,
    stop_all,
    wait_for_file,
)
from tests.reliability.test_faults import gone, worker_pids

RUN = [*LONG, "--checkpoint_every=2"]  # 72 iterations, a checkpoint every 2
SPAWN = ["--backend=gloo", "--nproc_per_node=2"]
INTERRUPTED = re.compile(
    r"interrupted at epoch (\d+), iteration (\d+): checkpoint (\S+) written; "
    r"continue with --resume_from=auto --run_name=job"
)


def interrupt(data: Path, output: Path, send, *extra: str) -> tuple[int, str, float, list[int], list[int]]:
    """Start a 2-process run (RUN and extra flags; SLOWLY, for a --model=slow_cnn), call send(launcher) after its
    first checkpoint; returns (exit code, stderr, seconds from the signal to the launcher's end, worker pids, the
    processes of its session still there when it ended: its forkserver and resource tracker, where they outlive
    it)."""
    job = start_forked(
        "run", *RUN, *SPAWN, *extra, f"--data_path={data}", f"--output_path={output}", "--run_name=job", env=SLOWLY
    )
    try:
        wait_for_file(output / "job", "training_checkpoint_*.pt", job)
        workers = worker_pids(job.pid)
        sent_at = time.monotonic()
        send(job)
        _, stderr = job.communicate(timeout=120)
        return job.returncode, stderr, time.monotonic() - sent_at, workers, in_session(job.pid)
    finally:
        stop_all(job)


def in_session(session: int) -> list[int]:
    """The processes of a session (its leader's pid), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[3]) == session:  # (state, ppid, pgrp, session, ...)
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_ctrl_c_to_the_whole_group_saves_stops_every_process_and_resumes_exactly(
    small_dataset, tmp_path, slow_cnn, long_spawned_reference
):
    code, stderr, seconds, workers, left = interrupt(
        small_dataset, tmp_path, lambda job: os.killpg(job.pid, signal.SIGINT), f"--model={slow_cnn}"
    )
    print(f"Ctrl-C to exit: {seconds:.2f} s")
    assert code == 130, stderr[-3000:]
    assert left == []  # the launcher ended after every process it started: the workers, forkserver, tracker
    last_line = stderr.strip().splitlines()[-1]
    match = INTERRUPTED.fullmatch(last_line)
    assert match, last_line
    assert Path(match.group(3)) == tmp_path / "job" / f"training_checkpoint_{match.group(2)}.pt"
    assert torch.load(match.group(3), weights_only=True)["trainer"]["iteration"] == int(match.group(2))
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert gone(workers)

    again = run_in_this_process(
        "run",
        *RUN,
        *SPAWN,
        f"--model={slow_cnn}",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=job",
        "--resume_from=auto",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"continuing from {match.group(3)}" in run_log(again, tmp_path / "job")
    assert_same_training_state(long_spawned_reference, tmp_path / "job" / "training_checkpoint_72.pt")


@pytest.mark.slow
@pytest.mark.parametrize("preemption", [signal.SIGTERM, signal.SIGUSR1])
def test_a_preemption_signal_to_the_whole_group_exits_75_and_resumes_exactly(
    small_dataset, tmp_path, slow_cnn, long_spawned_reference, preemption
):
    """As Slurm delivers a preemption to every process of a job: the launcher, its workers and the forkserver they
    came from (which, ended by it, left the launcher reading exit code 255 for every worker: exit 4, a lost
    worker)."""
    code, stderr, _, workers, _ = interrupt(
        small_dataset, tmp_path, lambda job: os.killpg(job.pid, preemption), f"--model={slow_cnn}"
    )
    assert code == 75, stderr[-3000:]
    match = re.fullmatch(
        rf"stopped at iteration (\d+) on {preemption.name}: checkpoint \S+ written; continue with "
        r"--resume_from=auto --run_name=job",
        stderr.strip().splitlines()[-1],
    )
    assert match, stderr[-2000:]
    assert (tmp_path / "job" / f"training_checkpoint_{match.group(1)}.pt").is_file()
    assert "Traceback" not in stderr and gone(workers)
    if preemption == signal.SIGTERM:
        again = run_in_this_process(
            "run",
            *RUN,
            *SPAWN,
            f"--model={slow_cnn}",
            f"--data_path={small_dataset}",
            f"--output_path={tmp_path}",
            "--run_name=job",
            "--resume_from=auto",
        )
        assert again.returncode == 0, again.stderr[-3000:]
        assert_same_training_state(long_spawned_reference, tmp_path / "job" / "training_checkpoint_72.pt")


@pytest.mark.slow
def test_interrupting_the_launcher_alone_as_jupyter_does_stops_the_workers_too(small_dataset, tmp_path, slow_cnn):
    code, stderr, seconds, workers, _ = interrupt(
        small_dataset, tmp_path, lambda job: job.send_signal(signal.SIGINT), f"--model={slow_cnn}"
    )
    assert code == 130, stderr[-3000:]
    assert INTERRUPTED.fullmatch(stderr.strip().splitlines()[-1]), stderr[-1000:]
    assert "Traceback" not in stderr
    assert gone(workers) and seconds < 30


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_stop_ends_every_process_at_once(small_dataset, tmp_path):
    def twice(job):
        job.send_signal(signal.SIGINT)
        # 0.1 s: long enough for the launcher to handle the first (two signals before its handler runs are one
        # for Python), well within the iteration that ends before the workers can stop (width 256: about 0.5 s on
        # the Zen 4 EPYC; at width 128 an iteration there took about 0.1 s and the stop sometimes won the race)
        time.sleep(0.1)
        job.send_signal(signal.SIGINT)

    code, stderr, seconds, workers, _ = interrupt(small_dataset, tmp_path, twice, "--model_kwargs={'width': 256}")
    assert code == 130, stderr[-3000:]
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("interrupted again: every process stopped at once, without a new checkpoint"), last_line
    assert "Traceback" not in stderr, stderr[-3000:]
    assert gone(workers) and seconds < 10


def test_a_ctrl_c_while_a_stopped_run_cleans_up_still_reports_its_checkpoint(monkeypatch):
    """A further Ctrl-C after the workers agreed and stopped, while the launcher tidies up, is not "before the
    run could take it in hand": the run's own line and exit code stay."""
    stopped = (
        "interrupted at epoch 1, iteration 2: checkpoint out/job/training_checkpoint_2.pt written; "
        "continue with --resume_from=auto --run_name=job"
    )

    def train(config):
        try:
            raise Interrupted(stopped, "out/job/training_checkpoint_2.pt")
        finally:
            raise KeyboardInterrupt  # what the signal handler raises in the middle of the clean-up

    monkeypatch.setattr(api, "train", train)
    result = run_in_this_process("run", "--model=simple_cnn")
    assert (result.returncode, result.stderr) == (130, stopped + "\n")


def test_train_in_process_raises_interrupted_with_the_checkpoint_after_the_workers_are_gone(small_dataset, tmp_path):
    config = load_config(
        model="simple_cnn",
        batch_size=32,
        num_workers=0,
        num_epochs=4,
        learning_rate=0.1,
        train_eval_size=100,
        checkpoint_every=2,
        backend="gloo",
        nproc_per_node=2,
        data_path=str(small_dataset),
        output_path=str(tmp_path),
        run_name="job",
    )
    before = signal.getsignal(signal.SIGINT)
    workers: list[int] = []

    def press_ctrl_c() -> None:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "job").glob("training_checkpoint_*.pt")) and time.monotonic() < deadline:
            time.sleep(0.02)
        workers.extend(worker_pids(os.getpid()))
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    with pytest.raises(Interrupted) as interrupted:
        api.train(config)
    assert isinstance(interrupted.value, KeyboardInterrupt) and Path(interrupted.value.checkpoint).is_file()
    assert INTERRUPTED.fullmatch(str(interrupted.value))
    assert interrupted.value._render_traceback_() == [f"Interrupted: {interrupted.value}"]  # one line in Jupyter
    assert signal.getsignal(signal.SIGINT) is before
    assert len(workers) == 2 and gone(workers, within=0.5)  # already gone when train() raised


# ---------------------------------------------------------------- one run per folder


@pytest.mark.slow
def test_a_second_run_on_a_busy_folder_is_refused_naming_the_holder(small_dataset, tmp_path):
    """The second run starts while the first holds the folder (its lock is taken), however slowly either starts."""
    args = [
        "run",
        *TINY,
        "--num_epochs=40",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=job",
    ]
    first = start_forked(*args)
    try:
        wait_for_file(tmp_path / "job", ".run.lock.json", first)
        second = run_in_this_process(*args)  # the holder is another process: this one's pid is not in the lock
        wait_for_file(tmp_path / "job", "metrics.jsonl", first)  # the first run trains on
        first.send_signal(signal.SIGINT)
        _, first_stderr = first.communicate(timeout=120)
    finally:
        stop_all(first)
    assert second.returncode == 2, second.stderr[-1500:]
    assert re.fullmatch(
        rf"error: run folder '{re.escape(str(tmp_path / 'job'))}' is in use by another run \(host \S+, "
        rf"pid {first.pid}, started \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\): wait for it to end, or choose "
        r"another --run_name",
        second.stderr.strip().splitlines()[-1],
    ), second.stderr[-1000:]
    assert first.returncode == 130, first_stderr[-1500:]  # the first run went on undisturbed until its Ctrl-C
    epochs = [
        json.loads(line)["epoch"]
        for line in (tmp_path / "job" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "epoch"
    ]
    assert epochs == list(range(1, len(epochs) + 1))  # one run's rows only


def test_a_finished_folder_is_refused_without_resume_and_moved_aside_with_overwrite(small_dataset, tmp_path):
    args = ["run", *TINY, f"--data_path={small_dataset}", f"--output_path={tmp_path}", "--run_name=job"]
    assert run_in_this_process(*args).returncode == 0
    before = sorted(path.name for path in (tmp_path / "job").iterdir())
    again = run_in_this_process(*args)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: run folder '{tmp_path / 'job'}' already holds a run (1 training checkpoint(s), the newest "
        "training_checkpoint_36.pt, last epoch recorded 2, finished): continue it with --resume_from=auto, choose "
        "another --run_name, or start afresh with --overwrite=True (the old folder is moved aside)"
    )
    assert sorted(path.name for path in (tmp_path / "job").iterdir()) == before  # nothing written

    fresh = run_in_this_process(*args, "--overwrite=True")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    (aside,) = tmp_path.glob("job.replaced-*")
    assert sorted(path.name for path in aside.iterdir()) == before
    lines = (tmp_path / "job" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines if '"event": "epoch"' in line] == [1, 2]

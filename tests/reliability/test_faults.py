"""Killed workers, elastic restarts, dead peers and NaN losses, with real processes and real signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import LONG as LONG_RUN
from tests.conftest import (
    SLOWLY,
    TINY,
    assert_same_training_state,
    run_in_this_process,
    start_forked,
    stop_all,
    wait_for_file,
)

LONG = [*LONG_RUN, "--checkpoint_every=4"]  # 72 iterations


def worker_pids(launcher_pid: int) -> list[int]:
    """Training processes below a launcher (torchrun agent or our spawning parent), deepest first, in the order
    they were started (multiprocessing's resource tracker and the test process's CLI server, which has servers of
    its own below it, are children but not training processes)."""
    pids = [pid for pid in children(launcher_pid) if not helper(pid)]
    grandchildren = [pid for child in pids for pid in worker_pids(child)]
    return grandchildren or pids


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return sorted(map(int, found))


def served_workers(launcher_pid: int) -> list[int]:
    """The training processes that a served torchrun's workers (the stand-in python, tests/served_python) asked
    the test process's CLI server for, in the order they were started: the server's children and its seeded
    servers' (a seeded server's command line names its seed-N socket), but for torchrun itself."""
    from tests import conftest

    assert conftest._cli_server is not None, "no CLI server: torchrun was not served"
    found = []
    for pid in children(conftest._cli_server.process.pid):
        if pid != launcher_pid:
            found += children(pid) if "seed-" in command_line(pid) else [pid]
    return sorted(found)


def helper(pid: int) -> bool:
    """multiprocessing's resource tracker, or this test process's CLI server (by pid: a forkserver forked by a
    served process has the server's command line)."""
    from tests import conftest

    server = conftest._cli_server
    return "resource_tracker" in command_line(pid) or (server is not None and pid == server.process.pid)


def command_line(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_torchrun_restarts_after_a_killed_worker_and_ends_like_an_uninterrupted_run(
    small_dataset, tmp_path, long_spawned_reference, slow_cnn
):
    common = [
        *LONG,
        f"--model={slow_cnn}",
        "--backend=gloo",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
    ]

    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the store shared between torchrun's rendezvous and the
    # workers, restarted gloo workers can read the dead round's addresses and hang (pytorch/pytorch#135712)
    job = start_forked(
        "run",
        *common,
        "--run_name=job",
        "--resume_from=auto",
        "--dist_timeout=60",
        torchrun=["--standalone", "--nproc_per_node=2", "--max-restarts=2"],
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **SLOWLY},
    )
    try:
        wait_for_file(tmp_path / "job", "training_checkpoint_*.pt", job)
        # a served worker's stand-in python, torchrun's child, then ends killed by SIGKILL too
        served = not isinstance(job, subprocess.Popen)
        victim = served_workers(job.pid)[-1] if served else worker_pids(job.pid)[-1]
        os.kill(victim, signal.SIGKILL)
        _, stderr = job.communicate(timeout=240)
    finally:
        stop_all(job)
    assert job.returncode == 0, stderr[-3000:]
    failed = re.search(r"failed \(exitcode: (-?\d+)\) local_rank: ([01])", stderr)
    assert failed, stderr[-3000:]
    # torchrun logs the failure it saw first, to the second, local rank 0 first on a tie: the killed worker, ended by
    # SIGKILL as its stand-in passes it on, or the other one, which found its peer gone at once and ended too
    assert failed.group(1) == "-9" or failed.group(2) == "0", failed.group(0)
    assert "continuing from" in stderr  # the restarted workers resumed instead of starting over
    assert_same_training_state(long_spawned_reference, tmp_path / "job" / "training_checkpoint_72.pt")


def gone(pids: list[int], within: float = 5.0) -> bool:
    """Whether every one of these processes has ended (and been reaped) within a few seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{pid}") for pid in pids):
            return True
        time.sleep(0.1)
    return False


def signal_a_spawned_worker(data: Path, output: Path, timeout: int, worker_signal: signal.Signals):
    """Start a long 2-process spawned run, send worker_signal to local rank 1 after the first checkpoint;
    returns (the launcher after it ended, its stderr, seconds from the signal to its end, the worker pids)."""
    job = start_forked(
        "run",
        *LONG,
        "--num_epochs=30",
        "--backend=gloo",
        "--nproc_per_node=2",
        f"--dist_timeout={timeout}",
        f"--data_path={data}",
        f"--output_path={output}",
        "--run_name=job",
    )
    try:
        wait_for_file(output / "job", "training_checkpoint_*.pt", job)
        workers = worker_pids(job.pid)
        assert len(workers) == 2, workers
        signalled_at = time.monotonic()
        os.kill(workers[-1], worker_signal)
        _, stderr = job.communicate(timeout=timeout + 60)
        return job, stderr, time.monotonic() - signalled_at, workers
    finally:
        stop_all(job)


@pytest.mark.slow
def test_a_killed_spawned_worker_stops_the_others_promptly_with_a_message(small_dataset, tmp_path):
    job, stderr, ended_after, workers = signal_a_spawned_worker(small_dataset, tmp_path, 20, signal.SIGKILL)
    assert ended_after < 10, ended_after  # the survivor is stopped at once, not after dist_timeout
    assert job.returncode == 4
    assert "error: worker process 1 (local rank) was killed by SIGKILL; the others were stopped" in stderr
    assert gone(workers)


def test_a_worker_that_crashes_is_named_and_the_advice_is_to_mend_the_cause_before_resuming(small_dataset, tmp_path):
    """SIGABRT, as a fatal error inside torch or gloo ends a process (PowerSGD's collective mismatch did): a resume
    as it is would meet the same cause, so the line says so instead of advising one."""
    job, stderr, ended_after, workers = signal_a_spawned_worker(small_dataset, tmp_path, 20, signal.SIGABRT)
    assert job.returncode == 4 and ended_after < 10
    assert stderr.strip().splitlines()[-1] == (
        "error: worker process 1 (local rank) crashed with SIGABRT: a fatal error inside torch or a library, which "
        "its own lines above on stderr name (gloo's 'collective mismatch' is a bug, not a fault of the machine); the "
        "others were stopped. A resume would meet the same cause: once it is mended, continue from the last "
        "checkpoint with --resume_from=auto --run_name=job"
    )
    assert gone(workers)


@pytest.mark.slow
def test_a_stopped_peer_is_named_in_one_line_soon_after_dist_timeout(small_dataset, tmp_path):
    """A worker that stops answering (SIGSTOP: alive, silent) - the survivor gives up after dist_timeout, the
    launcher names the silent rank and ends every process, exit 4; the newest checkpoint stays loadable."""
    timeout = 3
    job, stderr, ended_after, workers = signal_a_spawned_worker(small_dataset, tmp_path, timeout, signal.SIGSTOP)
    assert job.returncode == 4, stderr[-3000:]
    assert timeout <= ended_after < timeout + 8, (ended_after, stderr[-1500:])
    last_line = stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"error: rank 1 \(pid {workers[-1]}\) stopped answering: rank 0 waited {timeout} s \(dist_timeout\) for it "
        r"in a collective operation; the others were stopped: rerun with --resume_from=auto --run_name=job to "
        r"continue from the last checkpoint",
        last_line,
    ), last_line
    assert "Traceback" not in stderr, stderr[-3000:]
    assert gone(workers)
    newest = max((tmp_path / "job").glob("training_checkpoint_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    assert torch.load(newest, weights_only=True)["trainer"]["iteration"] >= 4


def test_nan_loss_stops_with_the_iteration_and_keeps_only_finite_checkpoints(small_dataset, tmp_path):
    result = run_in_this_process(
        "run",
        *TINY,
        "--learning_rate=1e30",
        "--checkpoint_every=1",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=nan",
    )
    assert result.returncode == 3, result.stderr[-3000:]
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: training stopped at iteration ")
    assert "the checkpoints on disk are from before it" in last_line
    stopped_at = int(last_line.split("iteration ")[1].split()[0])
    checkpoints = sorted((tmp_path / "nan").glob("training_checkpoint_*.pt"))
    assert checkpoints, "the last good checkpoint must be kept"
    for path in checkpoints:
        assert int(path.stem.rsplit("_", 1)[1]) < stopped_at
        weights = torch.load(path, weights_only=True)["model"]
        assert all(torch.isfinite(value).all() for value in weights.values() if value.is_floating_point())


def test_the_preemption_signal_is_configurable(small_dataset, tmp_path, slow_cnn):
    """A cluster that announces preemption with SIGUSR2: CIFAR10_DIST_PREEMPTION_SIGNALS=SIGUSR2 makes it a stop at
    a checkpoint with exit code 75, as SIGTERM is by default."""
    process = start_forked(
        "run",
        *TINY,
        f"--model={slow_cnn}",
        "--num_epochs=6",
        "--checkpoint_every=5",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=usr2",
        env={"CIFAR10_DIST_PREEMPTION_SIGNALS": "SIGUSR2", **SLOWLY},
    )
    try:
        wait_for_file(tmp_path / "usr2", "training_checkpoint_*.pt", process)
        process.send_signal(signal.SIGUSR2)  # without the variable, SIGUSR2 would end the process at once
        _, stderr = process.communicate(timeout=60)
    finally:
        stop_all(process)
    assert process.returncode == 75, stderr[-2000:]
    assert re.search(r"stopped at iteration \d+ on SIGUSR2: checkpoint \S+ written", stderr), stderr[-2000:]


def test_a_bad_preemption_signal_name_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("CIFAR10_DIST_PREEMPTION_SIGNALS", "SIGTERM,SIGKIL")
    result = run_in_this_process("run", *TINY, "--dataset=synthetic", f"--output_path={tmp_path}")
    assert result.returncode == 2
    assert result.stderr == (
        "error: CIFAR10_DIST_PREEMPTION_SIGNALS='SIGTERM,SIGKIL': SIGKIL cannot announce a "
        "preemption; give signal names such as SIGTERM, SIGUSR1, SIGUSR2, SIGHUP "
        "(comma-separated)\n"
    )
    assert not any(tmp_path.iterdir())

"""A run whose outputs cannot be written (the disk fills up, the folder turns read-only) ends with one line naming
the file, the folder and the space left, exit code 2, every earlier checkpoint intact and no temporary file;
after space is freed, --resume_from=auto continues exactly. On a real small filesystem (a tmpfs mounted by
the test; skipped where this process may not mount one)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    LONG,
    SLOWLY,
    assert_same_training_state,
    run_in_this_process,
    start_forked,
    stop_all,
    wait_for_file,
)

RUN = [*LONG, "--checkpoint_every=4"]  # 72 iterations, a checkpoint every 4
FINAL = "training_checkpoint_72.pt"


@pytest.fixture
def small_filesystem(tmp_path):
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@pytest.fixture
def reference(long_reference) -> Path:
    return long_reference / FINAL  # the same training, uninterrupted (conftest)


def fill(folder: Path) -> Path:
    """Write zeros into folder until its filesystem is full; returns the filler file."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as stream:
        chunk = bytes(1 << 20)
        try:
            while True:
                stream.write(chunk)
        except OSError:
            pass
    return filler


def interrupt_by_output_fault(
    small_dataset: Path, output: Path, slow_cnn: str, break_filesystem
) -> tuple[list[str], str]:
    """Start the run (SLOWLY), break its filesystem after the first checkpoint, return (command, stderr)."""
    command = [
        "run",
        *RUN,
        f"--model={slow_cnn}",
        f"--data_path={small_dataset}",
        f"--output_path={output}",
        "--run_name=job",
        "--resume_from=auto",
    ]
    process = start_forked(*command, env=SLOWLY)
    try:
        wait_for_file(output / "job", "training_checkpoint_*.pt", process)
        break_filesystem()
        _, stderr = process.communicate(timeout=120)
    finally:
        stop_all(process)
    assert process.returncode == 2, stderr[-3000:]
    return command, stderr


def assert_run_folder_is_clean(run_dir: Path) -> None:
    """No temporary files, every checkpoint loads with its keys, metrics.jsonl has whole lines only."""
    names = sorted(path.name for path in run_dir.iterdir() if path.name not in (".run.lock", ".run.lock.json"))
    assert not [name for name in names if name.startswith((".", "tmp")) or ".tmp" in name], names
    checkpoints = sorted(run_dir.glob("training_checkpoint_*.pt"))
    assert checkpoints
    for path in checkpoints:
        state = torch.load(path, weights_only=True)
        assert {"trainer", "model", "optimizer", "lr_scheduler"} <= state.keys()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []:
        json.loads(line)


def test_a_full_disk_ends_the_run_with_one_line_and_resume_continues_exactly(
    small_dataset, small_filesystem, reference, slow_cnn
):
    fillers = []
    command, stderr = interrupt_by_output_fault(
        small_dataset, small_filesystem, slow_cnn, lambda: fillers.append(fill(small_filesystem))
    )
    run_dir = small_filesystem / "job"
    last_line = stderr.strip().splitlines()[-1]
    pattern = (
        rf"error: cannot write (\S+) in {re.escape(str(run_dir))}: No space left on device "
        r"\((\d+ bytes|[0-9.]+ KiB) free there\); the files written before it are intact: free space there "
        r"\(or make it writable\) and continue with --resume_from=auto --run_name=job"
    )
    assert re.fullmatch(pattern, last_line), last_line
    assert "Traceback" not in stderr, stderr[-4000:]
    assert_run_folder_is_clean(run_dir)

    fillers[0].unlink()
    again = run_in_this_process(*command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "continuing from" in again.stderr
    assert_same_training_state(reference, run_dir / FINAL)


@pytest.mark.slow
def test_a_folder_turned_read_only_ends_the_run_the_same_way(small_dataset, small_filesystem, reference, slow_cnn):
    """The run folder becomes read-only under the running process: a read-only bind mount over it (a remount of
    the whole filesystem is refused while the run holds files open, its lock among them)."""
    run_dir = small_filesystem / "job"

    def make_read_only() -> None:
        subprocess.run(["mount", "--bind", str(run_dir), str(run_dir)], check=True)
        for attempt in range(50):  # the kernel refuses (busy) while the run has a file open for writing through
            remounted = subprocess.run(
                ["mount", "-o", "remount,bind,ro", str(run_dir)],  # the new mount: a
                capture_output=True,
                text=True,
            )  # checkpoint being written; it soon is not
            if remounted.returncode == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"could not make {run_dir} read-only: {remounted.stderr}")

    command, stderr = interrupt_by_output_fault(small_dataset, small_filesystem, slow_cnn, make_read_only)
    last_line = stderr.strip().splitlines()[-1]
    assert re.match(rf"error: cannot write \S+ in {re.escape(str(run_dir))}: Read-only file system", last_line), (
        last_line
    )
    assert "Traceback" not in stderr, stderr[-4000:]
    assert_run_folder_is_clean(run_dir)

    subprocess.run(["umount", str(run_dir)], check=True)
    again = run_in_this_process(*command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_same_training_state(reference, run_dir / FINAL)

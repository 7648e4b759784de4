"""What a benchmark records next to its figures: the machine, this checkout's commit, and the JSON files
(written whole, or appended to run by run), always atomically."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from cifar10_dist.outputs import files
from cifar10_dist.system import hardware

REPO = Path(__file__).resolve().parents[1]


def machine(device: str | None = None) -> str:
    """The machine in a few words: the GPU, or the CPU with its kernels and native bf16, and torch's threads."""
    chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return f"{hardware.one_line(chosen)}, {torch.get_num_threads()} threads"


def hardware_record(device: str = "cpu") -> dict[str, Any]:
    """The CPU (model, kernels, native bf16) and GPUs of this machine, as run folders record them."""
    return hardware.describe(torch.device(device))


def commit() -> str:
    """This checkout's commit (with + when it has changes), so runs of different code stay apart; on a machine
    that got a copy of the working tree (a GPU lease's), the commit it was copied at, given as
    CIFAR10_DIST_COMMIT (the copy's own .git may be older than its files)."""
    if os.environ.get("CIFAR10_DIST_COMMIT"):
        return os.environ["CIFAR10_DIST_COMMIT"]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    )
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def command() -> str:
    """The command line that runs this benchmark (``python -m benchmarks.NAME ARGS``)."""
    module = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "?"
    return shlex.join(["python", "-m", f"benchmarks.{module}", *sys.argv[1:]])


def write(path: str | Path, record: dict[str, Any]) -> None:
    """A benchmark's JSON file, written whole, with the command, the commit and the machine (the CPU's kind: its
    kernels and native bf16) beside its figures, where the record does not name them itself."""
    files.write_json(
        Path(path),
        {"command": command(), "commit": commit(), "machine": machine(), "hardware": hardware_record(), **record},
    )


def append_run(path: str | Path, run: dict[str, Any]) -> None:
    """One more run in the JSON file ``{"runs": [...]}`` (created when missing): each run is kept the moment it
    ends, so a table can be built from runs made in several invocations."""
    path = Path(path)
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    write(path, {"runs": [*runs, run]})

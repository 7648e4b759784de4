"""Shared helpers: tiny synthetic CIFAR-format datasets on disk and running the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A run of seconds: simple_cnn on a few hundred synthetic images, no DataLoader workers.
TINY = [
    "--model=simple_cnn",
    "--batch_size=32",
    "--num_workers=0",
    "--num_epochs=2",
    "--num_warmup_epochs=1",
    "--learning_rate=0.1",
    "--train_eval_size=100",
    "--log_every_iters=5",
]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CIFAR10_DIST_DEBUG", None)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None):
    """``python -m cifar10_dist ARGS`` as a user would run it; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "cifar10_dist", *args],
        cwd=cwd,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_torchrun(nproc: int, *args: str, cwd: Path | None = None, timeout: float = 300):
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--standalone", "-m", "cifar10_dist", *args]
    return subprocess.run(command, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout)


def write_dataset(root: Path, num_train: int, num_test: int, seed: int = 0) -> Path:
    """A synthetic CIFAR-10 in the standard on-disk layout under root; returns root (the data_path)."""
    from cifar10_dist import data

    train, test = data.make_synthetic(num_train, num_test, seed)
    data.write_cifar10(root / data.FOLDER, train, test)
    return root


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    """600 training and 1,001 test images on disk (1,001: not divisible by 2 or 3)."""
    return write_dataset(tmp_path_factory.mktemp("cifar"), 600, 1001)

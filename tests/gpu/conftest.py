"""The GPU checks (``pytest -m gpu tests/gpu``, or ``bash scripts/gpu_check.sh`` with a report): they run where
torch sees a CUDA GPU and skip elsewhere, saying why. GPU_CHECK_DEVICE=cpu rehearses the device-independent
checks on the CPU (the CUDA-only ones still skip), which is how the harness itself is tested without a GPU.

Each check may record a figure (img/s, accuracy, MiB) with ``record``: lines of JSON in
$GPU_CHECK_OUT/checks.jsonl, which benchmarks.gpu_report puts next to the check in gpu_report.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.conftest import write_dataset

ON_CUDA = torch.cuda.is_available()
REHEARSAL = not ON_CUDA and os.environ.get("GPU_CHECK_DEVICE") == "cpu"
NO_GPU = "no CUDA GPU here (torch.cuda.is_available() is False): the gpu checks need one"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace(os.sep, "/") and not ON_CUDA and not REHEARSAL:
            item.add_marker(pytest.mark.skip(reason=NO_GPU))


def cuda_only() -> None:
    """Skip a check that means nothing off CUDA (nccl, GradScaler, pinned memory, TF32, GPU memory)."""
    if not ON_CUDA:
        pytest.skip("CUDA only (rehearsal on the CPU)")


def gpus(count: int) -> None:
    if torch.cuda.device_count() < count:
        pytest.skip(f"needs {count} GPUs, {torch.cuda.device_count()} visible")


@pytest.fixture
def record(request):
    """record(name, value, unit): a figure of this check for the report."""
    out = os.environ.get("GPU_CHECK_OUT")

    def write(name: str, value: float, unit: str = "") -> None:
        print(f"figure {name}: {value} {unit}")
        if out:
            with open(Path(out) / "checks.jsonl", "a") as figures:
                figures.write(
                    json.dumps({"test": request.node.name, "name": name, "value": value, "unit": unit}) + "\n"
                )

    return write


@pytest.fixture(scope="session")
def check_data(tmp_path_factory) -> Path:
    """Real CIFAR-10 when GPU_CHECK_DATA names a folder holding cifar-10-batches-py, else synthetic images."""
    given = os.environ.get("GPU_CHECK_DATA")
    if given:
        return Path(given)
    return write_dataset(tmp_path_factory.mktemp("cifar"), 2000, 1001)


def is_real(data: Path) -> bool:
    return os.environ.get("GPU_CHECK_DATA") == str(data)

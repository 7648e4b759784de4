"""What produced a run: package version and git commit, library versions, backend, devices, dataset checksum.

Recorded in every run folder (provenance.json) and in every checkpoint (under ``meta``); ``evaluate`` compares
a checkpoint's record with the present package and data and warns when they differ.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any, Mapping

import ignite
import ignite.distributed as idist
import torch

from cifar10_dist.system import hardware

PACKAGE = "cifar10-dist"


def collect(dataset: str, dataset_sha256: str | None, device: torch.device, precision: str) -> dict[str, Any]:
    """The record for this run; every process must call it (device names are gathered from all ranks).
    ``precision`` is what training computes in (fp32, bf16, fp16), ``hardware`` this process's CPU and GPUs."""
    return {
        "package": {"name": PACKAGE, "version": package_version(), **git_state()},
        "versions": {
            "python": platform.python_version(),
            "torch": str(torch.__version__),
            "torchvision": _installed_version("torchvision"),  # without importing it (a second at every start)
            "pytorch-ignite": ignite.__version__,
        },
        "backend": idist.backend(),
        "world_size": idist.get_world_size(),
        "devices": device_names(device),
        "precision": precision,
        "hardware": hardware.describe(device),
        "dataset": {"name": dataset, "sha256": dataset_sha256},
    }


def describe(record: Mapping[str, Any]) -> str:
    """One log line: package version, git state and data checksum."""
    package = record["package"]
    git = "no git"
    if package["git_commit"]:
        git = f"git {package['git_commit'][:10]}" + (" (dirty)" if package["git_dirty"] else "")
    return f"{package['name']} {package['version']}, {git}, data sha256 {record['dataset']['sha256']}"


def package_version() -> str:
    return _installed_version(PACKAGE)


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def git_state() -> dict[str, Any]:
    """Commit of the git checkout holding this package and whether tracked files differ from it (None outside git)."""
    folder = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


def device_names(device: torch.device) -> dict[str, int]:
    """How many processes ran on each kind of device, e.g. {"NVIDIA A100-SXM4-40GB": 8}."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        name = f"cpu: {hardware.cpu_model()}"
    else:
        name = str(device.type)
    names = idist.all_gather(name) if idist.get_world_size() > 1 else [name]
    return {each: names.count(each) for each in sorted(set(names))}


def dataset_sha256(*tensors: Any) -> str:
    """SHA-256 of the tensors as loaded (a run's train images and labels, then its test images and labels):
    equal data, equal checksum, any source; images read on demand (``chunks``) are hashed a chunk at a time."""
    digest = hashlib.sha256()
    for tensor in tensors:
        for chunk in tensor.chunks() if hasattr(tensor, "chunks") else (tensor,):
            digest.update(chunk.contiguous().numpy())
    return digest.hexdigest()


def differences(recorded: Mapping[str, Any], present: Mapping[str, Any]) -> list[str]:
    """What differs between a checkpoint's record and the present run: package version, dataset checksum."""
    found = []
    then, now = recorded.get("package", {}).get("version"), present["package"]["version"]
    if then is not None and then != now:
        found.append(f"it was made with {PACKAGE} {then}, this is {now}")
    then, now = recorded.get("dataset", {}).get("sha256"), present["dataset"]["sha256"]
    if then is not None and now is not None and then != now:
        found.append(f"it was made with other data (sha256 {then[:12]}..., this data {now[:12]}...)")
    return found

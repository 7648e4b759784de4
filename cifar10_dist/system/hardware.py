"""What this machine is: the CPU (model, vector capability, native bf16 kernels), its GPUs and the distributed
backends torch offers; the facts behind the automatic precision choice, ``doctor`` and provenance.

Native bf16 on a CPU means AMX (Sapphire Rapids and newer Xeons) or AVX512-BF16 (Cooper Lake, AMD Zen 4 and
newer): oneDNN then runs bf16 matmuls and convolutions faster than fp32. Without them (AVX2, plain AVX512) bf16
autocast is emulated and much slower: 15x for an airbench training step on a 2-core AVX2-only AMD EPYC (issue 29).
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from cifar10_dist.errors import UserError


@dataclass(frozen=True)
class CpuInfo:
    model: str  # e.g. "AMD EPYC" or "Intel(R) Xeon(R) Platinum 8488C"
    capability: str  # what torch's kernels use: DEFAULT, AVX2, AVX512 (torch.backends.cpu.get_cpu_capability)
    amx_bf16: bool
    avx512_bf16: bool
    logical_cores: int  # usable by this process (its affinity)
    torch_threads: int
    family: str = ""  # /proc/cpuinfo's "cpu family" and "model", e.g. "26/2" (AMD Zen 5): "AMD EPYC" names many kinds

    @property
    def native_bf16(self) -> bool:
        return self.amx_bf16 or self.avx512_bf16

    def describe(self) -> str:
        """e.g. "AMD EPYC, AVX2, no native bf16" or "Intel Xeon ..., AVX512, native bf16 (AMX)"."""
        kinds = [name for name, present in (("AMX", self.amx_bf16), ("AVX512-BF16", self.avx512_bf16)) if present]
        bf16 = f"native bf16 ({', '.join(kinds)})" if kinds else "no native bf16"
        return f"{self.model}, {self.capability}, {bf16}"


@dataclass(frozen=True)
class GpuInfo:
    name: str
    memory_gib: float
    compute_capability: str  # e.g. "9.0"
    bf16: bool


def cpu_info() -> CpuInfo:
    """This CPU, from torch (2.7+: torch.cpu.get_capabilities) or else /proc/cpuinfo's flags."""
    flags = _cpu_flags()
    return CpuInfo(
        model=cpu_model(),
        capability=torch.backends.cpu.get_cpu_capability(),
        amx_bf16="amx_bf16" in flags,
        avx512_bf16="avx512_bf16" in flags,
        logical_cores=usable_cores(),
        torch_threads=torch.get_num_threads(),
        family=cpu_family(),
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpu_flags() -> set[str]:
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is not None:
        return {name for name, value in get_capabilities().items() if value is True}
    for line in _cpuinfo_lines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpuinfo_lines() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_model() -> str:
    for line in _cpuinfo_lines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_family() -> str:
    """ "FAMILY/MODEL" from /proc/cpuinfo (e.g. "25/17" AMD Zen 4, "26/2" Zen 5), "" where it is not given."""
    fields = {}
    for line in _cpuinfo_lines():
        key, _, value = line.partition(":")
        if key.strip() in ("cpu family", "model") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
        if not line.strip() and fields:
            break
    return f"{fields['cpu family']}/{fields['model']}" if len(fields) == 2 else ""


def native_bf16_cpu() -> bool:
    """Whether this CPU has bf16 kernels that beat fp32 (AMX or AVX512-BF16)."""
    return cpu_info().native_bf16


def gpus() -> list[GpuInfo]:
    """The CUDA GPUs this process sees (none without CUDA)."""
    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        found.append(
            GpuInfo(
                properties.name,
                round(properties.total_memory / 2**30, 1),
                f"{properties.major}.{properties.minor}",
                properties.major >= 8,
            )
        )
    return found


def nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def backends() -> dict[str, bool]:
    """Which distributed backends this installation offers."""
    distributed = torch.distributed
    available = distributed.is_available()
    return {
        "gloo": available and distributed.is_gloo_available(),
        "nccl": available and distributed.is_nccl_available() and torch.cuda.is_available(),
        "mpi": available and distributed.is_mpi_available(),
        "xla": importlib.util.find_spec("torch_xla") is not None,
    }


def describe(device: torch.device) -> dict[str, Any]:
    """The record of the hardware a run used (provenance.json, summary.json, benchmark JSON)."""
    info = cpu_info()
    record: dict[str, Any] = {"cpu": {**asdict(info), "native_bf16": info.native_bf16}}
    if device.type == "cuda":
        record["gpus"] = [asdict(gpu) for gpu in gpus()]
    return record


def one_line(device: torch.device | None = None) -> str:
    """The machine in a few words, for logs and benchmark tables: the GPU when training on one, else the CPU."""
    if device is not None and device.type == "cuda":
        found = gpus()
        if found:
            return f"{len(found)}x {found[0].name} (compute capability {found[0].compute_capability})"
    info = cpu_info()
    return f"{info.logical_cores}-core {info.describe()}"


def usable_device(name: str) -> torch.device:
    """``name`` (cpu, cuda, cuda:1, mps, ...) as a device this machine has; a one-line UserError naming the value
    and the devices that exist here otherwise (no traceback from deep inside torch)."""
    cuda = [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    mps = ["mps"] if torch.backends.mps.is_available() else []
    here = ", ".join(["cpu", *cuda, *mps])
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"device={name!r} is not a device name: give one of {here}") from None
    if (
        device.type == "cpu"
        or (device.type == "mps" and mps)
        or (device.type == "cuda" and cuda and (device.index is None or f"cuda:{device.index}" in cuda))
    ):
        return device
    seen = (
        f"it has {len(cuda)} CUDA GPU{'s' if len(cuda) != 1 else ''}"
        if device.type == "cuda" and cuda
        else f"torch {torch.__version__} sees no {device.type} device here"
    )
    raise UserError(f"device={name!r} is not on this machine ({seen}): give one of {here}")

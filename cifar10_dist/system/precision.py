"""The numeric precision of a run on its device: fp32, or bf16/fp16 autocast (fp16 with a GradScaler), chosen
explicitly or by what the hardware runs fast (``with_amp=auto``), with the reason and any warning for the log."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from cifar10_dist.system import hardware


@dataclass(frozen=True)
class Precision:
    """Autocast settings for one device: ``dtype`` None means full fp32. ``reason`` says why it was chosen and
    ``warning`` what an explicit choice will cost on this hardware (both for the run's log)."""

    device_type: str
    dtype: torch.dtype | None
    reason: str = field(default="", compare=False)
    warning: str | None = field(default=None, compare=False)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    @property
    def name(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, str(self.dtype))

    @property
    def needs_grad_scaler(self) -> bool:
        return self.dtype == torch.float16

    def autocast(self) -> contextlib.AbstractContextManager:
        """torch.autocast for this type, or a null context in fp32 (a disabled autocast costs microseconds)."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def choose_precision(device: torch.device, with_amp: bool | str, amp_dtype: str = "auto") -> Precision:
    """``with_amp``: False fp32; True fp16 + GradScaler on CUDA, bf16 elsewhere (``amp_dtype`` float16 or bfloat16
    chooses; fp16 always with a GradScaler); "auto" what the hardware runs fast (``automatic_precision``)."""
    if with_amp == "auto":
        return automatic_precision(device)
    if not with_amp:
        return Precision(device.type, None, "fp32 (with_amp=False)")
    if amp_dtype != "auto":
        dtype = getattr(torch, amp_dtype)
    else:
        dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    chosen = Precision(device.type, dtype)
    reason = f"{chosen.name} autocast (with_amp=True)" + (" with a GradScaler" if chosen.needs_grad_scaler else "")
    warning = None
    cpu = hardware.cpu_info() if device.type == "cpu" and dtype == torch.bfloat16 else None
    if cpu is not None and not cpu.native_bf16:
        warning = (
            f"with_amp=True on a CPU without native bf16 ({cpu.describe()}): bf16 autocast is "
            "emulated here, typically 5-15x slower than fp32 (measured on an AVX2 AMD EPYC: 15x for airbench, "
            "5.6x for ResNet-18); --with_amp=auto trains in fp32 on this CPU"
        )
    return Precision(device.type, dtype, reason, warning)


def automatic_precision(device: torch.device) -> Precision:
    """What this device runs fast: bf16 on GPUs with bf16 tensor cores (compute capability 8.0+: as fast as fp16,
    and no GradScaler, whose overflow check reads the GPU at every step), fp16 + GradScaler on older GPUs, bf16 on
    XLA, bf16 on CPUs with AMX or AVX512-BF16 kernels, fp32 on other CPUs (bf16 is emulated there)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return Precision(
                "cuda",
                torch.bfloat16,
                f"bf16 autocast (with_amp=auto: compute capability {major}.{minor} has bf16 tensor cores)",
            )
        return Precision(
            "cuda",
            torch.float16,
            f"fp16 autocast with a GradScaler (with_amp=auto: compute capability {major}.{minor} has no bf16)",
        )
    if device.type == "xla":
        return Precision("xla", torch.bfloat16, "bf16 autocast (with_amp=auto on XLA)")
    if device.type == "cpu":
        info = hardware.cpu_info()
        if info.native_bf16:
            return Precision("cpu", torch.bfloat16, f"bf16 autocast (with_amp=auto: {info.describe()})")
        return Precision(
            "cpu",
            None,
            f"fp32 (with_amp=auto: {info.describe()}; bf16 autocast would be emulated here, many times slower)",
        )
    return Precision(device.type, None, f"fp32 (with_amp=auto: no mixed precision chosen for {device.type})")


def make_grad_scaler(precision: Precision) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(precision.device_type) if precision.needs_grad_scaler else None

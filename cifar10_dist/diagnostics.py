"""The machine report behind ``doctor``: what this machine is and what will be fast on it: versions, the CPU and
its bf16, GPUs, backends, and a measured probe (a few training steps of a model in each precision and memory
format), with what ``with_amp=auto`` picks here and why.

The probe times whole training steps (forward, backward, SGD step) on random images after one warm-up step of
each setting; a setting whose warm-up step alone takes most of its time budget (bf16 emulated on an AVX2 CPU) is
timed on that one step and marked so. It agrees with ``python -m benchmarks.throughput --variants`` at the same model and
batch (docs/recipes.md has both on one machine).
"""

from __future__ import annotations

import importlib.metadata
import platform
import time
from dataclasses import asdict
from typing import Any, Callable

import torch
from torch import nn

from cifar10_dist import engines, hardware, models
from cifar10_dist.results import DoctorReport, ProbeResult

WARM_UP_ONLY_SHARE = 0.5  # a warm-up step over this share of a setting's budget is its only measurement


def examine(model: str = "airbench", batch_size: int = 32, budget_seconds: float = 2.0) -> DoctorReport:
    """The whole report; the probe gives each setting about ``budget_seconds``."""
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    probes = probe(model, batch_size, device, budget_seconds)
    auto = engines.automatic_precision(device)
    return DoctorReport(
        versions=versions(), cpu=hardware.describe(torch.device("cpu"))["cpu"],
        gpus=[asdict(gpu) for gpu in hardware.gpus()], nccl=hardware.nccl_version(), backends=hardware.backends(),
        device=device.type, auto_precision=auto.reason, probe_model=model, probe_batch_size=batch_size,
        probes=probes, advice=advise(probes, auto, device), seconds=time.perf_counter() - started,
    )


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "torch": str(torch.__version__)}
    for distribution in ("torchvision", "pytorch-ignite", "cifar10-dist"):
        try:
            found[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[distribution] = "not installed"
    return found


def settings(device: torch.device) -> list[tuple[str, torch.dtype | None, bool]]:
    """(name, autocast type, channels_last) of each probed setting on this device."""
    low = [("bf16", torch.bfloat16)]
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        low = [("fp16", torch.float16)] + (low if major >= 8 else [])
    return [("fp32", None, False), ("fp32 + channels_last", None, True),
            *[(f"{name} autocast + channels_last", dtype, True) for name, dtype in low]]


def probe(model_name: str, batch_size: int, device: torch.device, budget_seconds: float) -> list[ProbeResult]:
    """Images per second of training steps of ``model_name`` in each setting (``settings``)."""
    measured: list[tuple[str, float, int]] = []
    for name, dtype, channels_last in settings(device):
        speed, steps = time_training_steps(model_name, batch_size, device, dtype, channels_last, budget_seconds)
        measured.append((name, speed, steps))
    fp32 = measured[0][1]
    return [ProbeResult(name, speed, steps, speed / fp32) for name, speed, steps in measured]


def time_training_steps(model_name: str, batch_size: int, device: torch.device, dtype: torch.dtype | None,
                        channels_last: bool, budget_seconds: float) -> tuple[float, int]:
    """(images per second, timed steps) of SGD training steps on random images: one warm-up step, then steps
    until the budget is spent; when the warm-up step alone took most of the budget, that step is the figure."""
    torch.manual_seed(0)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = models.build_model(model_name).to(device, memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    inputs = torch.randn(batch_size, 3, 32, 32, device=device).contiguous(memory_format=layout)
    targets = torch.randint(0, 10, (batch_size,), device=device)
    train_on = plain_training_step(model, optimizer, nn.CrossEntropyLoss(), engines.Precision(device.type, dtype))

    def step() -> None:
        train_on(inputs, targets)

    warm_up = timed(step, device)
    if warm_up > WARM_UP_ONLY_SHARE * budget_seconds:
        return batch_size / warm_up, 0
    steps, spent = 0, 0.0
    while spent < budget_seconds - warm_up or steps == 0:
        spent += timed(step, device)
        steps += 1
    return steps * batch_size / spent, steps


def plain_training_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
                        precision: engines.Precision) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A bare training step in ``precision`` (a GradScaler for fp16), no framework around it: the probe's, and
    the benchmarks' bare loop (``benchmarks.steps``). Returns the loss tensor (reading it is the caller's choice)."""
    scaler = engines.make_grad_scaler(precision)

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        model.train()
        with precision.autocast():
            loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss.detach()

    return step


def timed(action: Any, device: torch.device) -> float:
    """Seconds of ``action()``, waiting for the GPU to finish it."""
    start = time.perf_counter()
    action()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def advise(probes: list[ProbeResult], auto: engines.Precision, device: torch.device) -> list[str]:
    """What to set here, read from the probe."""
    by_name = {result.setting: result for result in probes}
    advice = [f"with_amp=auto picks {auto.name} here; "
              + ", ".join(f"{result.setting} {result.relative_to_fp32:.2f}x" for result in probes[1:])
              + " the fp32 speed in this probe"]
    low = [result for result in probes if "autocast" in result.setting]
    if device.type == "cpu" and low and not hardware.native_bf16_cpu() and low[0].relative_to_fp32 < 1:
        advice.append(f"this CPU has no native bf16: with_amp=True would train {1 / low[0].relative_to_fp32:.1f}x "
                      "slower than fp32; keep with_amp=auto or False")
    layout = by_name.get("fp32 + channels_last")
    if layout is not None:
        verdict = "use" if layout.relative_to_fp32 > 1.05 else "no gain from"
        advice.append(f"{verdict} channels_last=True for this model in fp32 ({layout.relative_to_fp32:.2f}x)")
    threads = torch.get_num_threads()
    advice.append(f"torch uses {threads} CPU threads in one process; with --nproc_per_node=N each process gets "
                  f"{threads}/N (OMP_NUM_THREADS overrides)")
    if device.type == "cuda":
        count = torch.cuda.device_count()
        advice.append(f"{count} GPU(s): --backend=nccl --nproc_per_node={count} trains on all of them")
    return advice


def render(report: DoctorReport) -> str:
    """The report as text, one fact a line."""
    cpu = report.cpu
    bf16 = [name for name, key in (("AMX", "amx_bf16"), ("AVX512-BF16", "avx512_bf16")) if cpu[key]]
    lines = ["versions: " + ", ".join(f"{name} {version}" for name, version in report.versions.items()),
             f"cpu: {cpu['model']}, {cpu['logical_cores']} cores usable, {cpu['torch_threads']} torch threads, "
             f"kernels {cpu['capability']}, native bf16: {', '.join(bf16) if bf16 else 'no'}"]
    for index, gpu in enumerate(report.gpus):
        lines.append(f"gpu {index}: {gpu['name']}, {gpu['memory_gib']} GiB, compute capability "
                     f"{gpu['compute_capability']}, bf16 {'yes' if gpu['bf16'] else 'no'}")
    if not report.gpus:
        lines.append("gpus: none (CUDA not available)")
    if report.nccl:
        lines.append(f"nccl: {report.nccl}")
    lines.append("backends: " + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in report.backends.items()))
    lines.append(f"with_amp=auto on {report.device}: {report.auto_precision}")
    lines.append(f"probe: training steps of {report.probe_model}, batch {report.probe_batch_size}, on {report.device}")
    for result in report.probes:
        note = f"{result.steps} steps" if result.steps else "1 step (warm-up only: too slow for more)"
        lines.append(f"  {result.setting:<34}{result.images_per_second:>9.1f} img/s  {result.relative_to_fp32:>5.2f}x"
                     f"  ({note})")
    lines += [f"advice: {line}" for line in report.advice]
    lines.append(f"({report.seconds:.1f} s)")
    return "\n".join(lines)

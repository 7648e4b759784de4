"""The machine report behind ``doctor``: what this machine is and what will be fast on it: versions, the CPU and
its bf16, GPUs, backends, and a measured probe (a few training steps of a model in each precision and memory
format), with what ``with_amp=auto`` picks here and why, and on a CPU whether channels-last keeps the model's fp32
numbers within noise (``layout_numerics``).

The probe times whole training steps (forward, backward, SGD step) on random images after one warm-up step of each
setting, within about ``budget_seconds`` per setting (building the model included; a step is only started when one as
long as the last still fits). A setting needs MIN_STEPS timed steps to be compared; it is called faster or slower than
fp32 only when the two settings' step-time bands (the middle half of each one's steps) do not overlap, and advice
follows only from such a difference. When even fp32 cannot take MIN_STEPS steps in its budget (a slow or busy
machine), the probe runs at a smaller batch; a setting too slow for its budget at that batch (bf16 emulated on a CPU
without native bf16) is reported as not measurable, not advised on from one step. It agrees with
``python -m benchmarks.throughput --variants`` at the same model and batch (docs/measured.md has both on one
machine).
"""

from __future__ import annotations

import importlib.metadata
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch import nn

from cifar10_dist import models
from cifar10_dist.config import commands
from cifar10_dist.results import DoctorReport, ProbeResult
from cifar10_dist.system import cpu, hardware, layout_numerics, scaling
from cifar10_dist.system.precision import Precision, make_grad_scaler

MIN_STEPS = 3  # timed steps after the warm-up that a setting needs to be compared (and advised on)
MAX_STEPS = 200
MIN_BATCH = 2


def examine(
    model: str = commands.default(commands.DOCTOR, "model"),
    batch_size: int = commands.default(commands.DOCTOR, "batch_size"),
    budget_seconds: float = commands.default(commands.DOCTOR, "budget_seconds"),
    link: str | None = commands.default(commands.DOCTOR, "link"),
    auto_choice: Callable[[torch.device], Precision] | None = None,
) -> DoctorReport:
    """The whole report; the probe gives each setting about ``budget_seconds``; with ``link``, the estimate at N
    nodes over it from the probe's fastest step. ``auto_choice``: what with_amp=auto picks on a device, the
    planner's rule (``training.setup.plan.automatic_choice``: api.doctor passes it; this floor cannot import it)."""
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    probe_batch_size, probes = probe(model, batch_size, device, budget_seconds)
    if auto_choice is None:
        raise ValueError("examine needs the planner's auto_choice (api.doctor gives it)")
    auto = auto_choice(device)
    numerics = layout_numerics.check(lambda: models.build_model(model)) if device.type == "cpu" else None
    return DoctorReport(
        versions=versions(),
        cpu=hardware.describe(torch.device("cpu"))["cpu"],
        gpus=[asdict(gpu) for gpu in hardware.gpus()],
        nccl=hardware.nccl_version(),
        backends=hardware.backends(),
        device=device.type,
        auto_precision=auto.reason,
        probe_model=model,
        probe_batch_size=probe_batch_size,
        probe_budget_seconds=budget_seconds,
        probes=probes,
        advice=advise(probes, auto, device, numerics),
        seconds=time.perf_counter() - started,
        layout_numerics=numerics.describe() if numerics is not None else None,
        scaling=over_a_link(model, probe_batch_size, probes, link) if link else [],
    )


def over_a_link(model: str, batch_size: int, probes: list[ProbeResult], link: str) -> list[str]:
    """``system.scaling``'s table for the probed model at its fastest probed setting's step time."""
    fastest = max((result.images_per_second for result in probes), default=0.0)
    if not fastest:
        return [f"on a {link} link: no estimate (no probed setting was measurable)"]
    return scaling.table(models.build_model(model), batch_size / fastest, batch_size, link)


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
    return [
        ("fp32", None, False),
        ("fp32 + channels_last", None, True),
        *[(f"{name} autocast + channels_last", dtype, True) for name, dtype in low],
    ]


def probe(
    model_name: str, batch_size: int, device: torch.device, budget_seconds: float
) -> tuple[int, list[ProbeResult]]:
    """(the batch probed, each setting's result): fp32 first, at ``batch_size`` or, when the machine is too slow
    for MIN_STEPS fp32 steps in the budget, once more at a batch sized from the first try; every other setting at
    that batch (a setting too slow for MIN_STEPS steps in its budget is reported as not measurable)."""
    chosen = settings(device)
    fp32 = time_setting(model_name, batch_size, device, None, False, budget_seconds)
    if not fp32.measured and batch_size > MIN_BATCH:
        batch_size = fitting_batch(batch_size, fp32.warm_up, budget_seconds)
        fp32 = time_setting(model_name, batch_size, device, None, False, budget_seconds)
    timings = [fp32] + [
        time_setting(model_name, batch_size, device, dtype, channels_last, budget_seconds)
        for _, dtype, channels_last in chosen[1:]
    ]
    return batch_size, [result_of(name, timing, fp32) for (name, _, _), timing in zip(chosen, timings)]


@dataclass(frozen=True)
class Timing:
    """One setting's measurement: its warm-up step and the timed steps after it (seconds each)."""

    batch_size: int
    warm_up: float
    steps: tuple[float, ...]

    @property
    def measured(self) -> bool:
        return len(self.steps) >= MIN_STEPS

    def band(self) -> tuple[float, float, float]:
        """(first quartile, median, third quartile) of the step times: the band of the middle half."""
        low, middle, high = (
            torch.tensor(self.steps, dtype=torch.float64)
            .quantile(torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
            .tolist()
        )
        return low, middle, high


def fitting_batch(batch_size: int, warm_up: float, budget_seconds: float) -> int:
    """A power-of-two batch whose warm-up and MIN_STEPS steps fit in the budget, judged from a warm-up at
    ``batch_size`` (the time of a step taken to grow with the batch)."""
    share = budget_seconds / ((MIN_STEPS + 1) * max(warm_up, 1e-9))
    fitting = MIN_BATCH
    while fitting * 2 <= min(batch_size * share, batch_size // 2):
        fitting *= 2
    return fitting


def time_setting(
    model_name: str,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype | None,
    channels_last: bool,
    budget_seconds: float,
) -> Timing:
    """SGD training steps on random images in one setting: one warm-up step, then timed steps while the next one
    (as long as the last) still fits in ``budget_seconds`` from the start, building the model included."""
    started = time.perf_counter()
    torch.manual_seed(0)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = models.build_model(model_name).to(device).to(memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    inputs = torch.randn(batch_size, 3, 32, 32, device=device).contiguous(memory_format=layout)
    targets = torch.randint(0, 10, (batch_size,), device=device)
    train_on = plain_training_step(model, optimizer, nn.CrossEntropyLoss(), Precision(device.type, dtype))

    def step() -> None:
        train_on(inputs, targets)

    warm_up = timed(step, device)
    steps: list[float] = []
    while len(steps) < MAX_STEPS:
        next_step = steps[-1] if steps else warm_up
        if time.perf_counter() - started + next_step > budget_seconds:
            break
        steps.append(timed(step, device))
    return Timing(batch_size, warm_up, tuple(steps))


def result_of(setting: str, timing: Timing, fp32: Timing) -> ProbeResult:
    """A setting's figures and its verdict against fp32: faster or slower only when their step-time bands
    (the middle half of each one's steps) do not overlap."""
    if not timing.measured:
        why = (
            f"not measurable here: {len(timing.steps)} steps after a {timing.warm_up:.2f} s warm-up fit in its "
            f"budget, {MIN_STEPS} needed"
        )
        return ProbeResult(setting, 0.0, len(timing.steps), None, 0.0, why)
    low, middle, high = timing.band()
    speed, spread = timing.batch_size / middle, (high - low) / 2 / middle
    if not fp32.measured:
        return ProbeResult(setting, speed, len(timing.steps), None, spread, "fp32 not measurable here")
    fp32_low, fp32_middle, fp32_high = fp32.band()
    verdict = (
        "the reference"
        if timing is fp32
        else "faster"
        if high < fp32_low
        else "slower"
        if low > fp32_high
        else "no difference measurable here"
    )
    return ProbeResult(setting, speed, len(timing.steps), fp32_middle / middle, spread, verdict)


def plain_training_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module, precision: Precision
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A bare training step in ``precision`` (a GradScaler for fp16), no framework around it: the probe's, and
    the benchmarks' bare loop (``benchmarks.steps``). Returns the loss tensor (reading it is the caller's choice)."""
    scaler = make_grad_scaler(precision)

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


def advise(
    probes: list[ProbeResult],
    auto: Precision,
    device: torch.device,
    numerics: layout_numerics.LayoutNumerics | None = None,
) -> list[str]:
    """What to set here, read from the probe: a setting is advised for or against only when its difference from
    fp32 is beyond the spread of both; otherwise the advice says it could not be measured. Channels-last whose
    numbers are beyond fp32 noise on this CPU (``numerics``) is advised against whatever its speed."""
    by_name = {result.setting: result for result in probes}
    advice = [
        f"with_amp=auto picks {auto.name} here; against fp32 in this probe: "
        + ", ".join(
            f"{result.setting} {result.relative_to_fp32:.2f}x"
            if result.relative_to_fp32 is not None
            else f"{result.setting} not measurable"
            for result in probes[1:]
        )
    ]
    low = next((result for result in probes if "autocast" in result.setting), None)
    if device.type == "cpu" and low is not None and not hardware.native_bf16_cpu():
        measured = (
            f"with_amp=True trained {1 / low.relative_to_fp32:.1f}x slower than fp32 in the probe"
            if low.verdict == "slower" and low.relative_to_fp32
            else "bf16 autocast is emulated, many times slower than fp32"
        )
        advice.append(f"this CPU has no native bf16: {measured}; keep with_amp=auto or False")
    layout = by_name.get("fp32 + channels_last")
    if numerics is not None and not numerics.within_noise:
        advice.append(
            "keep channels_last=False on this CPU: it changes this model's fp32 numbers beyond noise "
            "(channels_last=auto leaves it off here)"
        )
    elif layout is not None:
        advice.append(channels_last_advice(layout))
    threads = torch.get_num_threads()
    advice.append(
        f"torch uses {threads} CPU threads in one process; with --nproc_per_node=N each process gets "
        f"{threads}/N (OMP_NUM_THREADS overrides)"
    )
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    advice.append(cpu.processes_to_run(cpu.usable_cores(), gpus))
    return advice


def channels_last_advice(layout: ProbeResult) -> str:
    if layout.verdict == "faster":
        return f"use channels_last=True for this model in fp32 ({layout.relative_to_fp32:.2f}x, beyond the spread)"
    if layout.verdict == "slower":
        return f"keep channels_last=False for this model in fp32 ({layout.relative_to_fp32:.2f}x, beyond the spread)"
    if layout.verdict == "no difference measurable here":
        return (
            f"channels_last: no difference measurable here in fp32 ({layout.relative_to_fp32:.2f}x within "
            f"the spread of {layout.steps} steps)"
        )
    return f"channels_last: {layout.verdict} (a larger --budget_seconds may measure it)"


def render(report: DoctorReport) -> str:
    """The report as text, one fact a line."""
    cpu = report.cpu
    bf16 = [name for name, key in (("AMX", "amx_bf16"), ("AVX512-BF16", "avx512_bf16")) if cpu[key]]
    lines = [
        "versions: " + ", ".join(f"{name} {version}" for name, version in report.versions.items()),
        f"cpu: {cpu['model']}, {cpu['logical_cores']} cores usable, {cpu['torch_threads']} torch threads, "
        f"kernels {cpu['capability']}, native bf16: {', '.join(bf16) if bf16 else 'no'}",
    ]
    for index, gpu in enumerate(report.gpus):
        lines.append(
            f"gpu {index}: {gpu['name']}, {gpu['memory_gib']} GiB, compute capability "
            f"{gpu['compute_capability']}, bf16 {'yes' if gpu['bf16'] else 'no'}"
        )
    if not report.gpus:
        lines.append("gpus: none (CUDA not available)")
    if report.nccl:
        lines.append(f"nccl: {report.nccl}")
    lines.append("backends: " + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in report.backends.items()))
    lines.append(f"with_amp=auto on {report.device}: {report.auto_precision}")
    lines.append(
        f"probe: training steps of {report.probe_model}, batch {report.probe_batch_size}, on {report.device}, "
        f"about {report.probe_budget_seconds:g} s per setting"
    )
    for result in report.probes:
        if result.relative_to_fp32 is None:
            figure = f"{result.images_per_second:>9.1f} img/s" if result.images_per_second else ""
            lines.append(f"  {result.setting:<34}{figure}  {result.verdict}")
            continue
        lines.append(
            f"  {result.setting:<34}{result.images_per_second:>9.1f} img/s  {result.relative_to_fp32:>5.2f}x"
            f"  +-{result.spread:.0%}  ({result.steps} steps; {result.verdict})"
        )
    if report.layout_numerics:
        lines.append(f"channels-last numerics of {report.probe_model}: {report.layout_numerics}")
    lines += [f"advice: {line}" for line in report.advice]
    lines += [f"scaling: {line}" for line in report.scaling]
    lines.append(f"({report.seconds:.1f} s in all)")
    return "\n".join(lines)

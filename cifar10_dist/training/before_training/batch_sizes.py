"""The batch-size finder (``batch-size``): which batch a run should take on this machine, measured with the run's
own training step (its model, optimizer groups, precision, memory format and image size, on random images).

On a GPU, the largest batch that fits: doubled until CUDA runs out of memory, then halved back by bisection, and
a margin taken off (Lightning's BatchSizeFinder grows the same way). On a CPU memory is rarely the limit, speed
is: each candidate is timed like the doctor's probe (a warm-up step, then at least MIN_STEPS timed steps, the
middle half of their times as the band), and the fastest is named only where its band clears the others';
where the bands overlap there is "no difference measurable", and the config's own batch is kept.

The learning rate follows the batch by the rule the recipes use: linear for SGD (Goyal et al. 2017, as
configs/fast.yaml's note says: learning_rate x new / old), square root for AdamW (Malladi et al. 2022)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import torch
from torch import nn

from cifar10_dist import models
from cifar10_dist.config import Config
from cifar10_dist.config.rules import planned_world_size
from cifar10_dist.data import batches, run_data
from cifar10_dist.errors import UserError
from cifar10_dist.results import BatchSizeResult, BatchSpeed
from cifar10_dist.system import doctor
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop.step import TrainStep
from cifar10_dist.training.setup import optimizers, plan

CPU_CANDIDATES = (32, 64, 128, 256, 512, 1024)
MAX_STEPS = 20
GPU_MARGIN = 0.9  # of the largest batch that fit: room for what a real run adds (evaluation, fragmentation)
GPU_LIMIT = 1 << 16
ROUND_TO = 8


def step_of(config: Config, batch_size: int, device: torch.device, precision: Precision) -> Callable[[], Any]:
    """One training step of the config's run on ``batch_size`` random images, as a callable."""
    torch.manual_seed(0)
    layout = batches.memory_format(config.channels_last)  # settled once by find_batch_size
    model = models.build_model(config.model, config.model_kwargs).to(device).to(memory_format=layout)
    numeric = dataclasses.replace(
        config, learning_rate=1e-3 if config.learning_rate == "find" else config.learning_rate
    )
    optimizer, _ = optimizers.build_optimizer(model, numeric, total_iterations=1000)
    train = TrainStep(model, optimizer, nn.CrossEntropyLoss(), precision)
    inputs = torch.randn(batch_size, 3, config.image_size, config.image_size, device=device).contiguous(
        memory_format=layout
    )
    targets = torch.randint(0, models.NUM_CLASSES, (batch_size,), device=device)
    return lambda: train(inputs, targets)


def timing(
    config: Config, batch_size: int, device: torch.device, precision: Precision, budget_seconds: float
) -> doctor.Timing:
    """A warm-up step, then timed steps until the budget is spent (at least MIN_STEPS, at most MAX_STEPS)."""
    step = step_of(config, batch_size, device, precision)
    warm_up = doctor.timed(step, device)
    steps: list[float] = []
    started = time.perf_counter()
    while len(steps) < doctor.MIN_STEPS or (len(steps) < MAX_STEPS and time.perf_counter() - started < budget_seconds):
        steps.append(doctor.timed(step, device))
    return doctor.Timing(batch_size, warm_up, tuple(steps))


def compared(timings: list[doctor.Timing]) -> list[BatchSpeed]:
    """Each batch's speed (images per second at its median step, spread as half its band over the median) and
    its verdict against the fastest: its band clears the fastest's, or no difference is measurable."""
    fastest = max(timings, key=lambda t: t.batch_size / t.band()[1])
    fastest_low = fastest.batch_size / fastest.band()[2]  # images per second at the slow end of its band
    rows = []
    for timed in timings:
        low, middle, high = timed.band()
        speed = timed.batch_size / middle
        verdict = (
            "fastest"
            if timed is fastest
            else "slower"
            if timed.batch_size / low < fastest_low
            else "no difference measurable from the fastest"
        )
        rows.append(BatchSpeed(timed.batch_size, speed, (high - low) / 2 / middle, len(timed.steps), verdict))
    return rows


def largest_fitting(fits: Callable[[int], bool], start: int, limit: int = GPU_LIMIT) -> int:
    """The largest batch for which ``fits`` holds: doubled from ``start`` until it fails (or reaches ``limit``),
    then bisected between the last that fit and the first that failed; 0 when not even ``start`` fits."""
    if not fits(start):
        return 0
    low, high = start, None
    while high is None and low * 2 <= limit:
        if fits(low * 2):
            low *= 2
        else:
            high = low * 2
    if high is None:
        return low
    while high - low > max(1, low // 16):
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def fits_on_gpu(config: Config, device: torch.device, precision: Precision) -> Callable[[int], bool]:
    def fits(batch_size: int) -> bool:
        try:
            step = step_of(config, batch_size, device, precision)
            step()
            step()  # the optimizer's state is made by the first step
            torch.cuda.synchronize(device)
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            torch.cuda.empty_cache()

    return fits


def scaled_learning_rate(config: Config, batch_size: int) -> tuple[float | None, str]:
    """The config's learning_rate carried to ``batch_size`` (global) by the optimizer's rule, and the rule."""
    ratio = batch_size / config.batch_size
    if config.learning_rate == "find":
        return None, "learning_rate=find sweeps it at the new batch"
    if config.optimizer == "adamw":
        return float(config.learning_rate) * math.sqrt(ratio), "square root (AdamW: Malladi et al. 2022)"
    return float(config.learning_rate) * ratio, "linear (SGD: Goyal et al. 2017; configs/fast.yaml's note)"


def per_process_limit(config: Config, world: int) -> tuple[int | None, str]:
    """(the largest batch a process can take: its share of the training split, what the finder says of it); no
    limit where the data is not on disk yet (it is not downloaded to count it)."""
    try:
        images = run_data.training_images(config)
    except UserError as missing:
        return None, f"sizes not capped by the training split: {missing}"
    limit = max(1, images // world)
    if limit >= max(CPU_CANDIDATES):
        return limit, ""
    return limit, f"sizes capped at the {images} training images ({limit} per process)"


def capped(sizes: list[int], limit: int | None) -> list[int]:
    """The sizes a process can take: none above ``limit``, and ``limit`` itself where every size is above it."""
    if limit is None:
        return sizes
    return [size for size in sizes if size <= limit] or [limit]


def cpu_choice(rows: list[BatchSpeed], own: int) -> tuple[int, str]:
    """The per-process batch to suggest from the timed sizes, and why: the config's own unless another is faster
    beyond both spreads (or the config's own is not among them: larger than the training split)."""
    best = next(row for row in rows if row.verdict == "fastest")
    mine = next((row for row in rows if row.batch_size == own), None)
    if mine is None:
        return best.batch_size, (
            f"the config's {own} per process is more than the training split holds; "
            f"{best.batch_size} trains fastest of the sizes that fit "
            f"({best.images_per_second:.0f} img/s)"
        )
    if mine is best:
        return own, f"the config's own batch ({own} per process) is the fastest"
    if mine.verdict != "slower":
        return own, (
            f"no difference measurable between the config's {own} and the fastest ({best.batch_size}, "
            f"{best.images_per_second:.0f} img/s): keep it"
        )
    return best.batch_size, (
        f"{best.batch_size} per process trains fastest here ({best.images_per_second:.0f} img/s "
        f"against {mine.images_per_second:.0f} at the config's {own}, beyond both spreads)"
    )


def find_batch_size(config: Config, candidates: tuple[int, ...] | None, budget_seconds: float) -> BatchSizeResult:
    """Measure, choose and explain (per process sizes; the suggestion is global: times the planned world size)."""
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    the_plan = plan.settle(config, device, plan.DataFacts.classes_only(models.NUM_CLASSES), report=False)
    config, precision = the_plan.config, the_plan.precision  # settled once, not per batch tried
    world = planned_world_size(config) or 1
    own = max(1, config.batch_size // world)
    limit, limit_note = per_process_limit(config, world)
    if device.type == "cuda":
        largest = largest_fitting(
            fits_on_gpu(config, device, precision),
            candidates[0] if candidates else 32,
            min(GPU_LIMIT, limit or GPU_LIMIT),
        )
        chosen = max(ROUND_TO, int(largest * GPU_MARGIN) // ROUND_TO * ROUND_TO) if largest else 0
        chosen = min(chosen, limit) if limit else chosen
        rows = compared([timing(config, chosen, device, precision, budget_seconds)]) if chosen else []
        reason = (
            (
                f"the largest batch that fit was {largest} per process; {GPU_MARGIN:.0%} of it, rounded down to a "
                f"multiple of {ROUND_TO}, leaves room for evaluation and fragmentation"
            )
            if chosen
            else "not even the smallest batch fit on this GPU"
        )
    else:
        sizes = capped(sorted(set(candidates or CPU_CANDIDATES) | {own}), limit)
        rows = compared([timing(config, size, device, precision, budget_seconds) for size in sizes])
        chosen, reason = cpu_choice(rows, own)
    if limit_note:
        reason = f"{reason}; {limit_note}"
    learning_rate, rule = scaled_learning_rate(config, chosen * world)
    return BatchSizeResult(
        device=device.type,
        model=config.model,
        image_size=config.image_size,
        world_size=world,
        config_batch_size=config.batch_size,
        speeds=rows,
        batch_size=chosen * world,
        reason=reason,
        learning_rate=learning_rate,
        rule=rule,
        seconds=time.perf_counter() - started,
    )

"""The learning-rate schedule of a run: a warmup, then a shape from the registry ``SHAPES`` (linear, cosine or step,
the last two with torch's own schedulers' values), set per iteration by Ignite's PiecewiseLinear, whose state
checkpoints keep (exact across resume); per parameter group scaled or frozen part-way (``GroupSchedule``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from ignite.handlers import ParamGroupScheduler, PiecewiseLinear


@dataclass(frozen=True)
class Shape:
    """What the lr does after the warmup: ``linear`` decay to end*lr, ``cosine`` (torch's CosineAnnealingLR to
    end*lr), or ``step`` (times ``gamma`` at each iteration of ``drops``, torch's MultiStepLR)."""

    name: str = "linear"
    drops: tuple[int, ...] = ()
    gamma: float = 0.1


Corners = list[tuple[int, float]]  # (iteration, lr), linear between them
# a shape's corners after the warmup, from its step 0 (the warmup's end) to ``steps``: (shape, lr, steps, end lr)
ShapeCorners = Callable[[Shape, float, int, float], Corners]
SHAPES: dict[str, ShapeCorners] = {}  # lr_schedule=NAME -> its corners (config.training_keys lists the same names)


def register_shape(name: str) -> Callable[[ShapeCorners], ShapeCorners]:
    """Make ``lr_schedule=name`` the decorated function's corners (a new schedule: one function here and its name
    in the config's ``lr_schedule`` choices; tests/test_training.py checks that the two lists agree)."""

    def register(corners: ShapeCorners) -> ShapeCorners:
        SHAPES[name] = corners
        return corners

    return register


@register_shape("linear")
def linear_corners(shape: Shape, learning_rate: float, steps: int, end: float) -> Corners:
    """Linear decay from the peak to the end lr."""
    return [(0, learning_rate), (steps, end)]


@register_shape("cosine")
def cosine_corners(shape: Shape, learning_rate: float, steps: int, end: float) -> Corners:
    """torch's CosineAnnealingLR (T_max=steps, eta_min=end), one corner per iteration."""
    return list(enumerate(torch_schedule(shape, learning_rate, steps, end)))


@register_shape("step")
def step_corners(shape: Shape, learning_rate: float, steps: int, end: float) -> Corners:
    """torch's MultiStepLR (times ``gamma`` at each of ``drops``), a corner only where the value changes: before
    and at each drop, and the end."""
    corners = list(enumerate(torch_schedule(shape, learning_rate, steps, end)))
    return [
        c
        for i, c in enumerate(corners)
        if i in (0, len(corners) - 1) or c[1] != corners[i + 1][1] or c[1] != corners[i - 1][1]
    ]


def lr_milestones(
    learning_rate: float,
    warmup_iterations: int,
    total_iterations: int,
    start: float = 0.0,
    end: float = 0.0,
    shape: Shape = Shape(),
) -> Corners:
    """(iteration, lr) corners, linear between them: start*lr, linear warmup to lr, then the shape (``SHAPES``) to
    the last iteration. Cosine and step take their values from torch's own schedulers, at whole iterations (the
    scheduler is evaluated at whole iterations only, so the lr is theirs exactly)."""
    warmup = [(0, start * learning_rate)] if warmup_iterations > 0 else []
    after = SHAPES[shape.name](shape, learning_rate, total_iterations - warmup_iterations, end * learning_rate)
    return [*warmup, *((warmup_iterations + step, value) for step, value in after)]


def torch_schedule(shape: Shape, learning_rate: float, steps: int, eta_min: float) -> list[float]:
    """The lr of torch's CosineAnnealingLR (T_max=steps, eta_min) or MultiStepLR (drops counted from the end of
    the warmup) at steps 0..steps, stepped on a stand-in optimizer."""
    stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=learning_rate)
    if shape.name == "cosine":
        scheduler: Any = torch.optim.lr_scheduler.CosineAnnealingLR(stand_in, T_max=max(steps, 1), eta_min=eta_min)
    else:
        scheduler = torch.optim.lr_scheduler.MultiStepLR(stand_in, milestones=list(shape.drops), gamma=shape.gamma)
    values = []
    for _ in range(steps + 1):
        values.append(stand_in.param_groups[0]["lr"])
        stand_in.step()
        scheduler.step()
    return values


def _scaled(milestones: list[tuple[int, float]], schedule: GroupSchedule) -> list[tuple[int, float]]:
    scaled = _scaled_until(milestones, schedule)
    start = schedule.train_from
    if start <= 0:
        return scaled
    value_at_start = float(np.interp(start, [i for i, _ in scaled], [v for _, v in scaled]))
    later = [(iteration, value) for iteration, value in scaled if iteration > start]
    return [(0, 0.0), *([(start - 1, 0.0)] if start > 1 else []), (start, value_at_start), *later]


def _scaled_until(milestones: list[tuple[int, float]], schedule: GroupSchedule) -> list[tuple[int, float]]:
    """The milestones times the group's lr scale, and 0 after its ``train_until`` (a parameter frozen part-way),
    or a linear decay from the scaled peak to 0 there."""
    scale, until, last = schedule.lr_scale, schedule.train_until, milestones[-1][0]
    if schedule.decay_to_until and until is not None and 0 < until < last:
        return [(0, scale * max(value for _, value in milestones)), (until, 0.0), (last, 0.0)]
    scaled = [(iteration, value * scale) for iteration, value in milestones]
    if until is None or until >= last:
        return scaled
    kept = [(iteration, value) for iteration, value in scaled if iteration < until]
    value_at_until = float(np.interp(until, [i for i, _ in scaled], [v for _, v in scaled]))
    return [*kept, (until, value_at_until), (until + 1, 0.0), (last, 0.0)]


@dataclass(frozen=True)
class GroupSchedule:
    """How one parameter group follows the schedule: its lr is ``lr_scale`` times the others', and 0 after
    iteration ``train_until`` (a parameter frozen part-way; None: trained to the end); with ``decay_to_until``
    it falls instead linearly from ``lr_scale`` times the peak lr at the start to 0 at ``train_until``; 0 before
    iteration ``train_from`` (counted from 0, as the scheduler counts: iterations 1..train_from do not move it)."""

    lr_scale: float = 1.0
    train_until: int | None = None
    decay_to_until: bool = False
    train_from: int = 0  # lr 0 before this iteration (a backbone frozen for the first epochs: ``freeze_epochs``)


def create_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    learning_rate: float,
    warmup_iterations: int,
    total_iterations: int,
    start: float = 0.0,
    end: float = 0.0,
    group_schedules: Sequence[GroupSchedule] = (),
    shape: Shape = Shape(),
) -> PiecewiseLinear | ParamGroupScheduler:
    """The schedule of ``lr_milestones`` as Ignite's PiecewiseLinear, set per iteration; with ``group_schedules``
    (one per param group of the optimizer, in order) each group scaled or frozen as it says."""
    milestones = lr_milestones(learning_rate, warmup_iterations, total_iterations, start, end, shape)
    if all(schedule == GroupSchedule() for schedule in group_schedules):
        return PiecewiseLinear(optimizer, "lr", milestones_values=milestones)
    if len(group_schedules) != len(optimizer.param_groups):
        raise ValueError(f"{len(group_schedules)} group schedules for {len(optimizer.param_groups)} param groups")
    schedulers: list[Any] = [
        PiecewiseLinear(optimizer, "lr", _scaled(milestones, schedule), param_group_index=index)
        for index, schedule in enumerate(group_schedules)
    ]
    return ParamGroupScheduler(schedulers, names=[f"lr_group_{index}" for index in range(len(group_schedules))])

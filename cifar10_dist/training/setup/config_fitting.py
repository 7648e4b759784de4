"""The planner's choices that read the config alone (part of ``plan``, without torch: ``runs.resolve`` makes
them before launch, so that a value they leave impossible fails in well under a second).

Loading notes the values a config file or the defaults gave, never a flag, that this run leaves no room for
(``Config.fit_to_the_run``). They are fitted here, each with one line:

- checkpoint_every is rounded up to a multiple of accumulation_steps: checkpoints are taken after optimizer steps;
- num_warmup_epochs set for a longer run is scaled to the same share of this shorter one.

A value the user set is never fitted: ``validate`` refuses it instead."""

from __future__ import annotations

import dataclasses
from typing import Any

from cifar10_dist.config import Config, note, validate


def fitted_to_the_run(config: Config) -> Config:
    """``config`` with every value noted in fit_to_the_run fitted (one line each) and validated again; as it is
    where nothing is noted (a config fitted already, or one whose values all fit)."""
    to_fit = config.fit_to_the_run
    if not to_fit:
        return config
    changes: dict[str, Any] = {"fit_to_the_run": None}
    if "checkpoint_every" in to_fit:
        changes["checkpoint_every"] = checkpoints_after_steps(config, to_fit["checkpoint_every"]["source"])
    if "num_warmup_epochs" in to_fit:
        noted = to_fit["num_warmup_epochs"]
        changes["num_warmup_epochs"] = warmup_scaled(config, noted["planned_epochs"], noted["source"])
    fitted = dataclasses.replace(config, **changes)
    validate(fitted)
    return fitted


def checkpoints_after_steps(config: Config, source: str) -> int:
    """checkpoint_every rounded up to a multiple of accumulation_steps, said in one line."""
    every, steps = config.checkpoint_every, config.accumulation_steps
    rounded = -(-every // steps) * steps
    note(
        f"checkpoint_every={every} ({source}) rounded up to {rounded}, a multiple of accumulation_steps={steps}: "
        "checkpoints are taken after optimizer steps"
    )
    return rounded


def warmup_scaled(config: Config, planned_epochs: int, source: str) -> float:
    """num_warmup_epochs scaled from a run of ``planned_epochs`` to this one's num_epochs, said in one line."""
    warmup, epochs = config.num_warmup_epochs, config.num_epochs
    scaled = round(warmup * epochs / planned_epochs, 4)
    note(
        f"num_warmup_epochs={warmup} ({source}) scaled to {scaled} for num_epochs={epochs}: "
        f"the same share of the run as {warmup} of {planned_epochs} epochs"
    )
    return scaled

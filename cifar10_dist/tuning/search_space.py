"""A tuning study's search space (SPACE.yaml): one ``Dimension`` per config key (float/int ranges, log scale,
steps, categorical choices), read and checked against the config before any trial."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cifar10_dist.config import FIELDS, RENAMED, UNTUNABLE, Config, config_path, load_config, read_yaml_file
from cifar10_dist.errors import UserError

SPACE_TYPES = ("float", "int", "categorical")


@dataclass(frozen=True)
class Dimension:
    """One searched config key: float or int in [low, high] (log scale, int step), or categorical choices."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: int | float | None = None
    choices: tuple[Any, ...] = ()

    def bounds(self) -> tuple[float, float]:
        """low and high of a range (a categorical dimension has none)."""
        assert self.low is not None and self.high is not None
        return self.low, self.high

    def suggest(self, trial: Any) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(
                self.name, int(self.bounds()[0]), int(self.bounds()[1]), step=int(self.step or 1), log=self.log
            )
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def extremes(self) -> list[Any]:
        """The values that bound what this dimension can suggest (checked against the config before any trial)."""
        if self.type == "categorical":
            return list(self.choices)
        if self.type == "int":
            return [int(self.bounds()[0]), int(self.bounds()[1])]
        return [self.low, self.high]

    def grid(self) -> list[Any]:
        if self.type == "categorical":
            return list(self.choices)
        if self.type == "int" and not self.log:
            return list(range(int(self.bounds()[0]), int(self.bounds()[1]) + 1, int(self.step or 1)))
        raise UserError(
            f"sampler=grid needs a finite set of values: {self.name} is a {self.type} range "
            f"(give it choices: {{type: categorical, choices: [...]}})"
        )


def read_space(path: str | Path) -> dict[str, Dimension]:
    """SPACE.yaml: ``key: {type: float|int|categorical, ...}`` for config keys; one line for each kind of mistake."""
    path = config_path(path)
    space = read_yaml_file(path, "space file", "space_fast")
    loaded = space.values
    if not loaded:
        raise UserError(
            f"space file '{path}' must map config keys to ranges, e.g. learning_rate: "
            "{type: float, low: 0.01, high: 1.0, log: true}"
        )
    return {
        RENAMED.get(str(name), str(name)): _dimension(
            RENAMED.get(str(name), str(name)), entry, f"space file '{path}' line {space.lines.get(str(name), 1)}"
        )
        for name, entry in loaded.items()
    }


def _dimension(name: str, entry: Any, in_file: str) -> Dimension:
    where = f"{in_file}: {name}"
    if name not in FIELDS:
        close = difflib.get_close_matches(name, FIELDS, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else "run cifar10-dist run --help to list the keys"
        raise UserError(f"{in_file}: unknown config key '{name}': {hint}")
    if name in UNTUNABLE:
        raise UserError(f"{where} cannot be tuned (tune sets it, or it decides the data every trial must share)")
    if not isinstance(entry, dict) or entry.get("type") not in SPACE_TYPES:
        raise UserError(f"{where} needs type: float, int or categorical (got {entry!r})")
    known = {
        "float": {"low", "high", "log", "step"},
        "int": {"low", "high", "log", "step"},
        "categorical": {"choices"},
    }[entry["type"]] | {"type"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise UserError(
            f"{where}: '{unknown[0]}' is not accepted for type {entry['type']} (accepted: {', '.join(sorted(known))})"
        )
    if entry["type"] == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, list) or not choices:
            raise UserError(f"{where}: choices must be a non-empty list, e.g. choices: [128, 256, 512]")
        return Dimension(name, "categorical", choices=tuple(choices))
    low: Any = entry.get("low")
    high: Any = entry.get("high")
    step = entry.get("step")
    numbers = [
        value
        for value in (low, high)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ]
    if len(numbers) != 2 or not low < high:
        raise UserError(f"{where}: low and high must be finite numbers with low < high (got low={low}, high={high})")
    if entry["type"] == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise UserError(f"{where}: an int range needs whole low and high (got low={low}, high={high})")
    log = entry.get("log", False)
    if log and (low <= 0 or step is not None):
        raise UserError(f"{where}: log: true needs low > 0 and no step (got low={low}, step={step})")
    if step is not None and not (isinstance(step, (int, float)) and math.isfinite(step) and step > 0):
        raise UserError(f"{where}: step must be a number > 0 (got {step!r})")
    return Dimension(name, entry["type"], float(low), float(high), bool(log), step)


def check_space(base: Config, space: Mapping[str, Dimension]) -> None:
    """Every bound and choice of the space must make a valid config with the base config (before any trial)."""
    for dimension in space.values():
        for value in dimension.extremes():
            try:
                load_config(None, **{**base.to_dict(), dimension.name: value})
            except UserError as error:
                raise UserError(
                    f"space: {dimension.name}={value!r} is outside what the config accepts: {error}"
                ) from error

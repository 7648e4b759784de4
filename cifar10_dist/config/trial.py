"""A tuning trial as plain config data (``Config.trial``, set by ``tune``): the study's pruner (``PrunerSpec``) and
the trial itself (``TrialSpec``), so that each process of a trial's run reaches it through the study's storage."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cifar10_dist.errors import UserError

PRUNERS = ("median", "hyperband", "none")


@dataclass(frozen=True)
class PrunerSpec:
    """A study's pruner as plain data: a study keeps its pruner in the process, not in the storage, so a trial's
    processes build the same one from this (``trials.make_pruner``)."""

    name: str = "median"  # one of PRUNERS (tune's flags take these defaults: config.commands.TuneFlags)
    startup_trials: int = 5  # median: trials that are never pruned, the first ones
    warmup_epochs: int = 0  # median: epochs of a trial that are never pruned
    max_epochs: int = 1  # hyperband: the largest resource, the trials' num_epochs


@dataclass(frozen=True)
class TrialSpec:
    """The Optuna trial a run is (``Config.trial``, set by tune): where its study is, its number, the values tried
    and the pruner, so that each of its processes reaches the trial through the storage."""

    study: str
    storage: str
    number: int
    params: dict[str, Any]
    pruner: PrunerSpec = PrunerSpec()

    @classmethod
    def from_mapping(cls, values: Any) -> TrialSpec:
        """A spec from config.yaml's ``trial`` mapping (a trial's run resumed or run again), or one line naming
        what is missing or wrong."""
        if isinstance(values, TrialSpec):
            return values
        keys = {f.name for f in dataclasses.fields(cls)}
        pruner_keys = {f.name for f in dataclasses.fields(PrunerSpec)}
        if (
            not isinstance(values, dict)
            or not {"study", "storage", "number", "params"} <= set(values) <= keys
            or not isinstance(values.get("pruner", {}), dict)
            or not set(values.get("pruner", {})) <= pruner_keys
        ):
            raise UserError(
                f"trial={values!r} is not a tuning trial: expected study, storage, number, params and "
                f"pruner ({', '.join(sorted(pruner_keys))}); tune sets this key, leave it out"
            )
        pruner = PrunerSpec(**values.get("pruner", {}))
        return cls(**{**values, "params": dict(values["params"]), "pruner": pruner})

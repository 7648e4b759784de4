"""The run configuration: one typed, frozen dataclass composed from its topics' keys (``data_keys``,
``augmentation_keys``, ``training_keys``, ``speed_keys``, ``output_keys``, ``launch_keys``: the single source of
defaults, help texts and each key's own rules, a ``Literal`` annotation for a word's choices, ``Bounds`` for a
number's range), checked by ``check_field``. Adding a key with a range is one field in its topic's module; rules
that tie several keys together are in ``rules``."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

from cifar10_dist.config.augmentation_keys import AugmentationKeys
from cifar10_dist.config.data_keys import DataKeys
from cifar10_dist.config.launch_keys import LaunchKeys
from cifar10_dist.config.options import option
from cifar10_dist.config.output_keys import OutputKeys
from cifar10_dist.config.speed_keys import SpeedKeys
from cifar10_dist.config.training_keys import TrainingKeys
from cifar10_dist.config.trial import TrialSpec
from cifar10_dist.errors import UserError

LIST_FIELDS = ("lr_milestones", "class_weights")  # str fields holding comma-separated numbers (fire: a tuple)


@dataclass(frozen=True)
class Config(LaunchKeys, OutputKeys, SpeedKeys, TrainingKeys, AugmentationKeys, DataKeys):
    """Everything a training or evaluation run needs, one flat set of keys composed from their topics (data,
    augmentation, training, speed, outputs, launch: each a module of its own; a dataclass collects its bases'
    fields from the last base up, so the keys keep that order). Defaults follow the Ignite CIFAR-10 tutorial."""

    # set by tune
    trial: Optional[TrialSpec] = option(
        None,
        "set by tune: the Optuna trial this run is (study, storage, number, "
        "params); rank 0 reports each val accuracy there and the run may be pruned; "
        "no test set",
        internal=True,
    )
    lr_found: Optional[dict] = option(
        None,
        "set by learning_rate=find: the sweep's suggestion and where its files wait for the run folder",
        internal=True,
    )
    config_source: Optional[dict] = option(
        None,
        "set when a config file is read: its path and whether the package "
        "ships it (provenance.json records it; config.yaml does not)",
        internal=True,
        per_tuning_worker=True,
        compare=False,
    )
    fit_to_the_run: Optional[dict] = option(
        None,
        "set when a config is loaded: the values a config file or the defaults gave (no flag) that this run leaves "
        "no room for, each with where it came from; the planner fits them to the run (config_fitting)",
        internal=True,
        compare=False,
    )
    mlflow_parent_run: Optional[str] = option(
        None,
        "set by tune: the MLflow run of the study, parent of this trial's MLflow run",
        internal=True,
        per_tuning_worker=True,
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, values: typing.Mapping[str, Any]) -> Config:
        """A config as a run recorded it (``to_dict``/``replayable``: a checkpoint's meta, config.yaml), read back
        as it was, not validated again: keys of this release's that an older record lacks take their defaults
        (a key is added with the default that does what releases before it did), keys this release no longer has
        are left out, and the trial is a ``TrialSpec`` again."""
        known = {
            RENAMED.get(name, name): value for name, value in values.items() if RENAMED.get(name, name) in _FIELD_NAMES
        }
        if known.get("trial") is not None:
            known["trial"] = TrialSpec.from_mapping(dict(known["trial"]))
        return cls(**known)

    def replayable(self) -> dict[str, Any]:
        """What a run records as its config (config.yaml, a checkpoint's meta, the trackers' parameters): what a
        new run should do, so that replaying it trains the same run from the start. Where the run came from (the
        checkpoint it continued, the file its config was read from) is its provenance's, not a value a replay
        would act on."""
        values = self.to_dict()
        values.pop("config_source")
        values.pop("fit_to_the_run")
        return {**values, "resume_from": None}


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(Config)}
# keys renamed for what they are: the old name still reads in files, flags, checkpoints and config.yaml (one line
# says so, once a process: ``loading.renamed``)
RENAMED = {
    "lookahead": "periodic_averaging",  # airbench's scheme, not the Lookahead optimizer
    "half_weights": "low_precision_weights",  # with_amp's dtype, bf16 or fp16
    "keep_freed_memory": "reuse_freed_memory",  # glibc's allocator keeps freed memory for reuse
    "select_fraction": "select_hardest_fraction",  # the highest-loss images of each batch
    "select_until": "select_hardest_until",
}
# the keys by topic, as the help pages and docs/configuration.md group them (launch first: a distributed user's
# first need); each topic is a module of its own
TOPICS: tuple[tuple[str, type], ...] = (
    ("Launch: processes, GPUs, nodes", LaunchKeys),
    ("Data", DataKeys),
    ("Augmentation", AugmentationKeys),
    ("Model and training", TrainingKeys),
    ("Speed", SpeedKeys),
    ("Evaluation and outputs: checkpoints, logs, trackers", OutputKeys),
)


def settable_by_topic() -> list[tuple[str, list[str]]]:
    """Each topic's heading and the keys a user sets in it (the internal ones left out), in declaration order."""
    return [
        (heading, [f.name for f in dataclasses.fields(topic) if not FIELDS[f.name].metadata["internal"]])
        for heading, topic in TOPICS
    ]


_FIELD_NAMES = frozenset(FIELDS)
# the keys by role, from the fields (``option``): never written by hand
UNTUNABLE = tuple(
    name
    for name, f in FIELDS.items()
    if not f.metadata["tunable"] or f.metadata["per_tuning_worker"] or f.metadata["internal"]
)
PER_TUNING_WORKER = tuple(name for name, f in FIELDS.items() if f.metadata["per_tuning_worker"])
INHERITED_BY_EVALUATE = tuple(name for name, f in FIELDS.items() if f.metadata["inherited_by_evaluate"])
MAY_CHANGE_ON_RESUME = tuple(
    name
    for name, f in FIELDS.items()
    if f.metadata["may_change_on_resume"] or f.metadata["per_tuning_worker"] or f.metadata["internal"]
)
# key -> (the key, the value) under which alone it takes effect
ONLY_WITH = {name: f.metadata["only_with"] for name, f in FIELDS.items() if f.metadata["only_with"] is not None}


def takes_effect(key: str, settings: Mapping[str, Any]) -> bool:
    """Whether a key takes effect under these settings (a config's replayable values): one declared ``only_with``
    another key's value (powersgd_rank with grad_compression=powersgd) shapes nothing elsewhere."""
    condition = ONLY_WITH.get(key)
    return condition is None or settings.get(condition[0]) == condition[1]


@functools.lru_cache(maxsize=None)
def field_types() -> dict[str, Any]:
    """Config's annotations resolved once (``typing.get_type_hints`` costs 2 ms a call)."""
    return typing.get_type_hints(Config)


def choices(name: str) -> tuple[Any, ...]:
    """The values a ``Literal`` field accepts (() for any other field)."""
    annotation = field_types()[name]
    for candidate in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(candidate) is Literal:
            return typing.get_args(candidate)
    return ()


def check_field(name: str, value: Any) -> None:
    """One field's own rules, declared with it: its choices, its bounds."""
    meta = FIELDS[name].metadata
    if value is None or value in meta["also_accepts"] or isinstance(value, (bool, dict, TrialSpec)):
        return
    accepted = choices(name)
    if accepted and value not in accepted:
        words = meta["choices_in_words"] or f"one of {', '.join(map(str, accepted))}"
        shown, verdict = (f"'{value}'", "is unknown") if isinstance(value, str) else (value, "is not accepted")
        close = (
            difflib.get_close_matches(value.lower(), [str(choice) for choice in accepted], n=1, cutoff=0.6)
            if isinstance(value, str)
            else []
        )
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UserError(f"{name}={shown} {verdict}: {hint}choose {words}")
    bounds = meta["bounds"]
    if bounds is not None and not bounds.accepts(value):
        raise UserError(f"{name}={value} must be {bounds.describe(isinstance(value, int))}")
    if name == "run_name" and not _is_plain_name(value):
        raise UserError(f"run_name='{value}' must be a plain folder name")


def _is_plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name

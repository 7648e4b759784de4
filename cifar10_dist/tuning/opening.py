"""A study opened: tune's options checked, its storage as a URL every process can open, its sampler (reseeded
on a rerun), its pruner as plain data, and the study created, or joined when another worker made it with the same
base config and space (what they share is recorded in the study itself)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from cifar10_dist.config import FIELDS, PER_TUNING_WORKER, PRUNERS, Config, PrunerSpec, commands, takes_effect
from cifar10_dist.errors import UserError
from cifar10_dist.training.loop.trials import JOURNAL_PREFIX, make_pruner, open_storage, require_optuna
from cifar10_dist.tuning.search_space import Dimension

SAMPLERS = ("tpe", "random", "grid")
RECORD = "cifar10_dist"  # the study's user attribute holding its base config, space and folder


TuneOptions = commands.TuneFlags  # what tune is asked to do: its flags' record, declared once in config.commands


def check_options(options: TuneOptions) -> TuneOptions:
    """tune's flags checked before anything starts."""
    if not options.study or "/" in options.study or options.study in (".", ".."):
        raise UserError(f"study='{options.study}' must be a plain name (it is also the folder under output_path)")
    for name, value, minimum in (
        ("trials", options.trials, 0),
        ("heartbeat", options.heartbeat, 1),
        ("pruner_startup_trials", options.pruner_startup_trials, 0),
        ("pruner_warmup_epochs", options.pruner_warmup_epochs, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise UserError(f"{name}={value!r} must be a whole number >= {minimum}")
    if options.sampler not in SAMPLERS:
        raise UserError(f"sampler='{options.sampler}' is unknown: choose one of {', '.join(SAMPLERS)}")
    if options.pruner not in PRUNERS:
        raise UserError(f"pruner='{options.pruner}' is unknown: choose one of {', '.join(PRUNERS)}")
    return options


def storage_url(storage: str | None, study_dir: Path) -> str:
    """The storage as a URL that every process can open: SQLite in the study folder by default; a journal file
    path made absolute."""
    if storage is None:
        return f"sqlite:///{(study_dir / 'study.db').resolve()}"
    if storage.startswith(JOURNAL_PREFIX):
        return JOURNAL_PREFIX + str(Path(storage[len(JOURNAL_PREFIX) :]).expanduser().resolve())
    if "://" not in storage:
        raise UserError(
            f"storage='{storage}' is not accepted: give journal:PATH, sqlite:///PATH, or a database URL "
            "such as postgresql://user@host/db"
        )
    return storage


def make_sampler(options: TuneOptions, space: Mapping[str, Dimension], trials_so_far: int = 0) -> Any:
    """The study's sampler; a seeded one seeded with (sampler_seed, the trials the study already holds), so that a
    rerun after a stop draws on from where the study is (the same draws for the same history) instead of
    repeating the first run's values."""
    optuna = require_optuna()
    seed = None if options.sampler_seed is None else options.sampler_seed + RESEED_STEP * trials_so_far
    if options.sampler == "grid":
        return optuna.samplers.GridSampler({name: dim.grid() for name, dim in space.items()}, seed=seed)
    if options.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


RESEED_STEP = 1_000_003  # a rerun's seed: sampler_seed + this x the trials so far (apart from other workers' seeds)


def pruner_spec(options: TuneOptions, num_epochs: int) -> PrunerSpec:
    """The study's pruner as plain data, which each trial's processes build again."""
    return PrunerSpec(
        name=options.pruner,
        startup_trials=options.pruner_startup_trials,
        warmup_epochs=options.pruner_warmup_epochs,
        max_epochs=num_epochs,
    )


def study_record(base: Config, space: Mapping[str, Dimension]) -> dict[str, Any]:
    """What every worker of a study must share: the base config and the space (kept in the study)."""
    return {"base_config": base.to_dict(), "space": {name: dataclasses.asdict(dim) for name, dim in space.items()}}


def open_study(options: TuneOptions, base: Config, space: Mapping[str, Dimension]) -> tuple[Any, str]:
    """Create the study, or join it when another worker made it with the same base config and space."""
    optuna = require_optuna()
    study_dir = Path(base.output_path) / str(options.study)
    url = storage_url(options.storage, study_dir)
    sampler, pruner = make_sampler(options, space), make_pruner(pruner_spec(options, base.num_epochs))
    study = optuna.create_study(
        storage=open_storage(url, options.heartbeat),
        study_name=options.study,
        direction="maximize",
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    record = json_roundtrip({**study_record(base, space), "study_dir": str(study_dir.resolve())})
    if RECORD not in study.user_attrs:  # one attribute, written at once: a worker joining now sees all or none
        study.set_user_attr(RECORD, record)
    _check_same_study(study_of(study), record, str(options.study))  # also catches a different worker writing at once
    held = len(study.get_trials(deepcopy=False))
    if held and options.sampler_seed is not None:
        study.sampler = make_sampler(options, space, held)
    return study, url


def study_of(study: Any) -> dict[str, Any]:
    """What the study records about itself: base_config, space and study_dir."""
    return study.user_attrs[RECORD]


def json_roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _check_same_study(stored_record: Mapping[str, Any], record: Mapping[str, Any], name: str) -> None:
    """Every worker trains the same thing: base config (but for the keys set per worker: PER_TUNING_WORKER) and space as
    the study records."""
    for part in ("base_config", "space"):
        stored = stored_record.get(part, {})
        for key in sorted(set(stored) | set(record[part])):
            if part == "base_config" and key in PER_TUNING_WORKER:
                continue
            if part == "base_config" and key not in stored and record[part][key] == FIELDS[key].default:
                continue  # a key newer than the study, at its default: the study trained with that too
            if part == "base_config" and not (takes_effect(key, stored) or takes_effect(key, record[part])):
                continue  # e.g. powersgd_rank where neither trains with PowerSGD
            if stored.get(key) != record[part].get(key):
                raise UserError(
                    f"study '{name}' was created with another {part.replace('_', ' ')}: {key} is "
                    f"{stored.get(key)!r} there and {record[part].get(key)!r} here (use the same "
                    "--config, --space and flags in every worker, or another --study)"
                )

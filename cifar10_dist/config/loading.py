"""Building a Config: defaults < YAML file (``--config``) < keyword overrides (command line or Python), each value
converted to its field's type or refused in one line, unknown keys with "did you mean". Values the user did not
set that a shorter or accumulated run leaves no room for are noted in ``fit_to_the_run``, never rewritten here:
the planner fits them (``training.setup.config_fitting``)."""

from __future__ import annotations

import difflib
import json
import logging
import math
import re
import sys
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Any, Collection, Literal

import yaml

from cifar10_dist.config.fields import FIELDS, LIST_FIELDS, RENAMED, Config, field_types
from cifar10_dist.config.rules import absolute_model_reference, validate
from cifar10_dist.config.trial import TrialSpec
from cifar10_dist.config.yaml_files import YamlMapping, config_path, read_yaml_file, source_of, unread_namesake
from cifar10_dist.errors import UserError


def load_config(
    config_file: str | Path | None = None, *, given: Collection[str] | None = None, **overrides: Any
) -> Config:
    """Build and validate a Config: defaults, then the YAML file, then ``overrides``. ``given``: the keys the user
    set explicitly (default: all of ``overrides``); the others may be fitted to the run by the planner
    (``fit_to_the_run``)."""
    path = config_path(config_file) if config_file is not None else None
    file = read_yaml_file(path) if path is not None else None
    try:
        return _built(file, overrides, set(overrides if given is None else given), config_file)
    except UserError as error:
        if file is None:
            raise
        raise located(error, file, overrides) from error


def _built(file: YamlMapping | None, overrides: dict[str, Any], explicit: set[str], config_file: Any) -> Config:
    """The Config of defaults < the file's values < ``overrides``, with what the planner is to fit noted,
    validated."""
    from_file = renamed(file.values) if file is not None else {}
    overrides = renamed(overrides)
    explicit = {RENAMED.get(key, key) for key in explicit}
    values = {**from_file, **overrides}
    if file is not None:  # where the values came from: the file read, never one a file names
        values["config_source"] = source_of(file.path).to_dict()
        _note_an_unread_namesake(str(config_file), file.path)
    for key in values:
        _check_known(key)
    typed = {key: _coerce(key, value) for key, value in values.items()}
    if "model" in typed:
        typed["model"] = absolute_model_reference(typed["model"])
    to_fit = {
        **_checkpoints_after_steps(typed, values, explicit, config_file),
        **_warmup_within_a_shorter_run(typed, from_file, values, explicit, config_file),
    }
    typed["fit_to_the_run"] = to_fit or None  # (a config given whole is noted afresh)
    config = Config(**typed)
    validate(config)
    return config


_SAID_RENAMED: set[str] = set()


def renamed(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each key of an older release under its new name (``fields.RENAMED``), said once a process;
    one line where a key is given under both names."""
    found = {}
    for key, value in values.items():
        new = RENAMED.get(key)
        if new is None:
            found[key] = value
            continue
        if new in values:
            raise UserError(f"'{key}' and '{new}' are the same key ({key} is its old name): give it once, as {new}")
        if key not in _SAID_RENAMED:
            _SAID_RENAMED.add(key)
            note(f"config key '{key}' is now '{new}': the old name still works; write {new} from now on")
        found[new] = value
    return found


def located(error: UserError, file: YamlMapping, overrides: Collection[str]) -> UserError:
    """The error with the file and line of the keys it names that the file set (and no flag changed) before it:
    'my.yaml line 3: num_epochs=0 must be ...'. Keys named as ``key=`` or 'key' count first, then as words; an
    error that names none of the file's keys is returned as it was."""
    message = str(error)
    lines = {RENAMED.get(key, key): line for key, line in file.lines.items()}
    keys = [key for key in lines if key not in overrides and RENAMED.get(key, key) not in overrides]
    named = sorted(
        (match.start(), key)
        for key in keys
        for match in [re.search(rf"(?<![\w.-]){re.escape(key)}=|'{re.escape(key)}'", message)]
        if match
    ) or sorted(
        (match.start(), key) for key in keys for match in [re.search(rf"\b{re.escape(key)}\b", message)] if match
    )
    if not named:
        return error
    found = sorted({lines[key] for _, key in named})
    where = f"line {found[0]}" if len(found) == 1 else f"lines {', '.join(map(str, found[:-1]))} and {found[-1]}"
    return type(error)(f"{file.path} {where}: {message}")


def located_in_its_file(error: UserError, config: Config) -> UserError:
    """``located`` for an error found after loading (before launch): the keys whose value is still the config
    file's (no flag changed them) count, read again from the file the config names; as it was where there is none
    or it cannot be read now."""
    if config.config_source is None:
        return error
    try:
        file = read_yaml_file(Path(config.config_source["path"]))
        changed = [key for key, value in file.values.items() if not _still(config, key, value)]
    except UserError:
        return error
    return located(error, file, changed)


def _still(config: Config, key: str, value: Any) -> bool:
    """Whether the config holds the file's ``value`` for ``key``."""
    key = RENAMED.get(key, key)
    if key not in FIELDS:
        return False
    try:
        coerced = _coerce(key, value)
    except UserError:
        return False
    return getattr(config, key) == (absolute_model_reference(coerced) if key == "model" else coerced)


def _note_an_unread_namesake(given: str, path: Path) -> None:
    """One line when ``--config=demo`` reads the shipped demo (``path``) while a demo.yaml lies in the working
    folder."""
    namesake = unread_namesake(given, path)
    if namesake is not None:
        note(
            f"--config={given} is the shipped config of that name; the {namesake} in this folder is not read "
            f"(--config=./{namesake} reads it)"
        )


def _checkpoints_after_steps(
    typed: dict[str, Any], values: dict[str, Any], explicit: set[str], config_file: Any
) -> dict[str, Any]:
    """A checkpoint_every the user did not set (a config file's or the default) that is no multiple of
    accumulation_steps, with where it came from: the planner rounds it up (``config_fitting``); one set
    explicitly is refused by ``validate`` instead."""
    steps = typed.get("accumulation_steps", FIELDS["accumulation_steps"].default)
    every = typed.get("checkpoint_every", FIELDS["checkpoint_every"].default)
    if "checkpoint_every" in explicit or steps < 1 or every < 1 or every % steps == 0:
        return {}  # fits, set by the user, or validate() names a bad value
    given_by = "the config given" if config_file is None else str(config_file)
    return {"checkpoint_every": {"source": "the default" if "checkpoint_every" not in values else f"from {given_by}"}}


def _warmup_within_a_shorter_run(
    typed: dict[str, Any], from_file: dict[str, Any], values: dict[str, Any], explicit: set[str], config_file: Any
) -> dict[str, Any]:
    """A warmup set for a longer run (a config file's, or the default) that a shorter num_epochs leaves no room
    after, with the epochs it was set for and where it came from: the planner scales it to the same share of the
    run (``config_fitting``). ``--num_epochs=1`` on any shipped config, or ``num_epochs: 1`` in a file of a few
    lines, is a smoke test. A warmup given beside num_epochs is refused by ``validate`` instead."""
    if "num_warmup_epochs" in explicit:
        return {}
    if "num_epochs" in explicit:  # the flags shorten the file's run
        planned_epochs, from_the_file = from_file.get("num_epochs"), "num_warmup_epochs" in from_file
    elif "num_warmup_epochs" not in values and "num_epochs" in from_file:  # the file shortens the defaults' run
        planned_epochs, from_the_file = None, False
    else:
        return {}
    warmup = typed.get("num_warmup_epochs", FIELDS["num_warmup_epochs"].default)
    epochs = typed["num_epochs"]
    if not isinstance(warmup, float) or not isinstance(epochs, int) or epochs < 1 or warmup < epochs:
        return {}  # fits, or validate() names a bad value
    planned = _coerce("num_epochs", FIELDS["num_epochs"].default if planned_epochs is None else planned_epochs)
    if planned <= warmup:
        return {}  # the file's own warmup does not fit its own epochs: validate() refuses it
    source = f"from {config_file}" if from_the_file else "the default"
    return {"num_warmup_epochs": {"source": source, "planned_epochs": planned}}


def note(message: str) -> None:
    """An INFO line about the config, before any run logs: through the package's logger when the caller set it up,
    else on stderr in the runs' format."""
    package_logger = logging.getLogger("cifar10_dist")
    if package_logger.handlers:
        package_logger.info(message)
    else:
        print(f"{datetime.now():%H:%M:%S} INFO {message}", file=sys.stderr)


def _check_known(key: str) -> None:
    if key in FIELDS:
        return
    settable = [name for name, field in FIELDS.items() if not field.metadata["internal"]]
    close = difflib.get_close_matches(key, settable, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else "run with --help to list the valid keys"
    raise UserError(f"unknown config key '{key}': {hint}")


def _field_type(name: str) -> tuple[type, bool]:
    """(base type, accepts None) of a field, from its annotation (a ``Literal``'s base: the type of its values)."""
    annotation = field_types()[name]
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if type(None) not in args:
            return args[0], False  # bool | str: a bool, or one of the field's ``also_accepts`` words
        (annotation,), optional = [arg for arg in args if arg is not type(None)], True
    if typing.get_origin(annotation) is Literal:
        return type(typing.get_args(annotation)[0]), optional
    return annotation, optional


def _coerce(name: str, value: Any) -> Any:
    """Convert a YAML/command-line value to the field's type, or raise a UserError naming both."""
    base, optional = _field_type(name)
    also = FIELDS[name].metadata["also_accepts"]
    if isinstance(value, str) and value.lower() in also:
        return value.lower()
    if value is True and "true" in also:  # fire reads --pretrained=true as a bool
        return "true"
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise UserError(f"{name}=None is not accepted: expected {base.__name__}")
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _finite(name, float(value))
    elif base is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)  # fire turns --run_name=7 into the int 7
        if name in LIST_FIELDS and isinstance(value, (list, tuple)):
            return ",".join(str(item) for item in value)  # fire turns --lr_milestones=30,60 into (30, 60)
    elif base is dict:
        return _json_object(name, value)
    elif base is TrialSpec:
        return TrialSpec.from_mapping(value)
    type_name = " or ".join([base.__name__, *also, *(["None"] if optional else [])])
    raise UserError(f"{name}={value!r} has the wrong type: expected {type_name}{_read_as_text(value, base)}")


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise UserError(f"{name}={value} is not a finite number: give one such as {FIELDS[name].default}")
    return value


def _read_as_text(value: Any, base: type) -> str:
    """Where a number became text (YAML 1.1 reads 1e3 and 1e-3 as strings: its floats need a dot and a signed
    exponent), how to write it so that it is read as one."""
    if base not in (int, float) or not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    if base is int:
        written = str(int(number)) if number.is_integer() else ""
    else:
        written = yaml.safe_dump(number).split("\n")[0]
    return f" (YAML reads {value} as text; write {written})" if written else ""


def _json_object(name: str, value: Any) -> dict[str, Any]:
    """A mapping as given (fire and YAML parse one), or a JSON object text, made of JSON values only."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise UserError(
                f"{name}={value!r} is not valid JSON ({error.msg}): give an object, e.g. '{{\"width\": 64}}'"
            ) from error
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise UserError(f"{name}={value!r} must be a JSON object with string keys, e.g. '{{\"width\": 64}}'")
    try:
        return json.loads(json.dumps(value, allow_nan=False))  # plain, finite JSON values only (config.yaml and
        # checkpoints keep them)
    except (TypeError, ValueError) as error:
        raise UserError(f"{name}={value!r} holds a value JSON cannot carry: {error}") from error

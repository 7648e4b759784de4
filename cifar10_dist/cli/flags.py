"""The command line's words before fire reads them: every command's own flags (declared where each command's job
is), a mistyped flag matched against what the command takes, a switch before a path kept a switch, and a quiet
end when the reader of our output went away. Plain data and strings: no torch."""

from __future__ import annotations

import sys
from typing import Any

from cifar10_dist.config import commands
from cifar10_dist.errors import UserError


def declared_flags() -> dict[str, tuple[commands.Flag, ...]]:
    """Every command's own flags, declared where each command's job is (``config.commands``, ``config.lr_sweep``,
    ``config.export_flags``)."""
    from cifar10_dist.config import LrSweep
    from cifar10_dist.config.export_flags import EXPORT_FLAGS, Quantization
    from cifar10_dist.config.lr_sweep import OUTPUT_DIR

    return {
        "run": (),
        "lr-find": (*commands.flags_of(LrSweep), OUTPUT_DIR),
        "batch-size": commands.BATCH_SIZE,
        "evaluate": commands.EVALUATE,
        "predict": commands.PREDICT,
        "export": (*EXPORT_FLAGS, *commands.flags_of(Quantization)),
        "tune": commands.TUNE,
        "prepare-data": commands.PREPARE_DATA,
        "report": commands.REPORT,
        "doctor": commands.DOCTOR,
        "config": commands.CONFIG,
    }


def command_flags() -> dict[str, tuple[str, ...]]:
    """Every command's own flags by name (what a mistyped flag's suggestion looks in)."""
    return {name: tuple(one.name for one in flags) for name, flags in declared_flags().items()}


def check_keys(command: str, given: dict[str, Any], *declared: Any) -> None:
    """A command that takes config keys: a flag that is neither its own nor a key, refused in one line
    (``commands.refuse_unknown_keys``)."""
    commands.refuse_unknown_keys(command, given, *declared, elsewhere=command_flags())


KEY_COMMANDS = ("run", "lr-find", "batch-size", "evaluate", "tune", "config")  # those that also take config keys


TRUE_WORDS = {"true", "yes", "1"}
BOOLEAN_WORDS = TRUE_WORDS | {"false", "no", "0"}


def switches_alone(argv: list[str]) -> list[str]:
    """A switch given bare (``--json``, ``--raw_weights``, ``--overwrite``: a flag of the command or a config key
    whose default is True or False) stays a switch when a path or word follows it: fire would take
    ``--json img.png`` as json="img.png"; here it becomes ``--json=True img.png``. ``--json false`` keeps its
    word."""
    from cifar10_dist.config import FIELDS, RENAMED

    command = argv[0]
    switches = {one.name for one in declared_flags().get(command, ()) if isinstance(one.default, bool)}
    if command in KEY_COMMANDS:
        switches |= {name for name, field in FIELDS.items() if isinstance(field.default, bool)}
        switches |= {old for old, new in RENAMED.items() if isinstance(FIELDS[new].default, bool)}
    fixed, words = argv[:1], iter(argv[1:])
    for arg in words:
        bare = arg.startswith("--") and "=" not in arg and arg[2:] in switches
        following = next(words, None) if bare else None
        if following is None or following.startswith("-"):
            fixed += [arg] if following is None else [arg, following]  # (fire reads a bare switch as True)
        elif following.lower() in BOOLEAN_WORDS:  # --json false: the switch's value, read as fire would not
            fixed.append(f"{arg}={following.lower() in TRUE_WORDS}")
        else:
            fixed += [f"{arg}=True", following]
    return fixed


def one_config(argv: list[str]) -> None:
    """``--config`` given twice (fire would take the last, without a word: a user may expect the two files merged)
    or bare (fire would make it True), refused in one line each. Other flags keep the last value given, as argparse
    does, so that a script can append one to a list of common flags."""
    from cifar10_dist.config import shipped_configs

    words = argv[1:]
    given = []
    for index, arg in enumerate(words):
        if arg == "--config" or arg.startswith("--config="):
            following = words[index + 1] if index + 1 < len(words) else None
            bare = arg == "--config" and (following is None or following.startswith("-"))
            given.append(None if bare else arg.partition("=")[2] if "=" in arg else following)
    if len(given) > 1:
        values = f" ({given[0]}, then {given[1]})" if None not in given[:2] else ""
        times = "twice" if len(given) == 2 else f"{len(given)} times"
        raise UserError(f"--config is given {times}{values}: give one config file (flags change its keys)")
    if given == [None] or given == [""]:
        raise UserError(
            "--config needs a value: the name of a shipped config "
            f"({', '.join(shipped_configs())}) or the path of a YAML file, e.g. --config=demo"
        )


EXIT_CLOSED_PIPE = 141  # what a shell reads for a process ended by SIGPIPE (128 + 13), as git's or ls's


def closed_pipe() -> int:
    """The reader of our output went away (``... | head -1``): stop quietly, as git or ls do. What is still
    buffered for stdout goes nowhere (stdout now points to /dev/null, so the interpreter's last flush has no
    pipe to break); the exit code is a SIGPIPE death's."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file (a notebook's, a test's capture): nothing to redirect
        pass
    return EXIT_CLOSED_PIPE

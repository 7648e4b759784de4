"""What ``cifar10-dist ARGS`` does around the command it names: ``--version``, the help pages, an unknown
command, the switches put before paths, then fire calls the command (``subcommands``) and its errors become one
line and an exit code."""

from __future__ import annotations

import difflib
import gc
import sys

import fire

from cifar10_dist.cli import help_pages, subcommands
from cifar10_dist.cli.flags import closed_pipe, one_config, switches_alone
from cifar10_dist.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, AlreadyReported, Interrupted, Preempted, UserError
from cifar10_dist.launch import start_method

COMMANDS = {
    "run": subcommands.run,
    "lr-find": subcommands.lr_find,
    "batch-size": subcommands.batch_size,
    "evaluate": subcommands.evaluate,
    "predict": subcommands.predict,
    "export": subcommands.export,
    "tune": subcommands.tune,
    "prepare-data": subcommands.prepare_data,
    "report": subcommands.report,
    "doctor": subcommands.doctor,
    "config": subcommands.show_config,
}


def _help_text(argv: list[str]) -> str | None:
    """Our own help (fire's cannot list options passed through **overrides): a page, or one key's
    (``--help=KEY``)."""
    asks_help = any(arg in ("-h", "--help") for arg in argv)
    asked_key = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--help=")), None)
    if not argv or ((asks_help or asked_key) and argv[0] not in COMMANDS):
        return help_pages.main_help(help_pages.page_width())
    if asked_key is not None:
        return help_pages.key_page(_known_key(asked_key.removeprefix("--")))
    if asks_help:
        return help_pages.page(argv[0])
    return None


def _known_key(name: str) -> str:
    """A config key, or one line naming the closest (as an unknown flag gets)."""
    from cifar10_dist.config import FIELDS, RENAMED

    name = RENAMED.get(name, name)
    if name in FIELDS and not FIELDS[name].metadata["internal"]:
        return name
    settable = [key for key, field in FIELDS.items() if not field.metadata["internal"]]
    close = difflib.get_close_matches(name, settable, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise UserError(f"--help={name}: no config key of that name: {hint}run --help lists them by topic")


def run_and_exit() -> None:
    """The console script and ``python -m cifar10_dist``: ``main()``'s code as the exit status. What the run's
    imports created is frozen out of the garbage collector first: the interpreter's exit would otherwise walk it
    all, about 1 s of a core (a process importing what a run imports: 5.55 s of CPU, 4.51 s frozen, best of 5 on
    the 2-core AVX2-only EPYC); atexit handlers, threads and module teardown run as before, and only cyclic
    garbage is left to the operating system. The workers' forkserver and resource tracker end before it does."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = closed_pipe()
    start_method.stop_servers()
    gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    """What ``cifar10-dist ARGS`` does, with ``argv`` as ARGS; returns the exit code (``run_and_exit`` makes it
    the process's)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"cifar10-dist {sys.modules['cifar10_dist'].__version__}")  # (this package, imported already)
        return 0
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    try:
        help_text = _help_text(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    if help_text is not None:
        try:
            print(help_text, flush=True)
        except BrokenPipeError:
            return closed_pipe()
        return 0
    if argv[0] not in COMMANDS:
        print(f"error: unknown command '{argv[0]}': choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USER_ERROR
    argv = switches_alone(argv)
    try:
        one_config(argv)
        fire.Fire(COMMANDS, command=argv, name="cifar10-dist")
    except UserError as error:
        if debug:
            raise
        if isinstance(error, Preempted):  # an orderly stop, as Ctrl-C's: no "error:"
            print(error, file=sys.stderr)
        elif not isinstance(error, AlreadyReported):
            print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except Interrupted as interrupt:
        if debug:
            raise
        print(interrupt, file=sys.stderr)
        return interrupt.exit_code
    except KeyboardInterrupt as late:  # Ctrl-C before the run could handle it (start-up, data loading in a launcher)
        if debug:
            raise
        if isinstance(late.__context__, Interrupted):  # a further Ctrl-C while the stopped run was cleaning up
            print(late.__context__, file=sys.stderr)
            return late.__context__.exit_code
        print("interrupted (Ctrl-C) before the run could take it in hand: no checkpoint was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except fire.core.FireExit as exit_request:
        return int(exit_request.code or 0)
    except BrokenPipeError:
        return closed_pipe()
    return 0

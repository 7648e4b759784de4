"""The command line as a user meets it: help, exit codes, one-line errors, nothing left behind."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import re
import textwrap

import pytest

from cifar10_dist.config import FIELDS, Config
from cifar10_dist.config.fields import settable_by_topic
from tests.conftest import (
    REPO,
    TINY,
    assert_same_training_state,
    cli_env,
    job_script_environment,
    require_servable,
    run_forked,
    run_in_this_process,
    run_new_interpreter,
)


@pytest.mark.parametrize("command", ["run", "evaluate"])
def test_help_lists_every_option_by_topic_with_default_and_a_few_words_and_help_key_tells_the_rest(command):
    from cifar10_dist.cli import help_pages

    result = run_in_this_process(command, "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # (wrapped lines joined)
    for heading, names in settable_by_topic():
        assert f"{heading}:" in result.stdout
        for name in names:
            assert f"--{name}={help_pages.shown_default(name)} {FIELDS[name].metadata['short']}" in text, name
    for field in dataclasses.fields(Config):
        if field.metadata["internal"]:  # trial: set by tune itself
            assert f"--{field.name}=" not in result.stdout
            continue
        story = run_in_this_process(command, f"--help={field.name}")
        assert story.returncode == 0 and field.metadata["help"] in " ".join(story.stdout.split())


def test_run_help_fits_80_columns_piped_and_shows_usage_and_launch_keys_in_its_first_24_lines():
    page = run_forked("run", "--help", env={**cli_env(), "COLUMNS": "80"})  # (stdout a pipe: no terminal)
    lines = page.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    first = "\n".join(lines[:24])
    assert first.startswith("Usage: cifar10-dist run ")
    assert all(f"--{name}=" in first for name in settable_by_topic()[0][1])  # launch: backend ... dist_timeout
    narrow = run_in_this_process("run", "--help")
    assert narrow.returncode == 0


def test_help_for_one_key_names_the_closest_when_misspelt_and_lists_the_models_for_model():
    wrong = run_in_this_process("run", "--help=lerning_rate")
    assert (wrong.returncode, wrong.stderr) == (
        2,
        "error: --help=lerning_rate: no config key of that name: did you mean 'learning_rate'? run --help lists them "
        "by topic\n",
    )
    model = run_in_this_process("run", "--help=model")
    assert "Built in: airbench, cifar_resnet18, cifar_resnet34, cifar_resnet50, simple_cnn." in model.stdout
    assert "timm:NAME" in model.stdout and "path/to/file.py:factory" in model.stdout


def test_config_list_gives_each_shipped_config_a_whole_first_sentence():
    listed = run_in_this_process("config", "--list")
    assert listed.returncode == 0
    text = " ".join(listed.stdout.split())
    assert "demo A one-minute demo on 2 CPU cores. " in text
    assert "fast Fast recipe after Keller Jordan's airbench94 (arXiv 2404.00498), in this project's structure. " in text
    assert not any(line.rstrip().endswith(":") for line in listed.stdout.splitlines())


def test_prepare_data_and_top_level_help():
    top = run_forked("--help")
    assert top.returncode == 0 and "prepare-data" in top.stdout and "evaluate" in top.stdout
    prepare = run_forked("prepare-data", "--help")
    assert prepare.returncode == 0 and "--synthetic=None" in prepare.stdout and "--data_path=cifar10" in prepare.stdout


def test_debug_shows_the_traceback(tmp_path):
    result = run_forked("run", "--bacth_size=8", "--debug", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "UserError: unknown config key 'bacth_size'" in result.stderr


def test_config_prints_the_resolved_config_as_yaml_that_run_takes_back(tmp_path):
    """`cifar10-dist config`: defaults < file < flags, validated, as YAML; the file it prints resolves to the same
    Config; a bad value is the same one line as for run."""
    from cifar10_dist.config import load_config

    fast = REPO / "configs" / "fast.yaml"
    printed = run_in_this_process("config", f"--config={fast}", "--batch_size=256", "--seed=3")
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "mine.yaml").write_text(printed.stdout)
    again = load_config(tmp_path / "mine.yaml")
    assert again == load_config(fast, batch_size=256, seed=3)
    assert again.batch_size == 256 and again.model == "airbench" and printed.stdout.startswith("dataset: cifar10\n")
    refused = run_in_this_process("config", "--batch_size=0")
    assert refused.returncode == 2 and refused.stderr == "error: batch_size=0 must be at least 1\n"


@pytest.mark.slow  # a fresh interpreter to compare with
def test_the_test_cli_server_runs_a_command_as_a_fresh_interpreter_does(tmp_path):
    """tests/cli_server.py forks most of the tests' CLI processes from an interpreter that imported torch once:
    each gets the exit code, output, folder and import path (a module beside it, PYTHONPATH) that
    ``python -m cifar10_dist`` gets in a new interpreter."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "there.py").write_text("def Net(num_classes=10):\n    return None\n")
    (tmp_path / "here.py").write_text("from there import Net\n")  # here beside the run, there on PYTHONPATH
    env = {**cli_env(), "PYTHONPATH": f"{elsewhere}{os.pathsep}{cli_env()['PYTHONPATH']}"}
    require_servable(env)  # (PYTHONPATH: the server sets it in each child)
    for command in [("run", "--model=here:Net"), ("run", "--batch_size=0")]:
        served = run_forked(*command, "--data_path=nowhere", cwd=tmp_path, env=env)
        fresh = run_new_interpreter(*command, "--data_path=nowhere", cwd=tmp_path, env=env)
        assert (served.returncode, served.stdout, served.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
        assert served.returncode == 2 and served.stderr.count("\n") == 1, served.stderr
        if "Net" in command[1]:  # imported: the factory was called
            assert "the factory returned a NoneType, not a torch.nn.Module" in served.stderr, served.stderr


ENDINGS = """
import atexit, sys, threading, time

atexit.register(print, "exit handler ran")
threading.Thread(target=lambda: (time.sleep(0.2), print("thread ended"))).start()  # (not a daemon: joined)
sys.stdout.write("written, not flushed; ")
how = sys.argv[1]
if how == "exit with text":
    sys.exit("bye")
if how == "exit 3":
    sys.exit(3)
if how == "raise":
    raise RuntimeError("boom")
if how == "ctrl-c":
    raise KeyboardInterrupt
"""


@pytest.mark.parametrize("how", ["return", "exit with text", "exit 3", "raise", "ctrl-c"])
def test_a_served_process_ends_as_a_new_interpreter_ends(tmp_path, how):
    """A served process skips Python's teardown (tests/cli_server.py: run_then_exit), and nothing else: the exit
    status of each way to end, a thread that outlives the module, exit handlers and text not yet flushed are those
    of ``python -m`` in a new interpreter (without torch: a few milliseconds)."""
    (tmp_path / "endings.py").write_text(ENDINGS)
    served = run_forked(how, module="endings", cwd=tmp_path)
    fresh = run_new_interpreter(how, module="endings", cwd=tmp_path)
    code, last_line = {
        "return": (0, None),
        "exit with text": (1, "bye"),
        "exit 3": (3, None),
        "raise": (1, "RuntimeError: boom"),
        "ctrl-c": (-2, "KeyboardInterrupt"),  # (killed by SIGINT, as Python ends after an unhandled Ctrl-C)
    }[how]
    assert served.returncode == fresh.returncode == code, (served, fresh)
    assert served.stdout == fresh.stdout == "written, not flushed; thread ended\nexit handler ran\n"
    if last_line is None:
        assert served.stderr == fresh.stderr == ""
    else:  # (a traceback's frames above it differ: runpy's and the server's)
        assert served.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == last_line, served.stderr


@pytest.mark.slow  # a fresh interpreter and its spawned workers
def test_a_served_spawned_run_trains_exactly_as_a_fresh_interpreters_does(spawned_run, small_dataset, tmp_path):
    """The served 2-process run of conftest.spawned_run (its forkserver forked from the served process) and the
    same command in a new interpreter (its own hash seed, its forkserver a new interpreter too): bit-identical
    weights and optimizer state, and the same metrics.jsonl but for the timings."""
    served, served_output = spawned_run
    assert served.returncode == 0, served.stderr[-3000:]
    fresh = run_new_interpreter(
        "run",
        *TINY,
        "--backend=gloo",
        "--nproc_per_node=2",
        "--checkpoint_every=5",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    (served_dir,), (fresh_dir,) = served_output.iterdir(), tmp_path.iterdir()
    final = sorted(served_dir.glob("training_checkpoint_*.pt"), key=lambda path: int(path.stem.rsplit("_", 1)[1]))
    assert_same_training_state(final[-1], fresh_dir / final[-1].name)

    def without_timings(run_dir):
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{key: value for key, value in line.items() if key not in TIMINGS} for line in lines]

    assert without_timings(served_dir) == without_timings(fresh_dir)
    assert len(without_timings(served_dir)) >= 4  # epochs and evaluations were compared


TIMINGS = ("epoch_time", "images_per_second", "duration")


def test_the_stand_in_python_of_job_scripts_ends_as_the_command_it_ran(tmp_path):
    """tests/served_python/python: `-m cifar10_dist` forked by the CLI server, anything else run by the real
    interpreter; either way its exit status and streams are the command's. One the server cannot serve is one line
    naming the variable, exit 2, and no new interpreter in its place."""
    import signal
    import subprocess

    env = job_script_environment()
    stand_in = str(REPO / "tests" / "served_python" / "python")
    served = subprocess.run(
        [stand_in, "-m", "cifar10_dist", "run", "--batch_size=0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (served.returncode, served.stderr) == (2, "error: batch_size=0 must be at least 1\n")
    refused = subprocess.run(
        [stand_in, "-m", "cifar10_dist", "run", f"--output_path={tmp_path}"],
        cwd=tmp_path,
        env={**env, "OMP_NUM_THREADS": "3"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith(
        "tests/served_python: the CLI server cannot serve this environment: it differs from the server's in "
        "OMP_NUM_THREADS, read when Python or torch starts"
    )
    assert len(refused.stderr.splitlines()) == 1 and not any(tmp_path.iterdir())  # nothing ran
    passed = subprocess.run(
        [stand_in, "-c", "import sys; print(sys.argv[1:]); sys.exit(5)", "a b"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (passed.returncode, passed.stdout) == (5, "['a b']\n")
    killed = subprocess.run(
        [stand_in, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], env=env, timeout=60
    )
    assert killed.returncode == -signal.SIGTERM


FLAG_LINE = re.compile(r"^  --(\w+)(?:=(\S+))?(?:\s|$)")
API_OF = {
    "lr-find": "lr_find",
    "batch-size": "batch_size",
    "evaluate": "evaluate",
    "predict": "predict_files",
    "export": "export",
    "tune": "tune",
    "prepare-data": "prepare_data",
    "report": "report",
    "doctor": "doctor",
}


def page_flags(command: str) -> dict[str, str | None]:
    """A help page's own flags (before its list of config keys): name -> the default it shows (None: a switch)."""
    from cifar10_dist.cli import help_pages as cli_help

    topics = {f"{heading}:" for heading, _ in settable_by_topic()}
    blocks = [block for block in cli_help.page(command, 80).split("\n\n") if block.split("\n")[0] not in topics]
    return {
        match.group(1): match.group(2)
        for block in blocks
        for line in block.splitlines()
        if (match := FLAG_LINE.match(line))
    }


def shown(value) -> str | None:
    return None if value is False else str(value)


@pytest.mark.parametrize("command", sorted(API_OF))
def test_a_commands_flags_and_defaults_are_the_same_in_its_help_page_cli_and_api(command):
    """What the help page says a flag defaults to is what the CLI and the API do: each command's own flags are
    declared once (config.commands: lr-find's in config.lr_sweep, export's in deployment.exporting, the others' there),
    and the CLI and the API read them there: a flag on the page is the declared one, and a signature's default is
    the declared default."""
    from cifar10_dist import api, cli
    from cifar10_dist.config import commands
    from cifar10_dist.config.lr_sweep import OUTPUT_DIR, LrSweep
    from cifar10_dist.deployment.exporting import EXPORT_FLAGS, Quantization

    declared = {
        "lr-find": (*commands.flags_of(LrSweep), OUTPUT_DIR),
        "export": (*EXPORT_FLAGS, *commands.flags_of(Quantization)),
        "batch-size": commands.BATCH_SIZE,
        "report": commands.REPORT,
        "doctor": commands.DOCTOR,
        "evaluate": commands.EVALUATE,
        "predict": commands.PREDICT,
        "tune": commands.TUNE,
        "prepare-data": commands.PREPARE_DATA,
    }[command]
    on_page = page_flags(command)
    for one in declared:
        assert on_page.get(one.name, "absent") == (one.shown if one.shown is not None else shown(one.default)), one
    cli_parameters = inspect.signature(cli.COMMANDS[command]).parameters
    api_parameters = inspect.signature(getattr(api, API_OF[command])).parameters
    by_name = {one.name: one for one in declared}
    for name, parameter in [*cli_parameters.items(), *api_parameters.items()]:
        if parameter.default is inspect.Parameter.empty or name == "config":
            continue
        if name in cli_parameters:
            assert name in on_page, f"{command}: --{name} is not on its help page"
        if name not in on_page:
            continue  # the API's own (images to calibrate on, a printer)
        if name in by_name:
            assert parameter.default == by_name[name].default, (command, name)
        elif parameter.default is not None and on_page[name] not in ("FILE", "DIR", "PATH", "N", "NAME"):
            assert agree(on_page[name], parameter.default), (command, name, on_page[name], parameter.default)


def agree(on_page: str | None, default) -> bool:
    if on_page == "None" and not default and not isinstance(default, (bool, int, float)):
        return True  # an empty sequence: none
    if isinstance(default, bool) or on_page is None:
        return on_page == shown(default)
    if isinstance(default, (int, float)):
        return float(on_page) == default
    return on_page == str(default)


def written_defaults(place: object) -> dict[str, ast.expr]:
    """The default expressions of a function's parameters or a dataclass's fields, by name, as written."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(place)))
    node = tree.body[0]
    if isinstance(node, ast.ClassDef):
        return {
            item.target.id: item.value
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None
        }
    arguments = node.args
    positional = arguments.args[len(arguments.args) - len(arguments.defaults) :]
    return {
        **{argument.arg: default for argument, default in zip(positional, arguments.defaults)},
        **{
            argument.arg: default
            for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults)
            if default is not None
        },
    }


def test_no_default_of_a_commands_flag_is_written_twice():
    """Where a command's flag is a parameter or a field (its API call, the records and functions that implement
    it), its default is read from the declaration (config.commands, lr_sweep, config.export_flags), never written
    again as a literal: change it there and the CLI, the API, the help page and the code follow."""
    from cifar10_dist import api
    from cifar10_dist.cli.flags import declared_flags
    from cifar10_dist.deployment import inference
    from cifar10_dist.system import doctor

    places = {
        "lr-find": [api.lr_find],
        "batch-size": [api.batch_size],
        "evaluate": [api.evaluate],
        "predict": [api.predict, api.predict_files, inference.probabilities],
        "export": [api.export],
        "tune": [api.tune],
        "prepare-data": [api.prepare_data],
        "report": [api.report],
        "doctor": [api.doctor, doctor.examine],
    }
    declared = declared_flags()
    twice = [
        f"{command}: {place.__qualname__}({name}={ast.unparse(default)})"
        for command, found in places.items()
        for place in found
        for name, default in written_defaults(place).items()
        if name in {one.name for one in declared[command]} and isinstance(default, ast.Constant)
    ]
    assert twice == []


@pytest.mark.parametrize(
    "command, line",
    [
        (["evaluate"], "error: evaluate needs --checkpoint=PATH (cifar10-dist evaluate --help)"),
        (["predict", "x.png"], "error: predict needs --checkpoint=FILE (cifar10-dist predict --help)"),
        (
            ["export"],
            "error: export needs --checkpoint=FILE and --format=safetensors|pt2|onnx|torchscript "
            "(cifar10-dist export --help)",
        ),
        (["tune", "--val_split=0.2"], "error: tune needs --space=FILE and --study=NAME (cifar10-dist tune --help)"),
        (["tune", "--report_only", "--study=s"], None),  # --report_only waives --space
    ],
)
def test_a_required_flag_left_out_is_one_line_naming_every_one_missing(command, line, tmp_path):
    """The flags declared required=True (their usage shows them outside brackets) are checked where every command's
    flags are resolved, not by hand in each command."""
    result = (
        run_in_this_process(*command, f"--output_path={tmp_path}")
        if command[0] == "tune"
        else run_in_this_process(*command)
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last == line if line else "needs --" not in last, last


def test_every_page_shows_debug_and_the_commands_with_config_keys_show_config_once():
    from cifar10_dist.cli import help_pages as cli_help

    for command in cli_help.PAGES:
        flags = page_flags(command)
        assert flags["debug"] is None, command
        assert ("Launch: processes, GPUs, nodes:" in cli_help.page(command)) == ("config" in flags), command
        assert cli_help.page(command).count("  --config=FILE.yaml|NAME ") <= 1

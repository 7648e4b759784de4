"""Shared helpers: tiny synthetic CIFAR-format datasets on disk and running the real CLI in a subprocess."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

# pytest-xdist runs two test processes on the two cores: one torch thread each, and in the processes they start
# (two threads each would spin against each other); set before torch is imported. A file run alone gets the same, so
# that it runs as in the suite (torchrun sets 1 for its workers too: the CLI server, started with this environment,
# serves them). The GPU checks, alone on a machine with a GPU and many cores, keep torch's own thread count
if os.environ.get("PYTEST_XDIST_WORKER") or not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile's inductor compiles in this process, without a pool of new interpreters (one each per core): read
# when inductor's config is imported, so set for the test process and every process it starts alike
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# The files whose tests take longest (seconds of their tests on the 2-core Xeon with AMX, 2026-11-29, longest first),
# collected first, and handed out in that order (``pytest_configure``): pytest-xdist's --dist loadfile hands files
# out in collection order, and in alphabetical order (or by number of tests, xdist's own reordering) a long file
# came last, leaving one worker on it while the other had nothing left to do
LONGEST_FILES = [
    "test_tuning.py",
    "test_launch_modes.py",
    "test_tracker_outage.py",
    "test_compression.py",
    "test_wandb.py",
    "reliability/test_faults.py",
    "test_two_hosts.py",
    "test_predict_export.py",
    "test_hardware.py",
    "test_recipe.py",
    "reliability/test_interrupt.py",
    "test_package.py",
    "test_cli.py",
    "test_gpu_harness.py",
    "reliability/test_exact_resume.py",
    "test_lr_find.py",
    "test_distributed.py",
    "test_pretrained.py",
    "test_imbalance.py",
    "test_notebooks.py",
    "test_int8_export.py",
    "test_image_folders.py",
    "test_readme.py",
    "test_speed_levers.py",
    "test_data_at_scale.py",
]


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist reorders --dist loadfile's files by their number of tests unless told not to (its
    --loadscope-reorder, on by default in 3.8): a file of 8 long tests (test_launch_modes) then started half-way."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The processes a test started in the background ran, at most, until its end: counted so."""
    now = time.monotonic()
    for kind, started in STARTED:
        counted(kind, now - started)
    STARTED.clear()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands its counts to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["cli_runs"] = json.dumps(RUNS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller adds up its workers' counts."""
    for kind, (calls, seconds) in json.loads(getattr(node, "workeroutput", {}).get("cli_runs", "{}")).items():
        counted(kind, seconds, int(calls))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line: how many command-line runs of each kind the tests made, and their seconds."""
    if hasattr(terminalreporter.config, "workerinput"):
        return
    counts = ", ".join(f"{kind} {int(calls)} ({seconds:.0f} s)" for kind, (calls, seconds) in RUNS.items())
    terminalreporter.write_line(f"command-line runs: {counts}")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """LONGEST_FILES' tests first, in that order; the others after them, as collected."""

    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(REPO / "tests").as_posix() if item.path.is_relative_to(REPO / "tests") else ""
        return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: each file's tests keep their order


# A run of seconds: simple_cnn (a quarter as wide as its default: half the CPU of a run) on a few hundred
# synthetic images, no DataLoader workers, and no figures (drawing them took about 0.4 s of a core a run, more than
# its training: the tests of the figures ask for them with --figures=True).
TINY_WIDTH = 8
TINY = [
    "--model=simple_cnn",
    f'--model_kwargs={{"width": {TINY_WIDTH}}}',
    "--batch_size=32",
    "--num_workers=0",
    "--num_epochs=2",
    "--num_warmup_epochs=1",
    "--learning_rate=0.1",
    "--train_eval_size=100",
    "--log_every_iters=5",
    "--channels_last=True",
    "--figures=False",
]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CIFAR10_DIST_DEBUG", None)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# How each test ran the command line, by kind: "in this process" (run_in_this_process), "forked" (from the CLI
# server: run_forked, start_forked, run_torchrun_forked) or "new interpreter" (run_new_interpreter,
# start_new_interpreter); a line at the end of the test run counts them (pytest_terminal_summary)
KINDS = ("in this process", "forked from the CLI server", "new interpreter")
RUNS: dict[str, list[float]] = {kind: [0, 0.0] for kind in KINDS}
STARTED: list[tuple[str, float]] = []  # (kind, start time) of the processes the current test started


def counted(kind: str, seconds: float, calls: int = 1) -> None:
    RUNS[kind][0] += calls
    RUNS[kind][1] += seconds


def run_forked(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None, module: str = "cifar10_dist"
) -> subprocess.CompletedProcess:
    """``python -m cifar10_dist ARGS`` as a user would run it (or ``-m MODULE``, another of the CLI server's
    SERVED_MODULES), forked by this test process's CLI server (tests/cli_server.py: torch imported once); returns
    the CompletedProcess. An environment the server cannot serve fails, naming the variable (run_new_interpreter
    runs it instead)."""
    env = env or cli_env()
    require_servable(env)
    started = time.monotonic()
    process = cli_server().start(list(args), env, cwd, new_session=False, module=module)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    finally:
        counted(KINDS[1], time.monotonic() - started)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_new_interpreter(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None, module: str = "cifar10_dist"
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in a new interpreter (about 5 s of a core of imports): for an environment that
    differs in a variable read at import, or a start-up under test."""
    started = time.monotonic()
    try:
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=cwd,
            env=env or cli_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        counted(KINDS[2], time.monotonic() - started)


_cli_server = None


def require_servable(env: dict[str, str]) -> None:
    """Fail, naming the variable, where the CLI server cannot fork a process with this environment: one that differs
    from the server's in a variable read at import (PYTHONPATH it sets in the child; a hash seed of its own,
    PYTHONHASHSEED, too: it is forked by a server started with that seed). It needs Linux's pidfd_open to learn
    when a child ends."""
    from tests.cli_server import differing_at_import

    ours = cli_env()
    if env.get("PYTHONHASHSEED", "").isdigit():
        env, ours = ({key: value for key, value in e.items() if key != "PYTHONHASHSEED"} for e in (env, ours))
    if not hasattr(os, "pidfd_open"):
        pytest.fail("the CLI server needs Linux's pidfd_open: run this with run_new_interpreter")
    differing = differing_at_import(env, ours)
    if differing:
        pytest.fail(
            f"{differing}={env.get(differing)!r} differs from the CLI server's ({ours.get(differing)!r}) and is read "
            "at import: a forked process would not see it; run this with run_new_interpreter"
        )


def cli_server():
    """This test process's CLI server, started on first use and stopped when the process exits."""
    global _cli_server
    if _cli_server is None or _cli_server.process.poll() is not None:
        import atexit
        import tempfile

        from tests.cli_server import Server

        _cli_server = Server(cli_env(), Path(tempfile.mkdtemp(prefix="cli-server-")))
        atexit.register(_cli_server.stop)
    return _cli_server


def job_script_environment() -> dict[str, str]:
    """The environment a job script under test runs in: the stand-in srun and scontrol (tests/fake_slurm) and a
    stand-in ``python`` (tests/served_python) whose ``-m cifar10_dist`` this test process's CLI server forks, where
    it can, ahead of this interpreter's folder on PATH."""
    folders = [REPO / "tests" / "served_python", REPO / "tests" / "fake_slurm", Path(sys.executable).parent]
    env = {**cli_env(), "PATH": os.pathsep.join([*map(str, folders), os.environ["PATH"]])}
    if hasattr(os, "pidfd_open"):
        env["TEST_CLI_SERVER"] = cli_server().address
    return env


def run_in_this_process(*args: str) -> subprocess.CompletedProcess:
    """``cifar10-dist ARGS`` through the CLI's own entry point in this process (no interpreter and torch start-up:
    seconds saved per call). Only what this process prints is captured: the logs of one process, or of the
    launcher of spawned workers (whose own logs go to the real stderr)."""
    import contextlib
    import io

    from cifar10_dist import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(list(args))
    counted(KINDS[0], time.monotonic() - started)
    return subprocess.CompletedProcess(["cifar10-dist", *args], code, stdout.getvalue(), stderr.getvalue())


def run_log(result: subprocess.CompletedProcess, run_dir: Path) -> str:
    """What a run in this process printed, then rank 0's log from the run folder (run.log): the logs of spawned
    workers reach the real stderr, not ``run_in_this_process``'s capture."""
    log = run_dir / "run.log"
    return result.stderr + (log.read_text() if log.is_file() else "")


def run_torchrun_forked(nproc: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node=NPROC --standalone -m cifar10_dist ARGS`` to its end,
    torchrun and its workers forked by the CLI server (see ``start_forked``)."""
    return to_the_end(start_forked(*args, torchrun=[f"--nproc_per_node={nproc}", "--standalone"]), timeout)


def run_torchrun_new_interpreter(nproc: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``run_torchrun_forked`` with torchrun and its workers new interpreters, as a user runs them."""
    return to_the_end(start_new_interpreter(*args, torchrun=[f"--nproc_per_node={nproc}", "--standalone"]), timeout)


def to_the_end(run: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """A started run's output once it ended (within ``timeout``; stopped with its group whatever happens)."""
    try:
        stdout, stderr = run.communicate(timeout=timeout)
    finally:
        stop_all(run)
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


def free_slurm_job_id() -> str:
    """A job id whose Ignite-derived master port (15000 + last 4 digits) is free right now."""
    for port in range(15000 + 4000, 15000 + 10000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return f"77{port - 15000:04d}"
    pytest.fail("no free port in 15000..24999 for a Slurm-derived master port")


def write_dataset(root: Path, num_train: int, num_test: int, seed: int = 0) -> Path:
    """A synthetic CIFAR-10 in the standard on-disk layout under root; returns root (the data_path)."""
    from cifar10_dist.data import cifar, cifar_layouts
    from cifar10_dist.data.synthetic import make_synthetic

    train, test = make_synthetic(num_train, num_test, seed)
    cifar.write_cifar10(root / cifar_layouts.FOLDER, train, test)
    return root


def made_once(tmp_path_factory, name: str, make: Callable[[Path], object]) -> Path:
    """A session's folder ``name`` filled by ``make(folder)`` once for all pytest-xdist workers (the first to ask
    makes it under a file lock, the others wait and reuse it), or once in this process without xdist."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the parent: one per session
    folder = root / f"made-once-{name}"
    with FileLock(str(root / f"made-once-{name}.lock")):
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    """600 training and 301 test images on disk (301: not divisible by 2 or 3)."""
    return made_once(tmp_path_factory, "cifar", lambda folder: write_dataset(folder, 600, 301))


# TINY for 4 epochs: 600 images, global batch 32, 18 iterations per epoch, 72 in all
LONG = [*TINY, "--num_epochs=4", "--validate_every=4"]
SPAWN_2 = ["--backend=gloo", "--nproc_per_node=2"]


def long_reference_run(data: Path, output: Path, launch: list[str]) -> Path:
    """LONG uninterrupted, checkpoints every 25 iterations (training_checkpoint_50.pt, mid-epoch 3, and _72.pt kept):
    what every interrupted and continued LONG run at that world size must end with, bit for bit
    (checkpoint_every and validate_every do not change the training)."""
    result = run_in_this_process(
        "run",
        *LONG,
        *launch,
        "--checkpoint_every=25",
        f"--data_path={data}",
        f"--output_path={output}",
        "--run_name=reference",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output / "reference"


@pytest.fixture(scope="session")
def long_reference(small_dataset, tmp_path_factory) -> Path:
    """long_reference_run with 1 process: its run folder."""
    return (
        made_once(tmp_path_factory, "long-reference-1", lambda folder: long_reference_run(small_dataset, folder, []))
        / "reference"
    )


@pytest.fixture(scope="session")
def long_spawned_reference(small_dataset, tmp_path_factory) -> Path:
    """long_reference_run with 2 spawned gloo processes: its final checkpoint."""
    return (
        made_once(
            tmp_path_factory, "long-reference-2", lambda folder: long_reference_run(small_dataset, folder, SPAWN_2)
        )
        / "reference"
        / "training_checkpoint_72.pt"
    )


@pytest.fixture(scope="session")
def spawned_run(small_dataset, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The reference distributed run: TINY on small_dataset, 2 spawned gloo processes on one node, with its
    figures; (what the command returned and printed, its output_path)."""

    def run(folder: Path) -> None:
        result = run_forked(
            "run",
            *TINY,
            "--figures=True",
            "--backend=gloo",
            "--nproc_per_node=2",
            "--checkpoint_every=5",
            f"--data_path={small_dataset}",
            f"--output_path={folder / 'output'}",
        )
        (folder / "result.json").write_text(json.dumps([result.returncode, result.stdout, result.stderr]))

    folder = made_once(tmp_path_factory, "spawn", run)
    code, stdout, stderr = json.loads((folder / "result.json").read_text())
    return subprocess.CompletedProcess(["cifar10-dist", "run"], code, stdout, stderr), folder / "output"


# simple_cnn with a sleep before each training step's forward (SLOW_STEP_SECONDS, none where unset): it trains bit
# for bit like simple_cnn, so a run stopped at a chosen point still compares with the simple_cnn references. Under
# torchrun, only the first round sleeps: the workers it restarts after a test killed one have nothing left to wait for
SLOW_CNN = """
import os
import time

from cifar10_dist.models.networks import simple_cnn


def sleep_when_training(module, inputs):
    if module.training and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        time.sleep(float(os.environ.get("SLOW_STEP_SECONDS", "0")))


def slow_cnn(**kwargs):
    model = simple_cnn(**kwargs)
    model.register_forward_pre_hook(sleep_when_training)
    return model
"""
# what a run started in the background to be stopped at a chosen point gets: 0.05 s a step, some 4 s for LONG's 72
# iterations (the tiny CNN alone ran them in under a second, and a signal sent after the first checkpoint
# sometimes came after the run had ended)
SLOWLY = {"SLOW_STEP_SECONDS": "0.05"}


@pytest.fixture(scope="session")
def slow_cnn(tmp_path_factory) -> str:
    """SLOW_CNN as a --model value (it takes simple_cnn's model_kwargs)."""
    path = tmp_path_factory.mktemp("slow-cnn") / "slow_cnn.py"
    path.write_text(SLOW_CNN)
    return f"{path}:slow_cnn"


def start_forked(*args: str, torchrun: list[str] | None = None, env: dict | None = None, stderr: int | None = None):
    """Start ``python -m cifar10_dist ARGS`` (or under torchrun with the given torchrun flags) in the background,
    forked by the CLI server: the server's like of a ``subprocess.Popen``. Under torchrun, the server forks torchrun,
    and torchrun's workers are the stand-in python's (PYTHON_EXEC, torchrun's own setting): forked too, each with a
    hash seed of its own (tests/cli_server.py). An environment the server cannot serve fails, naming the variable.

    It gets a session of its own, so that ``stop_all`` can end it with every process below it. Its stdout and
    stderr are pipes, unless ``stderr`` names a descriptor to give it (a terminal).
    """
    env = {**cli_env(), **(env or {})}
    require_servable(env)
    STARTED.append((KINDS[1], time.monotonic()))
    if not torchrun:
        return cli_server().start(list(args), env, None, new_session=True, stderr=stderr)
    workers = {"PYTHON_EXEC": str(REPO / "tests" / "served_python" / "python"), "TEST_CLI_SERVER": cli_server().address}
    launch = [*torchrun, "-m", "cifar10_dist", *args]
    return cli_server().start(
        launch, {**env, **workers}, None, new_session=True, module="torch.distributed.run", stderr=stderr
    )


def start_new_interpreter(
    *args: str, torchrun: list[str] | None = None, env: dict | None = None, stderr: int | None = None
) -> subprocess.Popen:
    """``start_forked`` in a new interpreter (under torchrun: torchrun and its workers new interpreters, as a user
    runs them)."""
    STARTED.append((KINDS[2], time.monotonic()))
    launcher = [sys.executable, "-m", "torch.distributed.run", *torchrun] if torchrun else [sys.executable]
    return subprocess.Popen(
        [*launcher, "-m", "cifar10_dist", *args],
        env={**cli_env(), **(env or {})},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr is None else stderr,
        text=True,
    )


def wait_for_file(pattern_dir: Path, glob: str, process: subprocess.Popen, timeout: float = 120) -> Path:
    """Wait until a file matching glob appears in pattern_dir (fails if the process ends first)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(pattern_dir.glob(glob)) if pattern_dir.is_dir() else []
        if found:
            return found[0]
        if process.poll() is not None:
            raise AssertionError(
                f"process ended ({process.returncode}) before {glob} appeared: {process.stderr.read()}"
            )
        time.sleep(0.02)
    raise AssertionError(f"{glob} did not appear in {pattern_dir} within {timeout} s")


def assert_same_training_state(path_a: Path, path_b: Path) -> None:
    """Every tensor of model and optimizer state equal (torch.equal), and the same trainer position."""
    import torch

    a = torch.load(path_a, weights_only=True)
    b = torch.load(path_b, weights_only=True)
    assert a["trainer"] == b["trainer"]
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"model {key} differs"
    assert_same_nested(a["optimizer"], b["optimizer"], "optimizer")
    assert a["lr_scheduler"] == b["lr_scheduler"]


def assert_same_nested(a, b, where: str) -> None:
    """Nested dicts/lists of tensors and plain values, equal everywhere (tensors with torch.equal)."""
    import torch

    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for key in a:
            assert_same_nested(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_nested(x, y, f"{where}[{index}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def wait_until(run: subprocess.Popen, reached: Callable[[], bool], why: str, seconds: float = 120) -> None:
    """Poll ``reached`` every 50 ms while the run started by start_forked goes on; fail with ``why`` if it ends or
    ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while not reached():
        assert run.poll() is None and time.monotonic() < deadline, why
        time.sleep(0.05)


def kill_when(run: subprocess.Popen, reached: Callable[[], bool], why: str, seconds: float = 120) -> None:
    """SIGKILL the run's whole process group as soon as ``reached`` (``wait_until``), and reap it."""
    import signal

    wait_until(run, reached, why, seconds)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()


def stop_all(process: subprocess.Popen) -> None:
    """Kill a process started by start_forked (or start_new_interpreter) and everything it started (after a failed
    or timed-out test)."""
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()

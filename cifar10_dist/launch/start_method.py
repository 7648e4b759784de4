"""How spawned workers start, decided without importing torch: fork in a notebook, else a forkserver that
imports torch and the package once (``start_method``), started as early as a run knows it will spawn
(``start_early``), so that the server imports them on one core while the launcher checks the config on the other;
and the rule both spawn and the forkserver impose on a script, its main guard (``require_main_guard``), checked
before anything starts. Also which launcher started this process (``started_by_torchrun``, ``launch_rank``)."""

from __future__ import annotations

import ast
import builtins
import linecache
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from typing import Any

from cifar10_dist.config import NATIVE_BACKENDS, Config
from cifar10_dist.errors import UserError
from cifar10_dist.system.signals import stop_signals

# the worker module (torch, Ignite), what every worker imports on first use (torch._dynamo, by the optimizer's
# constructor: about 1 s of a core; torchvision's datasets and models, filelock) and what rank 0 imports at every
# run (TensorBoard's writer; matplotlib for curves.png and mistakes.png); the forkserver leaves out a module that
# is not installed
PRELOADED = (
    "cifar10_dist.training.run",
    "torch._dynamo",
    "torchvision.datasets",
    "torchvision.models",
    "filelock",
    "torch.utils.tensorboard",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
)


def start_method() -> str:
    """fork in a notebook (its functions stay reachable); elsewhere a forkserver that imported torch and this
    package once, so each worker starts in a fraction of a second instead of importing them again (what spawn
    does, and where there is no forkserver, e.g. on Windows). Workers forked from the server take this process's
    environment, folder and import path from their arguments (``supervision._spawned_entry``), as spawned ones would."""
    if "__IPYTHON__" in builtins.__dict__:
        return "fork"
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(list(PRELOADED))
    return "forkserver"


def launch_rank(node_rank: int | None = None) -> int:
    """This process's rank in a torchrun or srun launch, read before any process group exists; for a launcher that
    spawns its workers, its node's rank (``node_rank``: 0 on the first node and on one node)."""
    for variable in ("RANK", "SLURM_PROCID"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return node_rank or 0


def started_by_torchrun() -> bool:
    """True in a process that torchrun (torch.distributed.run) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or {"LOCAL_RANK", "RANK", "WORLD_SIZE"} <= os.environ.keys()


def start_early(config: Config) -> None:
    """A run that will spawn gloo/nccl workers through a forkserver starts the server now, before this process
    imports torch for its checks: both import at once (a launch from the command line starts its workers about
    2 s sooner on two cores). The server waits, unused, when the checks refuse the run; a script without its main
    guard is refused before the server starts."""
    if config.backend not in NATIVE_BACKENDS or config.nproc_per_node is None or start_method() != "forkserver":
        return
    require_main_guard(config.nproc_per_node)
    start_forkserver()


def start_forkserver() -> None:
    """The forkserver, started with the stop signals blocked, as it keeps them: a SIGTERM sent to the whole process
    group (a cluster's preemption reaches every process of a job) must not end it, for the launcher learns its
    workers' exit codes through it (they would all read 255, a lost worker). The workers it forks unblock them
    once they handle them (``stopping.StopRequest``). The resource tracker is started first: starting it unblocks
    SIGINT and SIGTERM in the caller (multiprocessing's own doing), which would leave them open to the server."""
    from multiprocessing import forkserver, resource_tracker

    forget_an_inherited_forkserver()
    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals())
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    global _started_in
    _started_in = os.getpid()


def forget_an_inherited_forkserver() -> None:
    """A process forked from one that started a forkserver inherits Python's record of that server, which is not
    its child: Python's ``ensure_running`` then fails waiting for it (ChildProcessError, python/cpython#86354), so
    a script that trains, forks and trains again in the child crashed there. The record is forgotten (and the
    inherited end of the server's keep-alive pipe closed), so that this process starts a server of its own. A
    record of another shape (another Python's private names) is left alone."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or _is_our_child(pid):
        return
    try:
        alive = server._forkserver_alive_fd
        server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None
    except AttributeError:
        return
    if alive is not None:
        os.close(alive)


def _is_our_child(pid: int) -> bool:
    """Whether ``pid`` is a child of this process, running or ended and not yet reaped (WNOWAIT: left for
    ``ensure_running``'s own wait). Without waitid (macOS): whether this process started the server, unless
    another did (then it is taken as ours, as before)."""
    if not hasattr(os, "waitid"):
        return _started_in in (None, os.getpid())
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return True
    except ChildProcessError:
        return False


_started_in: int | None = None  # the process whose start_forkserver ran last (a forked child inherits the parent's)


def stop_servers() -> None:
    """Stop the forkserver and the resource tracker this process started, and wait for them: a launcher on the
    command line ends after its children (they block the stop signals, and on their own would see its end and
    follow it seconds later). Python's own ``_stop`` of each, which a notebook's kernel never calls: its workers'
    next run reuses them."""
    from multiprocessing import forkserver, resource_tracker

    for server in (forkserver._forkserver, resource_tracker._resource_tracker):  # (the forkserver holds the other)
        stop = getattr(server, "_stop", None)
        if stop is not None:
            try:
                stop()
            except (OSError, ChildProcessError):
                pass  # gone already


def require_main_guard(workers: int | None) -> None:
    """Refuse, before any process starts, a script that launches at its top level without
    ``if __name__ == "__main__":``: each spawned worker imports the script again (Python's spawn and forkserver
    do), so each would start the launch anew."""
    streamed = _main_read_from_a_stream()
    if streamed is not None:
        source = f"was read from {streamed} (standard input)" if streamed.startswith("<") else f"runs from {streamed}"
        raise UserError(
            f"the script that starts {workers} worker processes {source}, which the workers cannot read again: "
            "each imports the main script anew (Python's rule for spawned processes); save it to a file, put the "
            'launch under `if __name__ == "__main__":`, and run that file'
        )
    script, line = _main_script_call()
    if script is None or _is_guarded(script, line):
        return
    source = linecache.getline(script, line).strip()
    source = source if len(source) <= 60 else source[:57] + "..."
    raise UserError(
        f"{Path(script).name} line {line} ({source}) starts {workers} worker processes without "
        f'`if __name__ == "__main__":`: each worker imports {Path(script).name} again and would run '
        'that line itself; put the call under `if __name__ == "__main__":` (Python\'s rule for spawned '
        "processes)"
    )


def _main_read_from_a_stream() -> str | None:
    """The name __main__ has when Python read it from standard input (``python - < script.py``, a heredoc in a job
    script): a file name that names no file, which spawned and forkserver workers would try to run (None
    otherwise: a file, a module run with -m, python -c, a REPL)."""
    main = sys.modules.get("__main__")
    name = getattr(main, "__file__", None)
    if not isinstance(name, str) or getattr(main, "__spec__", None) is not None or Path(name).is_file():
        return None
    return name


def _main_script_call() -> tuple[str | None, int]:
    """The file of the __main__ module and the line of it that led here (its outermost frame), or (None, 0) when
    __main__ is no file (a REPL, python -c)."""
    frame: Any = sys._getframe()
    found = None
    while frame is not None:
        if frame.f_globals.get("__name__") == "__main__" and frame.f_code.co_name == "<module>":
            found = frame
        frame = frame.f_back
    script = found.f_globals.get("__file__") if found is not None else None
    return (script, found.f_lineno) if found is not None and script and Path(script).is_file() else (None, 0)


def _is_guarded(script: str, line: int) -> bool:
    """Whether ``line`` of ``script`` lies inside an ``if __name__ == "__main__":`` block."""
    try:
        tree = ast.parse(Path(script).read_text(), filename=script)
    except (OSError, SyntaxError, ValueError):
        return True  # cannot tell: do not stand in the way
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _tests_main(node.test):
            if any(child.lineno <= line <= (child.end_lineno or child.lineno) for child in node.body):
                return True
    return False


def _tests_main(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, *test.comparators]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    values = [side.value for side in sides if isinstance(side, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]

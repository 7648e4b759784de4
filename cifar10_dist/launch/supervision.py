"""What a launch needs beyond Ignite's ``idist.Parallel``, each as a small wrapper around it (``spawn`` uses them):

- ``supervised``: for gloo/nccl workers that Parallel spawns. Ignite's spawn calls torch's ``start_processes`` with
  ``join=True``: torch's join stops the others with SIGTERM and waits up to 30 s, and knows nothing of our reports.
  While the block lasts, ``start_processes`` starts the same workers and supervises them: the first that fails ends
  the others within seconds, with its one line and exit code; Ctrl-C, SIGTERM and SIGUSR1 are passed on (a second
  Ctrl-C ends them at once). Each worker first takes the launcher's environment, folder and import path (a
  forkserver's are older), hides a Slurm job from Ignite until its group formed (Ignite would take SLURM_PROCID
  for the rank), and holds back torch's C++ lines while it joins.
- ``join``: for a process torchrun or srun started, which Parallel joins without a timeout (``spawn.Joined``).

Either way a group that cannot form (node 0 not reached, processes that never came) is one line, as a worker's
errors are (``failures.joining_failure``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import ignite.distributed as idist
import torch
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from cifar10_dist.config import NATIVE_BACKENDS, Config
from cifar10_dist.errors import Interrupted, UserError, resume_hint
from cifar10_dist.launch import failures, start_method
from cifar10_dist.system import stopping

STOP_GRACE_SECONDS = 1  # after one spawned worker fails, how long the others get to exit before SIGTERM, then SIGKILL
_UNTIL_FORMED: list[Callable[[], None]] = []  # what a worker undoes once its group formed (``group_formed``)


@contextlib.contextmanager
def supervised(config: Config, exchange: Path) -> Iterator[dict[str, Any]]:
    """The spawning options Parallel takes for the config's gloo/nccl workers (nodes, node 0's address and port,
    the start method, dist_timeout), with torch's ``start_processes`` supervising them while the block lasts."""
    environment = {**os.environ, **_spawn_environment(config)}  # the whole environment: a forkserver's is older
    method = start_method.start_method()
    if method != "fork":
        start_method.require_main_guard(config.nproc_per_node)
    if method == "forkserver":
        start_method.start_forkserver()  # (at once when start_early started it)
    ignites = torch.multiprocessing.start_processes

    def start_and_supervise(fn: Callable, args: tuple = (), nprocs: int = 1, **options: Any) -> None:
        # the workers inherit blocked stop signals: a Ctrl-C while they start up waits until they can handle it
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, stopping.stop_signals())
        try:
            launcher = (fn, args, config, exchange, environment, os.getcwd(), list(sys.path))
            context = ignites(
                _spawned_entry, args=launcher, nprocs=nprocs, join=False, start_method=options["start_method"]
            )
            _supervise_with_signals(context, config, exchange)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    torch.multiprocessing.start_processes = start_and_supervise  # type: ignore[assignment]
    try:
        yield {
            "nproc_per_node": config.nproc_per_node,
            "nnodes": config.nnodes or 1,
            "node_rank": config.node_rank or 0,
            **(
                {"master_addr": environment["MASTER_ADDR"], "master_port": int(environment["MASTER_PORT"])}
                if config.init_method == "env://"
                else {"init_method": config.init_method}
            ),
            "start_method": method,
            "timeout": timedelta(seconds=config.dist_timeout),
        }
    finally:
        torch.multiprocessing.start_processes = ignites


def _spawned_entry(
    local_rank: int,
    fn: Callable,
    args: tuple,
    config: Config,
    exchange: Path,
    environment: dict,
    cwd: str,
    import_path: list[str],
) -> None:
    """A spawned worker: the launcher's environment, folder and import path, then Ignite's worker function (which
    joins the group and runs ours)."""
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    sys.path[:] = import_path
    try:
        with _joining(config, exchange, hide_slurm=True):  # (Ignite sets RANK for each worker itself)
            fn(local_rank, *args)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C after the run is over is the launcher's business


def join(config: Config, exchange: Path) -> None:
    """A process torchrun or srun started joins its group with dist_timeout; several replicas may share a GPU."""
    with _joining(config, exchange, hide_slurm=start_method.started_by_torchrun()), _gpus_shared_by_local_ranks():
        idist.initialize(str(config.backend), **_native_options(config))


@contextlib.contextmanager
def _joining(config: Config, exchange: Path, hide_slurm: bool) -> Iterator[None]:
    """While this process joins its group: Slurm's job hidden from Ignite where ``hide_slurm`` (under torchrun, or
    spawned, RANK and WORLD_SIZE are the truth; Ignite would insist they equal SLURM_PROCID and SLURM_NTASKS) and
    torch's C++ lines held back; both undone once the group formed (``group_formed``). A group that cannot form is
    one line."""
    hidden = os.environ.pop("SLURM_JOB_ID", None) if hide_slurm else None
    if hidden is not None:
        _UNTIL_FORMED.append(lambda: os.environ.__setitem__("SLURM_JOB_ID", hidden))
    _hold_native_logs()
    try:
        yield
    except torch.distributed.DistError as error:
        _UNTIL_FORMED.clear()  # (the held lines dropped: the one line says what failed)
        failure = failures.joining_failure(error, config)
        rank = int(os.environ.get("RANK", "0"))
        failures.WorkerReport(type(failure).__name__, str(failure), rank).write(exchange)
        raise failure from error


def _hold_native_logs() -> None:
    """What torch's C++ side prints while the group forms (each retried connection, with its C++ stack) held back
    in a file: shown as it was once the group formed, dropped when it could not."""
    sys.stderr.flush()
    saved = os.dup(2)
    held = tempfile.TemporaryFile()
    os.dup2(held.fileno(), 2)

    def show() -> None:
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        os.write(2, held.read())
        held.close()

    _UNTIL_FORMED.append(show)


def group_formed() -> None:
    """Once this process's group formed: what joining hid or held back, given back (a process with no group: no
    effect)."""
    while _UNTIL_FORMED:
        _UNTIL_FORMED.pop()()


@contextlib.contextmanager
def _gpus_shared_by_local_ranks() -> Iterator[None]:
    """Several replicas per GPU (srun/torchrun with more local processes than visible GPUs, backend gloo):
    Ignite calls torch.cuda.set_device(local_rank), which fails past the last GPU; use local_rank % GPUs."""
    if not torch.cuda.is_available():
        yield
        return
    set_device = torch.cuda.set_device
    torch.cuda.set_device = lambda index: set_device(shared_gpu_index(int(index), torch.cuda.device_count()))  # type: ignore[assignment, arg-type]
    try:
        yield
    finally:
        torch.cuda.set_device = set_device


def shared_gpu_index(local_rank: int, gpus: int) -> int:
    """The GPU of a local rank when local ranks outnumber GPUs: round robin (Ignite passes the int local rank)."""
    return local_rank % gpus


def _native_options(config: Config) -> dict[str, Any]:
    """Collective timeout and init_method: torch.distributed takes them, Ignite's XLA and Horovod models do not."""
    if config.backend not in NATIVE_BACKENDS:
        return {}
    return {"timeout": timedelta(seconds=config.dist_timeout), "init_method": config.init_method}


def _supervise_with_signals(context: Any, config: Config, exchange: Path) -> None:
    """Supervise with this process's stop signals passed on to the workers; a second Ctrl-C ends them at once."""

    def end_at_once() -> None:
        for process in context.processes:
            process.kill()
            process.join(timeout=5)
        raise Interrupted(
            "interrupted again: every process stopped at once, without a new checkpoint; continue "
            f"from the newest one with {resume_hint(config.run_name)}"
        )

    with stopping.StopRequest(forward_to=context.pids, on_second_interrupt=end_at_once):
        _supervise(context, config, exchange)


def _supervise(context: Any, config: Config, exchange: Path) -> None:
    """Wait for the workers; when one fails, stop the others (STOP_GRACE_SECONDS, then SIGTERM, then SIGKILL)
    and raise the error it reported, or say how it died."""
    try:
        while not context.join(timeout=1.0, grace_period=STOP_GRACE_SECONDS):
            pass
    except (ProcessExitedException, ProcessRaisedException) as failure:
        raise failures.explain_failure(failure, context, config, exchange) from failure
    finally:
        for error_file in context.error_files:  # torch leaves a failed worker's traceback file in /tmp
            Path(error_file).unlink(missing_ok=True)
    reports = failures.WorkerReport.read_all(exchange)  # torch lets a worker end by KeyboardInterrupt with exit code 0
    if reports:
        raise reports[0].error()


def _spawn_environment(config: Config) -> dict[str, str]:
    """What torchrun would set for the workers (Ignite adds RANK and LOCAL_RANK to each)."""
    nproc, nnodes = config.nproc_per_node or 1, config.nnodes or 1
    environment = {
        "WORLD_SIZE": str(nproc * nnodes),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(config.node_rank or 0),
    }
    if config.init_method == "env://":
        environment["MASTER_ADDR"] = config.master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
        environment["MASTER_PORT"] = str(_master_port(config))
    return environment


def _master_port(config: Config) -> int:
    if config.master_port is None and "MASTER_PORT" in os.environ:
        return int(os.environ["MASTER_PORT"])
    if config.master_port is None:
        if (config.nnodes or 1) > 1:
            raise UserError("nnodes > 1 needs master_port: a free TCP port on node 0")
        return free_port()  # a fixed default would collide between concurrent runs
    if (config.node_rank or 0) == 0 and not port_is_free(config.master_port):
        raise UserError(
            f"master_port={config.master_port} is already in use on this machine: "
            "choose another port, or leave master_port unset on a single node (a free one is picked)"
        )
    return config.master_port


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a server could listen on the port now: as torch's TCPStore binds it (SO_REUSEADDR), so that the
    connections of a run that just ended there, waiting out TIME_WAIT, do not count as a server in use."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True

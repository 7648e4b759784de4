"""Start a worker function in every process with ``ignite.distributed`` and bring its result back.

Three ways in: one plain process (backend None), spawning (backend + nproc_per_node), or a process already started by
torchrun/srun (backend set, nproc_per_node unset). Spawned gloo/nccl workers are supervised here: the first that fails
ends the others within seconds (a stopped or hung one too), and its one-line error comes back with its exit code. Rank
0's result (JSON, handed to every rank) and any worker's error travel back to the caller through files, so spawned and
in-process runs return the same way. An in-process run leaves the caller's process as it found it (signal handlers,
torch threads and deterministic flags, logging).
"""

from __future__ import annotations

import contextlib
import json
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

from cifar10_dist.config import Config
from cifar10_dist.errors import Interrupted, UserError, resume_hint
from cifar10_dist.launch import failures, preflight, start_method, xla_compat
from cifar10_dist.outputs import log_lines
from cifar10_dist.system import cpu, ranks, stopping

Worker = Callable[[Config], dict[str, Any]]
RESULT_PREFIX = "result-rank"  # result-rank<R>.json: rank 0's result, as rank R returns it
NATIVE_BACKENDS = start_method.NATIVE_BACKENDS
STOP_GRACE_SECONDS = 1  # after one spawned worker fails, how long the others get to exit before SIGTERM, then SIGKILL


def run(worker: Worker, config: Config) -> dict[str, Any]:
    """Run ``worker(config)`` in every process; return rank 0's result, in the calling process and, under torchrun
    or srun, in every process ({} when the workers ended without one).

    The config has been checked (``preflight.check_before_launch``) by the caller.
    """
    xla_compat.apply()  # no-op without torch_xla
    if config.deterministic:  # read when cuBLAS starts: before any process touches CUDA
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    log_lines.quiet_ignite_loggers()
    with tempfile.TemporaryDirectory(prefix="cifar10_dist-") as folder, caller_state_kept():
        exchange = Path(folder)
        if config.backend in NATIVE_BACKENDS and config.nproc_per_node is not None:
            _spawn(worker, config, exchange)
        elif config.backend is not None and config.nproc_per_node is not None:
            idist.spawn(
                config.backend, _process_entry, args=(worker, config, exchange), nproc_per_node=config.nproc_per_node
            )  # xla-tpu, horovod: Ignite's own spawning
        elif config.backend is not None:
            _join_started_processes(worker, config, exchange)
        else:
            with idist.Parallel(backend=None) as parallel:
                parallel.run(_process_entry, worker, config, exchange)
        returned = sorted(exchange.glob(f"{RESULT_PREFIX}*.json"))  # (spawned workers share one exchange)
        return json.loads(returned[0].read_text()) if returned else {}


@contextlib.contextmanager
def caller_state_kept() -> Iterator[None]:
    """Restore what a run changes in its process: torch threads, deterministic algorithms, cuDNN flags."""
    threads = torch.get_num_threads()
    deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ) != deterministic:  # setting it imports torch._inductor: a second or more, only when needed
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def _join_started_processes(worker: Worker, config: Config, exchange: Path) -> None:
    """A process started by torchrun/srun: join the process group itself (Parallel passes no timeout there); a
    group that cannot form (node 0 not reached, a node that never came) is one line, as a worker's errors are."""
    try:
        with _torchrun_over_slurm(), _gpus_shared_by_local_ranks(), _native_logs_held():
            idist.initialize(str(config.backend), **_native_options(config))
    except torch.distributed.DistError as error:
        failure = failures.joining_failure(error, config)
        failures.WorkerReport(type(failure).__name__, str(failure), int(os.environ.get("RANK", "0"))).write(exchange)
        raise failure from error
    try:
        stopping.note_peers(config.master_addr or os.environ.get("MASTER_ADDR"))
        _process_entry(idist.get_local_rank(), worker, config, exchange)
    finally:
        idist.finalize()


@contextlib.contextmanager
def _native_logs_held() -> Iterator[None]:
    """What torch's C++ side prints while the group forms (each retried connection, with its C++ stack) held back:
    shown as it was once the group formed, dropped when it could not (one line then says what failed)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        os.write(2, held.read())


@contextlib.contextmanager
def _torchrun_over_slurm() -> Iterator[None]:
    """Under torchrun (or our own spawning) inside a Slurm job, RANK/WORLD_SIZE are the truth: Ignite would
    instead insist they equal SLURM_PROCID/SLURM_NTASKS (one srun task per node runs torchrun) and refuse."""
    hidden = os.environ.pop("SLURM_JOB_ID", None) if preflight.started_by_torchrun() else None
    try:
        yield
    finally:
        if hidden is not None:
            os.environ["SLURM_JOB_ID"] = hidden


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


# ---------------------------------------------------------------- spawning and supervising gloo/nccl workers


def _spawn(worker: Worker, config: Config, exchange: Path) -> None:
    """Start nproc_per_node workers, each joining the group like a torchrun process, and supervise them.

    Ctrl-C, SIGTERM and SIGUSR1 to this process are passed on to the workers (they agree on a checkpoint and
    stop); a second Ctrl-C ends them at once.
    """
    environment = {**os.environ, **_spawn_environment(config)}  # the whole environment: a forkserver's is older
    method = start_method.start_method()
    if method != "fork":
        start_method.require_main_guard(config.nproc_per_node)
    if method == "forkserver":
        start_method.start_forkserver()  # (at once when start_early started it)
    # the workers inherit blocked stop signals: a Ctrl-C while they start up waits until they can handle it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, stopping.stop_signals())
    try:
        context = torch.multiprocessing.start_processes(
            _spawned_entry,
            args=(worker, config, exchange, environment, os.getcwd(), list(sys.path)),
            nprocs=config.nproc_per_node,
            join=False,
            start_method=method,
        )
        _supervise_with_signals(context, config, exchange)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


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


def _spawn_environment(config: Config) -> dict[str, str]:
    """What torchrun would set for the workers (RANK and LOCAL_RANK are added per worker)."""
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


def _spawned_entry(
    local_rank: int, worker: Worker, config: Config, exchange: Path, environment: dict, cwd: str, import_path: list[str]
) -> None:
    """A spawned worker: the launcher's environment, folder and import path, with what torchrun would add, then
    the torchrun path."""
    rank = int(environment["GROUP_RANK"]) * int(environment["LOCAL_WORLD_SIZE"]) + local_rank
    os.environ.clear()
    os.environ.update(environment, RANK=str(rank), LOCAL_RANK=str(local_rank))
    os.chdir(cwd)
    sys.path[:] = import_path
    try:
        _join_started_processes(worker, config, exchange)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C after the run is over is the launcher's business


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


def _process_entry(local_rank: int, worker: Worker, config: Config, exchange: Path) -> None:
    """Runs in every process: set CPU threads, call the worker, hand rank 0's result or any user error back."""
    cpu.configure_cpu_threads()
    try:
        result = worker(config)
    except (UserError, Interrupted) as error:
        failures.WorkerReport.of(error).write(exchange)
        raise
    except Exception as error:
        if stopping.is_lost_peer(error):
            lost: UserError = stopping.lost_peer_error(error, idist.get_rank())
        elif stopping.is_collective_timeout(error):
            lost = stopping.silent_peer_error(error, idist.get_rank(), config.dist_timeout)
        else:
            raise
        failures.WorkerReport.of(lost).write(exchange)
        raise lost from error
    shared = ranks.from_rank_zero(lambda: result)  # every rank returns rank 0's result (a collective: all leave
    # together)
    (exchange / f"{RESULT_PREFIX}{idist.get_rank()}.json").write_text(json.dumps(shared))

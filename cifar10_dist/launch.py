"""Start a worker function in every process with ``ignite.distributed.Parallel`` and bring its result back.

Three ways in: one plain process (backend None), internal spawning (backend + nproc_per_node), or a process
already started by torchrun/srun (backend set, nproc_per_node unset). Rank 0's worker result (a JSON-able
dict) travels back to the caller through a file, so spawned and in-process runs return the same way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import ignite.distributed as idist
import torch
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from cifar10_dist import faults, tracking
from cifar10_dist.config import Config
from cifar10_dist.errors import Preempted, TrainingDiverged, UserError, WorkerLost

Worker = Callable[[Config], dict[str, Any]]
RESULT_FILE = "result.json"
NATIVE_BACKENDS = ("gloo", "nccl")


def started_by_torchrun() -> bool:
    """True in a process that torchrun (torch.distributed.run) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or {"LOCAL_RANK", "RANK", "WORLD_SIZE"} <= os.environ.keys()


def check_launch(config: Config) -> None:
    """Refuse launch settings that would crash or hang later, with a message saying what to do instead."""
    if started_by_torchrun():
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if config.nproc_per_node is not None:
            raise UserError(
                f"nproc_per_node={config.nproc_per_node} cannot be used under torchrun, which already started "
                f"{world_size} processes: drop --nproc_per_node (torchrun's own --nproc_per_node sets it)"
            )
        if config.backend is None and world_size > 1:
            raise UserError(
                f"torchrun started {world_size} processes but backend is None: add --backend=gloo (CPU) or nccl (GPU)"
            )
    if config.backend == "nccl" and not torch.cuda.is_available():
        raise UserError("backend='nccl' needs CUDA GPUs, but none is available here: use --backend=gloo on CPU")
    if config.backend == "xla-tpu" and not idist.has_xla_support:
        raise UserError("backend='xla-tpu' needs torch_xla, which is not installed (TPU runtimes provide it)")
    if config.backend == "horovod" and not idist.has_hvd_support:
        raise UserError("backend='horovod' needs horovod, which is not installed: pip install horovod")


def run(worker: Worker, config: Config) -> dict[str, Any]:
    """Run ``worker(config)`` in every process; return rank 0's result (in the calling process).

    Spawning and no-backend runs go through ``idist.Parallel``; a process started by torchrun/srun
    joins the process group with ``idist.initialize`` itself, because Parallel passes no timeout there.
    """
    check_launch(config)
    tracking.quiet_ignite_loggers()
    # torch.distributed takes a timeout; Ignite's XLA and Horovod models accept no such argument
    timeout_option = {"timeout": timedelta(seconds=config.dist_timeout)} if config.backend in NATIVE_BACKENDS else {}
    with tempfile.TemporaryDirectory(prefix="cifar10_dist-") as exchange:
        if config.backend is not None and config.nproc_per_node is not None:
            _spawn(worker, config, exchange, timeout_option)
        elif config.backend is not None:
            idist.initialize(config.backend, **timeout_option)
            try:
                _process_entry(idist.get_local_rank(), worker, config, exchange, False)
            finally:
                idist.finalize()
        else:
            with idist.Parallel(backend=None) as parallel:
                parallel.run(_process_entry, worker, config, exchange, False)
        result_path = Path(exchange) / RESULT_FILE
        return json.loads(result_path.read_text()) if result_path.is_file() else {}


def _spawn(worker: Worker, config: Config, exchange: str, timeout_option: dict[str, timedelta]) -> None:
    """Spawn nproc_per_node processes; turn their failures into one-line errors with the right exit code."""
    stop_request = faults.StopRequest(forward_to_children=True)  # SIGTERM to this process reaches the workers
    stop_request.install()
    options = _spawn_options(config)
    try:
        with idist.Parallel(backend=config.backend, **timeout_option, **options) as parallel:
            parallel.run(_process_entry, worker, config, exchange, True)
    except ProcessExitedException as error:
        reported = _error_from_workers(Path(exchange))
        if reported is not None:
            raise reported from None
        raise WorkerLost(
            f"worker process {error.error_index} (local rank) {_describe_exit(error)}; the others were stopped: "
            "rerun with --resume_from=auto and the same run_name to continue from the last checkpoint"
        ) from None
    except ProcessRaisedException:
        reported = _error_from_workers(Path(exchange))
        if reported is None:
            raise
        raise reported from None
    finally:
        for stop_signal in faults.STOP_SIGNALS:
            signal.signal(stop_signal, signal.SIG_DFL)


def _describe_exit(error: ProcessExitedException) -> str:
    if error.signal_name:
        return f"was killed by {error.signal_name}"
    return f"exited with code {error.exit_code}"


def _spawn_options(config: Config) -> dict[str, Any]:
    options: dict[str, Any] = {
        "nproc_per_node": config.nproc_per_node,
        "nnodes": config.nnodes,
        "node_rank": config.node_rank,
        "master_addr": config.master_addr,
        "master_port": config.master_port,
    }
    first_node = (config.node_rank or 0) == 0
    if config.master_port is None and (config.nnodes or 1) == 1 and "MASTER_PORT" not in os.environ:
        options["master_port"] = free_port()  # Ignite's fixed default (2222) collides between concurrent runs
    elif config.master_port is not None and first_node and not port_is_free(config.master_port):
        raise UserError(
            f"master_port={config.master_port} is already in use on this machine: "
            "choose another port, or leave master_port unset on a single node (a free one is picked)"
        )
    return options


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def _process_entry(local_rank: int, worker: Worker, config: Config, exchange: str, spawned: bool) -> None:
    """Runs in every process: set CPU threads, call the worker, hand rank 0's result or any user error back."""
    configure_cpu_threads()
    try:
        result = worker(config)
    except UserError as error:
        if spawned:
            report = {"kind": type(error).__name__, "message": str(error)}
            (Path(exchange) / f"error-rank{idist.get_rank()}.json").write_text(json.dumps(report))
        raise
    if idist.get_rank() == 0:
        (Path(exchange) / RESULT_FILE).write_text(json.dumps(result))


def _error_from_workers(exchange: Path) -> UserError | None:
    """The user error a spawned worker reported (the lowest rank's), rebuilt with its class and exit code."""
    reports = sorted(exchange.glob("error-rank*.json"), key=lambda path: int(path.stem.removeprefix("error-rank")))
    if not reports:
        return None
    report = json.loads(reports[0].read_text())
    kinds = {kind.__name__: kind for kind in (UserError, TrainingDiverged, Preempted, WorkerLost)}
    return kinds.get(report["kind"], UserError)(report["message"])


def configure_cpu_threads() -> None:
    """On CPU, share the cores among the processes of this node unless OMP_NUM_THREADS says otherwise."""
    if "OMP_NUM_THREADS" in os.environ or idist.device().type != "cpu":
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // max(1, idist.get_nproc_per_node())))

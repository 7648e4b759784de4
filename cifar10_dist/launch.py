"""Start a worker function in every process with ``ignite.distributed.Parallel`` and bring its result back.

Three ways in: one plain process (backend None), internal spawning (backend + nproc_per_node), or a process
already started by torchrun/srun (backend set, nproc_per_node unset). Rank 0's worker result (a JSON-able
dict) travels back to the caller through a file, so spawned and in-process runs return the same way.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable

import ignite.distributed as idist
import torch

from cifar10_dist import tracking
from cifar10_dist.config import Config
from cifar10_dist.errors import UserError

Worker = Callable[[Config], dict[str, Any]]
RESULT_FILE = "result.json"


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
        raise UserError("backend='xla-tpu' needs torch_xla, which is not installed: see README, 'Colab TPU'")
    if config.backend == "horovod" and not idist.has_hvd_support:
        raise UserError("backend='horovod' needs horovod, which is not installed: pip install horovod")


def run(worker: Worker, config: Config) -> dict[str, Any]:
    """Run ``worker(config)`` in every process; return rank 0's result (in the calling process)."""
    check_launch(config)
    tracking.quiet_ignite_loggers()
    with tempfile.TemporaryDirectory(prefix="cifar10_dist-") as exchange:
        spawning = config.backend is not None and config.nproc_per_node is not None
        parallel = idist.Parallel(backend=config.backend, **_spawn_options(config) if spawning else {})
        try:
            with parallel:
                parallel.run(_process_entry, worker, config, exchange, spawning)
        except Exception as error:
            message = _error_from_workers(Path(exchange))
            if message is None:
                raise
            raise UserError(message) from error
        result_path = Path(exchange) / RESULT_FILE
        return json.loads(result_path.read_text()) if result_path.is_file() else {}


def _spawn_options(config: Config) -> dict[str, Any]:
    options: dict[str, Any] = {
        "nproc_per_node": config.nproc_per_node,
        "nnodes": config.nnodes,
        "node_rank": config.node_rank,
        "master_addr": config.master_addr,
        "master_port": config.master_port,
    }
    single_node = (config.nnodes or 1) == 1
    if single_node and config.master_port is None and "MASTER_PORT" not in os.environ:
        options["master_port"] = free_port()  # Ignite's fixed default (2222) collides between concurrent runs
    return options


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _process_entry(local_rank: int, worker: Worker, config: Config, exchange: str, spawned: bool) -> None:
    """Runs in every process: set CPU threads, call the worker, hand rank 0's result or any user error back."""
    configure_cpu_threads()
    try:
        result = worker(config)
    except UserError as error:
        if not spawned:
            raise
        (Path(exchange) / f"error-rank{idist.get_rank()}.txt").write_text(str(error))
        raise
    if idist.get_rank() == 0:
        (Path(exchange) / RESULT_FILE).write_text(json.dumps(result))


def _error_from_workers(exchange: Path) -> str | None:
    """The first user error a spawned worker reported (lowest rank), if any."""
    reports = sorted(exchange.glob("error-rank*.txt"), key=lambda path: int(path.stem.removeprefix("error-rank")))
    return reports[0].read_text() if reports else None


def configure_cpu_threads() -> None:
    """On CPU, share the cores among the processes of this node unless OMP_NUM_THREADS says otherwise."""
    if "OMP_NUM_THREADS" in os.environ or idist.device().type != "cpu":
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // max(1, idist.get_nproc_per_node())))

"""Start a worker function in every process with ``ignite.distributed`` and bring its result back.

Three ways in: one plain process (backend None), internal spawning (backend + nproc_per_node), or a process
already started by torchrun/srun (backend set, nproc_per_node unset). Rank 0's worker result (a JSON-able
dict) travels back to the caller through a file, so spawned and in-process runs return the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import ignite.distributed as idist
import torch
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from cifar10_dist import faults, tracking, xla_compat
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
    init_file = Path(config.init_method.removeprefix("file://"))
    single_node_spawn = config.nproc_per_node is not None and (config.nnodes or 1) == 1
    if config.init_method.startswith("file://") and single_node_spawn and init_file.exists():
        raise UserError(
            f"init_method='{config.init_method}': the file already exists (left by an earlier run?); "
            "torch needs a new, empty file for every run: delete it or choose another name"
        )
    if config.backend is not None and config.nproc_per_node is not None and torch.cuda.is_available():
        if config.nproc_per_node > torch.cuda.device_count():
            raise UserError(
                f"nproc_per_node={config.nproc_per_node} is more than the {torch.cuda.device_count()} visible GPUs: "
                "to run several replicas per GPU, start them with srun or torchrun and --backend=gloo "
                "(see scripts/slurm/shared_gpu.sbatch)"
            )
    if config.backend == "nccl" and not torch.cuda.is_available():
        raise UserError("backend='nccl' needs CUDA GPUs, but none is available here: use --backend=gloo on CPU")
    if config.backend == "xla-tpu" and not idist.has_xla_support:
        raise UserError("backend='xla-tpu' needs torch_xla, which is not installed (TPU runtimes provide it)")
    if config.backend == "horovod" and not idist.has_hvd_support:
        raise UserError("backend='horovod' needs horovod, which is not installed: pip install horovod")


def run(worker: Worker, config: Config) -> dict[str, Any]:
    """Run ``worker(config)`` in every process; return rank 0's result (in the calling process).

    Spawning goes through ``idist.spawn``, no-backend runs through ``idist.Parallel``; a process started by
    torchrun/srun joins the process group with ``idist.initialize`` itself, because Parallel passes no timeout there.
    """
    xla_compat.apply()  # no-op without torch_xla
    check_launch(config)
    if config.deterministic:  # read when cuBLAS starts: before any process touches CUDA
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    tracking.quiet_ignite_loggers()
    native_options = _native_options(config)
    with tempfile.TemporaryDirectory(prefix="cifar10_dist-") as exchange:
        if config.backend is not None and config.nproc_per_node is not None:
            _spawn(worker, config, exchange, native_options)
        elif config.backend is not None:
            with _torchrun_over_slurm(), _gpus_shared_by_local_ranks():
                idist.initialize(config.backend, **native_options)
            try:
                _process_entry(idist.get_local_rank(), worker, config, exchange, False)
            finally:
                idist.finalize()
        else:
            with idist.Parallel(backend=None) as parallel:
                parallel.run(_process_entry, worker, config, exchange, False)
        result_path = Path(exchange) / RESULT_FILE
        return json.loads(result_path.read_text()) if result_path.is_file() else {}


@contextlib.contextmanager
def _torchrun_over_slurm() -> Iterator[None]:
    """Under torchrun inside a Slurm job, torchrun's RANK/WORLD_SIZE are the truth: Ignite would instead
    insist they equal SLURM_PROCID/SLURM_NTASKS (one srun task per node runs torchrun) and refuse to start."""
    hidden = os.environ.pop("SLURM_JOB_ID", None) if started_by_torchrun() else None
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
    torch.cuda.set_device = lambda index: set_device(shared_gpu_index(index, torch.cuda.device_count()))
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


def _spawn(worker: Worker, config: Config, exchange: str, native_options: dict[str, Any]) -> None:
    """Spawn nproc_per_node processes; turn their failures into one-line errors with the right exit code."""
    stop_request = faults.StopRequest(forward_to_children=True)  # SIGTERM to this process reaches the workers
    stop_request.install()
    options = {key: value for key, value in {**_spawn_options(config), **native_options}.items() if value is not None}
    try:
        # idist.spawn rather than Parallel: Parallel's logger setup would start the XLA runtime in this process
        idist.spawn(config.backend, _process_entry, args=(worker, config, exchange, True), **options)
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
    if config.init_method != "env://":
        return options  # file://: Ignite refuses master_addr/master_port next to it
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
    configure_cpu_threads(spawned)
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


def configure_cpu_threads(spawned: bool) -> None:
    """On CPU, share this launch's cores among its processes unless OMP_NUM_THREADS says otherwise."""
    if "OMP_NUM_THREADS" in os.environ or idist.device().type != "cpu":
        return
    torch.set_num_threads(cpu_threads_per_process(spawned))


def cpu_threads_per_process(spawned: bool) -> int:
    """Cores per process: a Slurm task's SLURM_CPUS_PER_TASK shared by the processes started inside that task
    (spawned or by torchrun; an srun task is one process), else this machine's cores over the local processes."""
    slurm_cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm_cpus and slurm_cpus.isdigit() and "SLURM_PROCID" in os.environ:
        if spawned:
            sharing = idist.get_nproc_per_node()
        else:
            sharing = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun sets it; srun starts one per task
        return max(1, int(slurm_cpus) // sharing)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, idist.get_nproc_per_node()))

"""Start a worker function in every process through Ignite's ``idist.Parallel`` and bring its result back.

Every way in reads as Ignite's own example: ``with idist.Parallel(backend=..., nproc_per_node=...) as parallel:
parallel.run(training, config)``, for one plain process, for workers it spawns (gloo, nccl, xla-tpu, horovod) and for
a process torchrun or srun started. Where Parallel lacks what a run needs, a small wrapper around it adds that
(``supervision``): spawned gloo/nccl workers supervised (the first that fails ends the others within seconds, with
its one line and exit code; Ctrl-C and the preemption signals passed on), and a process torchrun started joining
with dist_timeout (``Joined``). Rank 0's result (JSON, handed to every rank) and any worker's error travel back to
the caller through files, so spawned and in-process runs return the same way. An in-process run leaves the
caller's process as it found it (signal handlers, torch threads and deterministic flags, logging).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import ignite.distributed as idist
import torch
from ignite.utils import setup_logger

from cifar10_dist.config import NATIVE_BACKENDS, Config
from cifar10_dist.errors import Interrupted, UserError
from cifar10_dist.launch import failures, supervision, xla_compat
from cifar10_dist.outputs import log_lines
from cifar10_dist.system import cpu, ranks, stopping

Worker = Callable[[Config], dict[str, Any]]
RESULT_PREFIX = "result-rank"  # result-rank<R>.json: rank 0's result, as rank R returns it


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
        with launched(config, exchange) as parallel:
            parallel.run(_process_entry, worker, config, exchange)
        returned = sorted(exchange.glob(f"{RESULT_PREFIX}*.json"))  # (spawned workers share one exchange)
        return json.loads(returned[0].read_text()) if returned else {}


@contextlib.contextmanager
def launched(config: Config, exchange: Path) -> Iterator[idist.Parallel]:
    """Ignite's Parallel for the config's launch: one process (no backend), a process torchrun or srun started
    (a backend, no nproc_per_node: ``Joined``), gloo/nccl workers it spawns (supervised) or xla-tpu/horovod's."""
    if config.backend is None:
        with idist.Parallel(backend=None) as parallel:
            yield parallel
    elif config.nproc_per_node is None:
        with Joined(config, exchange) as joined:
            yield joined
    elif config.backend in NATIVE_BACKENDS:
        with supervision.supervised(config, exchange) as spawning:
            with idist.Parallel(backend=config.backend, **spawning) as parallel:
                yield parallel
    else:
        with idist.Parallel(backend=config.backend, nproc_per_node=config.nproc_per_node) as parallel:
            yield parallel


class Joined(idist.Parallel):
    """Ignite's Parallel for a process torchrun or srun started, joining its group with ``dist_timeout``.
    ``Parallel.__enter__`` calls ``idist.initialize(backend, init_method=...)`` and passes no timeout, so a peer
    that never comes would hold it for torch's 30 minutes; this enters with ``supervision.join`` instead (the
    timeout, and a group that cannot form as one line). ``run`` and ``__exit__`` (``idist.finalize``) are
    Parallel's."""

    def __init__(self, config: Config, exchange: Path) -> None:
        super().__init__(backend=config.backend, init_method=config.init_method)
        self.config, self.exchange = config, exchange

    def __enter__(self) -> Joined:
        supervision.join(self.config, self.exchange)
        self._logger = setup_logger(f"{idist.Parallel.__module__}.Parallel")  # type: ignore[assignment]  # (as Parallel.__enter__)
        return self


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


def _process_entry(local_rank: int, worker: Worker, config: Config, exchange: Path) -> None:
    """Runs in every process once its group formed: set CPU threads, call the worker, hand rank 0's result or any
    user error back."""
    supervision.group_formed()
    if idist.get_world_size() > 1:
        stopping.note_peers(config.master_addr or os.environ.get("MASTER_ADDR"))
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

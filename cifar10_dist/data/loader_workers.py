"""The processes and memory a loader may use: how many DataLoader workers a node gets (``workers_for``), how they
start (``worker_start_method``), and how much memory the training device or this machine has free (``free_bytes``,
of which ``data_on_device`` may take ``DEVICE_SHARE``)."""

from __future__ import annotations

import sys
from typing import Any

import torch

from cifar10_dist.data.datasets import MappedImages

AUTO_WORKERS = 2  # num_workers=auto training on a CPU from disk: the other cores train
ACCELERATOR_WORKERS = (2, 8)  # num_workers=auto per process on an accelerator: its cores but one, within these


def workers_for(
    setting: int | str,
    device: torch.device,
    images: Any = None,
    cores_per_process: int | None = None,
    local_processes: int | None = None,
) -> int:
    """``num_workers`` for a node (Ignite's auto_dataloader splits it over the node's processes): a number as
    given; auto, training on a CPU: none from images held in memory (a tensor, or a memory-mapped cache the page
    cache can hold: at most DEVICE_SHARE of the memory available), where the reads and crops cost less in the
    training process than passing each batch between processes through shared memory
    (benchmarks/pipeline_training.py), else AUTO_WORKERS; on an accelerator, each process's cores but the one
    that drives the device (``system.cpu.cpu_threads_per_process``, Slurm's allocation included), at least 2 and
    at most 8 (ACCELERATOR_WORKERS): 2 workers leave a fast GPU waiting for its batches."""
    if setting != "auto":
        return int(setting)
    if device.type == "cpu":
        return 0 if held_in_memory(images) else AUTO_WORKERS
    import ignite.distributed as idist

    from cifar10_dist.system.cpu import cpu_threads_per_process

    cores = cpu_threads_per_process() if cores_per_process is None else cores_per_process
    processes = idist.get_nproc_per_node() if local_processes is None else local_processes
    fewest, most = ACCELERATOR_WORKERS
    return min(max(cores - 1, fewest), most) * processes


def worker_start_method() -> str | None:
    """How DataLoader workers start: forked from this process on Linux, as PyTorch does there by default, also in a
    spawned worker, whose default is its launcher's forkserver (the workers would then each import torch again
    through a server without the preload, and the dataset would be pickled to each: about 2 s before a loader's
    first batch, docs/measured.md); a start method set otherwise (spawn) is kept, and elsewhere the platform's
    default (None)."""
    import multiprocessing

    if sys.platform != "linux" or multiprocessing.get_start_method(allow_none=True) not in (None, "fork", "forkserver"):
        return None
    return "fork"


def held_in_memory(images: Any) -> bool:
    """Whether reading ``images`` (None: not known, taken as held) costs no disk: a memory-mapped cache counts
    when its file fits DEVICE_SHARE of the memory available to processes."""
    if not isinstance(images, MappedImages):
        return True
    available = free_bytes(torch.device("cpu"))
    return available is None or images.path.stat().st_size <= DEVICE_SHARE * available


DEVICE_SHARE = 0.8  # of the device's free memory that data_on_device may take: the model needs the rest


def free_bytes(device: torch.device) -> int | None:
    """Free memory on a CUDA device, or the memory available to processes on this machine for a CPU (Linux's
    MemAvailable); None where neither can be asked."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as meminfo:
                line = next(line for line in meminfo if line.startswith("MemAvailable:"))
            return int(line.split()[1]) * 1024
        except (OSError, StopIteration):
            return None
    return None

"""This process's use of the CPU: the cores it takes when several processes share a machine (or a Slurm task),
and glibc's allocator told to keep freed memory (wide batches train faster when their pages stay mapped)."""

from __future__ import annotations

import ctypes
import os

import ignite.distributed as idist
import torch

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (glibc's malloc.h)
NEVER_TRIM = 2**31 - 1  # the largest M_TRIM_THRESHOLD: freed heap memory is not given back to the OS


def configure_cpu_threads() -> None:
    """On CPU, share this launch's cores among its processes unless OMP_NUM_THREADS says otherwise."""
    if "OMP_NUM_THREADS" in os.environ or idist.device().type != "cpu":
        return
    torch.set_num_threads(cpu_threads_per_process())


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory in this process for good: no block of its own mapping (glibc maps
    each block over 32 MiB, a batch of activations, afresh and unmaps it when freed, so every step faults its pages
    in again), no trimming of the heap. False where the C library has no mallopt (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1


def cpu_threads_per_process() -> int:
    """Cores per process: a Slurm task's SLURM_CPUS_PER_TASK shared by the processes started inside that task
    (spawned or by torchrun, which set LOCAL_WORLD_SIZE; an srun task is one process), else this machine's
    cores over the local processes; never more than the cores this process may run on (its CPU mask: taskset,
    cgroups), whatever Slurm's variable says."""
    cores = usable_cores()
    slurm_cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm_cpus and slurm_cpus.isdigit() and "SLURM_PROCID" in os.environ:
        return max(1, min(int(slurm_cpus), cores) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, cores // max(1, idist.get_nproc_per_node()))


def usable_cores() -> int:
    """The cores this process may run on (its CPU mask: taskset, cgroups)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def several_processes_here(processes: int, threads: int, cores: int) -> str | None:
    """What a user starting ``processes`` processes of ``threads`` CPU threads each on one machine of ``cores``
    cores should expect, in a line (None for one process). One process already trains on every core (torch's
    threads); several share them and add the gradients' exchange, so they are no faster (docs/speed.md)."""
    if processes < 2:
        return None
    if processes * threads > cores:
        return (
            f"{processes} processes x {threads} CPU threads on this machine's {cores} cores: more threads than "
            f"cores, so they wait on each other; expect a slower run than one process (OMP_NUM_THREADS="
            f"{max(1, cores // processes)} fits them)"
        )
    return (
        f"{processes} processes share this machine's {cores} cores ({threads} thread{'s' if threads > 1 else ''} "
        "each): one process already "
        "trains on every core, so expect no speed-up, often a slowdown; several CPU processes rehearse a "
        "distributed run, or use several nodes"
    )


def processes_to_run(cores: int, gpus: int) -> str:
    """How many processes this machine runs well, for doctor: one per GPU; on a CPU, one."""
    if gpus:
        return f"{gpus} process(es) run well here, one per GPU: --backend=nccl --nproc_per_node={gpus}"
    return (
        f"1 process runs well here: it trains on all {cores} cores; --nproc_per_node=N shares them among N "
        "processes, no faster (use it to rehearse a distributed run, or one process per node)"
    )

"""What a process's memory is, for the log: its private resident memory now (what a cache mapped by every process
of a node does not count) and its peak, on a GPU also the device's peak."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

logger = logging.getLogger("cifar10_dist")


def private_memory_mib() -> float:
    """This process's private (anonymous) resident memory now, in MiB: what it holds alone, without the pages of
    files it maps (an image cache read on demand, shared by the node's processes); -1 where /proc is missing."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return -1.0
    line = next((line for line in status.splitlines() if line.startswith("RssAnon:")), None)
    return int(line.split()[1]) / 1024 if line else -1.0


def log_peak_memory() -> None:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB), and on a GPU its peak allocated
    and reserved memory."""
    import resource

    logger.info(
        "peak resident memory %.0f MiB (this process)", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        logger.info(
            "peak GPU memory %.0f MiB allocated, %.0f MiB reserved (cuda:%d, this process)",
            torch.cuda.max_memory_allocated(device) / 2**20,
            torch.cuda.max_memory_reserved(device) / 2**20,
            device,
        )

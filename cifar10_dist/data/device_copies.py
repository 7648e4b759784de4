"""Small host tensors (a batch's indices, its random draws) sent to the training device without making the host
wait: on CUDA a copy from pageable memory first waits for the device to finish its queued work, so the host could
never run ahead of the GPU; a copy from pinned memory, non-blocking, is queued like a kernel."""

from __future__ import annotations

import torch


def upload(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``values`` on ``device``: from the CPU to CUDA through pinned memory, non-blocking (torch's pinned-memory
    cache keeps the block until the copy is done); ``.to(device)`` otherwise (the same tensor where it is there)."""
    if device.type != "cuda" or values.device.type != "cpu":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)

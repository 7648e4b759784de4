"""Progressive resizing (fast.ai's, FFCV's linear ramp, Composer's ProgressiveResizing): early epochs train on
smaller images, growing linearly to full size by a fraction of training; evaluation always sees full size. The
size depends only on the epoch, so a resumed run draws the same sizes, and every process trains at the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

STEP = 4  # pixels: sizes are multiples of it (fewer distinct shapes for the kernels to tune)


@dataclass(frozen=True)
class ResizeSchedule:
    """Image side per epoch: ``start`` x ``full`` in the first epoch, rising linearly to ``full`` at epoch
    ``full_from`` (epochs counted from 0), rounded down to a multiple of STEP; ``start`` 1 is off."""

    full: int
    start: float = 1.0
    full_from: float = 0.0

    @property
    def active(self) -> bool:
        return self.start < 1

    def size(self, epoch: int) -> int:
        """The side of the training images in ``epoch`` (0-based)."""
        if not self.active or epoch >= self.full_from:
            return self.full
        scale = self.start + (1 - self.start) * epoch / self.full_from
        return min(self.full, max(STEP, int(self.full * scale) // STEP * STEP))

    def sizes(self, epochs: int) -> list[int]:
        return [self.size(epoch) for epoch in range(epochs)]

    @property
    def smallest(self) -> int:
        return self.size(0)

    def describe(self, epochs: int) -> str:
        """e.g. "16 px in epochs 1-2, 20 px in epoch 3, 24 px in epochs 4-5, 28 px in epoch 6, 32 px in epochs 7-8
        (full size 32 px)"."""
        runs: list[tuple[int, int, int]] = []  # (size, first epoch, last epoch), 1-based
        for epoch, side in enumerate(self.sizes(epochs), start=1):
            if runs and runs[-1][0] == side:
                runs[-1] = (side, runs[-1][1], epoch)
            else:
                runs.append((side, epoch, epoch))
        parts = [
            f"{side} px in epoch{'s' if last > first else ''} {first}{f'-{last}' if last > first else ''}"
            for side, first, last in runs
        ]
        return ", ".join(parts) + f" (full size {self.full} px)"


def schedule(start: float, until: float, num_epochs: int, full: int) -> ResizeSchedule:
    """The run's schedule: ``until`` is the fraction of its ``num_epochs`` by which images are full size again."""
    return ResizeSchedule(full, start, until * num_epochs)


def resize(inputs: torch.Tensor, side: int) -> torch.Tensor:
    """A float batch (N, C, H, W) resized to side x side (bilinear, antialiased: what a smaller photo would show)."""
    if inputs.shape[-1] == side and inputs.shape[-2] == side:
        return inputs
    return torch.nn.functional.interpolate(
        inputs, size=(side, side), mode="bilinear", antialias=True, align_corners=False
    )

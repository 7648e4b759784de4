"""Data selection (``select_hardest_fraction``): each step trains on the hardest part of the batch. A forward pass of
the model without gradients scores every image by its cross-entropy; forward and backward then run on the highest-
scoring ``select_hardest_fraction`` of them alone (backward is most of a step's cost). Selective backprop (Jiang et
al. 2019) with the model as its own scorer; airbench96_faster picks the same way with a small proxy network. Each
process selects from its own batch: with world size W and per-process batch B, every step trains on W x
round(fraction x B) images. The scoring pass leaves BatchNorm's running statistics as they were, so the model's state
after a step depends on the selected images alone: resume stays exact."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from cifar10_dist.system.precision import Precision

logger = logging.getLogger("cifar10_dist")


class HardestSelection:
    """``select(inputs, targets)``: the ``fraction`` of the batch with the highest loss under ``model``'s forward
    (in train mode, no gradients), in their batch order; applied while the iteration is at most ``until``."""

    def __init__(self, model: nn.Module, precision: Precision, fraction: float, until: int) -> None:
        self.model, self.precision, self.fraction, self.until = model, precision, fraction, until
        self.norms = [module for module in model.modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)]

    def applies(self, iteration: int) -> bool:
        return iteration <= self.until

    def kept(self, batch_size: int) -> int:
        return max(1, round(self.fraction * batch_size))

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), self.statistics_kept(), self.precision.autocast():
            scores = F.cross_entropy(self.model(inputs).float(), targets, reduction="none")
        chosen = scores.topk(self.kept(len(inputs))).indices.sort().values
        return inputs[chosen], targets[chosen]

    @contextlib.contextmanager
    def statistics_kept(self) -> Iterator[None]:
        """BatchNorm normalises the scoring pass with its batch's statistics but does not update its running
        ones (momentum 0 while it runs; the batch counter restored)."""
        momenta = [norm.momentum for norm in self.norms]
        counts = [
            norm.num_batches_tracked.clone() if norm.num_batches_tracked is not None else None for norm in self.norms
        ]
        for norm in self.norms:
            norm.momentum = 0.0
        try:
            yield
        finally:
            for norm, momentum, count in zip(self.norms, momenta, counts):
                norm.momentum = momentum
                if count is not None and norm.num_batches_tracked is not None:
                    norm.num_batches_tracked.copy_(count)


def from_config(
    fraction: float, until: float, model: nn.Module, precision: Precision, total_iterations: int, batch_size: int
) -> HardestSelection | None:
    """The run's selection (None when select_hardest_fraction is 1), logged once with what each process keeps."""
    if fraction >= 1:
        return None
    selection = HardestSelection(model, precision, fraction, round(until * total_iterations))
    logger.info(
        "data selection: each process trains on the %d highest-loss images of its %d per step (the model's "
        "own forward pass scores them), for iterations 1-%d of %d",
        selection.kept(batch_size),
        batch_size,
        selection.until,
        total_iterations,
    )
    return selection

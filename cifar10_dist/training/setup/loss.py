"""The training loss, built in one place: cross-entropy with the run's label smoothing and, with ``class_weights``,
one weight per class (the config's ``ClassWeights``, from the training split's image counts per class that the
data setup exposes). The weights are logged and recorded in the run's provenance."""

from __future__ import annotations

import logging
from typing import Sequence

import torch
from torch import nn

from cifar10_dist.config import Config, class_weights
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.system import ranks

logger = logging.getLogger("cifar10_dist")


def training_loss(
    config: Config,
    class_counts: Sequence[int],
    classes: Sequence[str],
    device: torch.device,
    record: Provenance | None = None,
) -> nn.Module:
    """Cross-entropy for training; ``record`` (the run's provenance; None for the lr sweep's loss) gets the class
    weights when there are any."""
    parsed = class_weights(config.class_weights)
    weights = parsed.for_counts(class_counts, classes) if parsed is not None else None
    if weights is not None and record is not None:
        record.class_weights = weights
        ranks.on_rank_zero(
            logger.info,
            "class weights in the training loss: %s",
            ", ".join(f"{name} {weight:.3g}" for name, weight in zip(classes, weights)),
        )
    weight = torch.tensor(weights) if weights is not None else None
    return nn.CrossEntropyLoss(weight=weight, label_smoothing=config.label_smoothing).to(device)

"""airbench's whitening, for a model whitened from data (``models.WhitenedFromData``): its filters are set from the
first training images' patches (as evaluation sees them, normalised) before training; its bias trains in a group of
its own (lr x ``whitening_bias_lr_scale``, weight decay divided by it) for its first ``whitening_bias_epochs``, then
its lr is 0 for good and its gradient is no longer computed (``whitening_bias_frozen``: the backward pass spares the
first conv group's input gradient and the activation before it; every weight moves as before), so the forward has two
branches to warm up."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import torch
from ignite.engine import Engine, Events
from torch import nn

from cifar10_dist import models
from cifar10_dist.config import Config
from cifar10_dist.data import augmentation
from cifar10_dist.data.datasets import DatasetInfo
from cifar10_dist.recipes import GroupApart, register
from cifar10_dist.system.ranks import on_rank_zero

logger = logging.getLogger("cifar10_dist")


def bias_until(config: Config, total_iterations: int) -> int:
    """The last iteration the whitening bias trains (its ``whitening_bias_epochs``)."""
    return round(total_iterations * config.whitening_bias_epochs / config.num_epochs)


class WhiteningBiasFreeze:
    """Sets ``whitening_bias_frozen`` at each iteration: true after iteration ``until`` where the bias's param group
    has lr 0 (its schedule keeps it 0 from then on), read after the LR scheduler has set this iteration's lr."""

    def __init__(self, network: models.WhitenedFromData, optimizer: Any, until: int) -> None:
        bias = network.whiten.bias
        self.index = next(
            index for index, group in enumerate(optimizer.param_groups) if any(p is bias for p in group["params"])
        )
        self.optimizer, self.network, self.until = optimizer, network, until  # (a resume replaces the group dicts)

    def __call__(self, engine: Engine) -> None:
        lr = self.optimizer.param_groups[self.index]["lr"]
        self.network.whitening_bias_frozen = engine.state.iteration > self.until and lr == 0


@contextlib.contextmanager
def frozen_whitening(network: models.WhitenedFromData, frozen: bool) -> Iterator[None]:
    """``whitening_bias_frozen`` set to ``frozen`` inside, as it was after."""
    before, network.whitening_bias_frozen = network.whitening_bias_frozen, frozen
    try:
        yield
    finally:
        network.whitening_bias_frozen = before


class Whitening:
    """The parts of a model whitened from data (its bias trained apart and frozen where it trains at all)."""

    def __init__(self, network: models.WhitenedFromData) -> None:
        self.network, self.bias = network, models.whitening_bias(network)  # type: ignore[arg-type]
        self.bias_trains = self.bias is not None and self.bias.requires_grad

    def init_from_data(self, images: torch.Tensor, info: DatasetInfo) -> None:
        first = augmentation.eval_view(
            images[: models.whitening_images(self.network)].cpu(),  # type: ignore[arg-type]
            info.image_size,
            info.crop_fraction,
        )
        self.network.init_whitening(augmentation.normalize(first, info.mean, info.std))

    def groups_apart(self, config: Config, total_iterations: int) -> list[GroupApart]:
        if self.bias is None or not self.bias_trains:
            return []
        return [
            GroupApart(
                [self.bias],
                config.whitening_bias_lr_scale,
                bias_until(config, total_iterations),
                config.whitening_bias_decay,
            )
        ]

    def attach(self, trainer: Engine, optimizer: Any, config: Config, total_iterations: int) -> None:
        if self.bias_trains:
            trainer.add_event_handler(
                Events.ITERATION_STARTED,
                WhiteningBiasFreeze(self.network, optimizer, bias_until(config, total_iterations)),
            )

    def warm_up_branches(self) -> list[contextlib.AbstractContextManager]:
        """The bias trained, then frozen: another graph to compile, other kernels to time."""
        if not self.bias_trains:
            return [contextlib.nullcontext()]
        return [frozen_whitening(self.network, False), frozen_whitening(self.network, True)]


@register
def whitening_parts(network: nn.Module) -> Whitening | None:
    """The whitening recipe's parts for a model whitened from data; for a model declaring ``init_whitening`` without
    the rest of the trait, one warning per model class that it trains without them."""
    if models.is_whitened_from_data(network):
        return Whitening(network)
    missing = models.missing_whitening_parts(network)
    if missing and type(network) not in warned_classes:
        warned_classes.add(type(network))
        on_rank_zero(
            logger.warning,
            "model %s has init_whitening but lacks %s: it trains as a plain model, without whitening from data, "
            "its bias group or its freeze (declare both to have them)",
            type(network).__name__,
            " and ".join(missing),
        )
    return None


warned_classes: set[type] = set()  # (a run asks for a model's parts several times: one warning a class)

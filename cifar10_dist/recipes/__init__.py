"""A recipe's training-time behaviour, declared by the recipe for the models it fits, through one small interface the
training loop calls (``RecipeParts``): the parameters it trains apart (their own lr scale and schedule), the events
it hooks on the trainer, and the forward branches a warm-up must run. ``training`` names no recipe: it asks
``parts_of(model)``. A new recipe is a model, a config and one module here that registers its parts (``register``);
this package finds its modules itself. Lookahead, airbench's average of the weights, is here too (``lookahead``,
turned on by the key ``periodic_averaging``).

Imports: ``models``, ``data``, ``config`` and Ignite's engine; never ``training``."""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from torch import nn

from cifar10_dist import models
from cifar10_dist.config import Config


@dataclass(frozen=True)
class GroupApart:
    """Parameters a recipe trains in a param group of their own: the run's lr (and weight decay divided) by
    ``lr_scale``, trained up to iteration ``train_until`` (None: to the end), their lr falling linearly to 0 by
    then where ``decay_to_zero``, else following the run's schedule."""

    params: list[nn.Parameter]
    lr_scale: float = 1.0
    train_until: int | None = None
    decay_to_zero: bool = False


class RecipeParts(Protocol):
    def init_from_data(self, images: Any, info: Any) -> None:
        """Set what the model initialises from training images (uint8, as stored) before training (``info``: the
        data's ``DatasetInfo``); never over pretrained weights."""

    def groups_apart(self, config: Config, total_iterations: int) -> list[GroupApart]:
        """The parameters trained in groups of their own."""

    def attach(self, trainer: Any, optimizer: Any, config: Config, total_iterations: int) -> None:
        """Hook the recipe's events on the trainer (after the LR scheduler's)."""

    def warm_up_branches(self) -> list[contextlib.AbstractContextManager]:
        """The training forwards a run will take, a context each to warm up in."""


class NoParts:
    """A model no recipe claims: nothing set from data, nothing apart, nothing hooked, its one forward."""

    def init_from_data(self, images: Any, info: Any) -> None:
        return None

    def groups_apart(self, config: Config, total_iterations: int) -> list[GroupApart]:
        return []

    def attach(self, trainer: Any, optimizer: Any, config: Config, total_iterations: int) -> None:
        return None

    def warm_up_branches(self) -> list[contextlib.AbstractContextManager]:
        return [contextlib.nullcontext()]


PartsFactory = Callable[[nn.Module], "RecipeParts | None"]
FACTORIES: list[PartsFactory] = []


def register(factory: PartsFactory) -> PartsFactory:
    """A recipe module's factory: given the (unwrapped) network, its parts, or None where the recipe does not fit."""
    FACTORIES.append(factory)
    return factory


def parts_of(model: nn.Module) -> RecipeParts:
    """The parts of the first registered recipe that fits the model (DDP's wrapper looked through), or none."""
    network = models.unwrap(model)
    for factory in FACTORIES:
        found = factory(network)
        if found is not None:
            return found
    return NoParts()


for _module in pkgutil.iter_modules(__path__):  # every recipe module registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")

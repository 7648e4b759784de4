"""What a recipe may need to know of a model, declared by the model and asked through these protocols (as timm
keeps a model's settings on it): code outside ``models`` never tests for a concrete network class.

- ``WhitenedFromData``: a layer set from training images before training (``init_whitening``), whose bias alone
  trains (``whiten.bias``) and may stop being trained part-way (``whitening_bias_frozen``: its gradient is then not
  computed). The airbench network is one. Ask ``is_whitened_from_data(model)``, never ``isinstance``: from Python
  3.12 on, ``isinstance`` against a protocol reads attributes statically and misses an ``nn.Module``'s submodules.
"""

from __future__ import annotations

from typing import Protocol, TypeGuard

import torch
from torch import nn


class WhitenedFromData(Protocol):  # not runtime-checkable: isinstance raises TypeError (is_whitened_from_data)
    whiten: nn.Conv2d
    whitening_bias_frozen: bool

    def init_whitening(self, images: torch.Tensor) -> None:
        """Set the whitening filters from (normalised) training images."""


WHITENING_IMAGES = 5000  # training images whose patches set the whitening filters, unless the model says otherwise


def whitening_images(model: nn.Module) -> int:
    """How many training images a model whitened from data initialises its whitening from (its own
    ``whitening_images`` where it declares one)."""
    return int(getattr(model, "whitening_images", WHITENING_IMAGES))


def is_whitened_from_data(model: nn.Module) -> TypeGuard[WhitenedFromData]:
    """Whether ``model`` declares the trait: a ``whiten`` convolution, ``whitening_bias_frozen`` and
    ``init_whitening``, read as the model serves them (``nn.Module.__getattr__`` holds its submodules)."""
    return callable(getattr(model, "init_whitening", None)) and not missing_whitening_parts(model)


def missing_whitening_parts(model: nn.Module) -> list[str]:
    """What a model that declares ``init_whitening`` lacks of the trait (``whiten`` as an ``nn.Conv2d``,
    ``whitening_bias_frozen``); empty for a model with the whole trait, or with no ``init_whitening`` at all."""
    if not callable(getattr(model, "init_whitening", None)):
        return []
    whiten = getattr(model, "whiten", None)
    missing = [] if isinstance(whiten, nn.Conv2d) else [f"whiten as an nn.Conv2d (it is {type(whiten).__name__})"]
    return missing + ([] if hasattr(model, "whitening_bias_frozen") else ["whitening_bias_frozen"])


def whitening_bias(model: nn.Module) -> nn.Parameter | None:
    """The trained bias of a model whitened from data, or None for any other model."""
    return model.whiten.bias if is_whitened_from_data(model) else None  # type: ignore[return-value]

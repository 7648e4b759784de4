"""A model rebuilt from a checkpoint of ours (its recorded model reference and weights, read through
``checkpoint_layout``), and the checks that a checkpoint's weights fit a model, in one line when they do not."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from cifar10_dist import checkpoint_layout
from cifar10_dist.errors import UserError, first_line
from cifar10_dist.models.networks import build_model

logger = logging.getLogger(__name__)


def check_recorded_model(checkpoint: Mapping[str, Any], model: str | None, path: str | Path) -> None:
    """The model the checkpoint was made by (recorded in its meta) against the model this run builds."""
    recorded_config = checkpoint_layout.recorded_config(checkpoint)
    recorded = recorded_config.model if recorded_config is not None else None
    if model is not None and recorded is not None and recorded != model:
        raise UserError(
            f"checkpoint '{path}' was made by model={recorded}, and this run builds model={model}: "
            f"use --model={recorded}, or a checkpoint of {model}"
        )


def state_mismatch(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor]) -> str | None:
    """How a state dict differs from the one a model expects, in a few words (None when it fits)."""
    missing = [key for key in expected if key not in found]
    unexpected = [key for key in found if key not in expected]
    shapes = [key for key in expected if key in found and tuple(expected[key].shape) != tuple(found[key].shape)]
    parts = []
    if missing:
        parts.append(f"{len(missing)} tensor(s) of the model missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensor(s) the model does not have (e.g. {unexpected[0]})")
    if shapes:
        key = shapes[0]
        parts.append(
            f"{len(shapes)} of another shape (e.g. {key}: {tuple(found[key].shape)} in the checkpoint, "
            f"{tuple(expected[key].shape)} in the model)"
        )
    return "; ".join(parts) or None


def check_fits(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor], path: str | Path) -> None:
    mismatch = state_mismatch(expected, found)
    if mismatch:
        raise UserError(f"checkpoint '{path}' does not fit the model this run builds: {mismatch}")


def load_model_weights(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], source: str) -> None:
    check_fits(model.state_dict(), weights, source)
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        raise UserError(f"checkpoint '{source}' does not fit the model: {first_line(error)}") from error


def restore_model(
    checkpoint: Mapping[str, Any],
    path: str | Path,
    num_classes: int,
    model: str | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    raw_weights: bool = False,
) -> torch.nn.Module:
    """A fresh model of ``num_classes`` outputs with the checkpoint's weights: the model (and its factory's keyword
    arguments) the checkpoint records, unless ``model`` is given (then it must be the recorded one). A training
    checkpoint of a run with ``ema_decay`` gives its EMA weights unless ``raw_weights`` (best-model files of such
    a run hold the EMA's)."""
    recorded = checkpoint_layout.recorded_config(checkpoint)
    check_recorded_model(checkpoint, model, path)
    name = model or (recorded.model if recorded is not None else None)
    if name is None:
        raise UserError(f"checkpoint '{path}' does not record its model: give --model")
    kwargs = model_kwargs if model is not None else recorded.model_kwargs if recorded is not None else None
    built = build_model(name, dict(kwargs) if kwargs else None, num_classes)
    load_model_weights(built, checkpoint_layout.model_weights(checkpoint, prefer_ema=not raw_weights), str(path))
    if checkpoint_layout.has_ema(checkpoint):
        logger.info("%s: the %s weights", path, "trained (raw)" if raw_weights else "EMA")
    return built

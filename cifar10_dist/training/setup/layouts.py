"""``channels_last=auto``: the memory format a run trains and evaluates in, chosen by what the hardware runs fast.

oneDNN (CPUs) and cuDNN (CUDA GPUs) run 2D convolutions faster channels-last: measured 0.99-2.38x the default
layout's speed on CPUs (ResNet-18 in fp32 level, airbench 1.37-1.43x, simple_cnn up to 2.38x in bf16:
``python -m benchmarks.layouts``, docs/measurements/layouts_*.json) and 1.11-1.58x on an H200
(docs/measurements/gpu_h200.json). A model without 2D convolutions gains nothing from it, and other devices (XLA,
MPS) are not measured: there it stays off. On a CPU, auto also checks the model's numbers in both layouts against
float64 (about 0.5 s for ResNet-18) and stays off where channels-last is beyond fp32 noise: the layout must never
change a result more than summation order does. The settled value (True or False) replaces "auto" in the run's config,
so checkpoints, evaluation and export see what training used.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import nn

from cifar10_dist import models
from cifar10_dist.config import Config
from cifar10_dist.system import layout_numerics

logger = logging.getLogger("cifar10_dist")

FAST_ON = ("cpu", "cuda")  # devices where channels-last convolutions measured faster


def convolutions(build: Callable[[], nn.Module]) -> int:
    """How many 2D convolutions the model has, built on the meta device (no memory, no weights); a model that
    cannot be built there is built on the CPU. The random state is restored: the run's weights stay the same."""
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                model = build()
        except Exception:  # noqa: BLE001 - a user's model that needs real tensors to build
            model = build()
    return sum(isinstance(module, nn.Conv2d) for module in model.modules())


def choose(
    setting: bool | str, device: torch.device, build: Callable[[], nn.Module], image_size: int = 32
) -> tuple[bool, str]:
    """(channels_last, why) for ``setting`` (True, False or "auto") on ``device``; on a CPU, auto also checks that
    the layout leaves the model's fp32 numbers within noise here (``system.layout_numerics``)."""
    if setting != "auto":
        return bool(setting), f"channels_last={setting} (as given)"
    if device.type not in FAST_ON:
        return False, f"channels_last=auto: off ({device.type}: not measured faster there)"
    count = convolutions(build)
    if not count:
        return False, "channels_last=auto: off (the model has no 2D convolutions)"
    faster = f"{count} 2D convolutions, which {device.type} runs faster channels-last"
    if device.type != "cpu":
        return True, f"channels_last=auto: on ({faster})"
    try:
        numerics = layout_numerics.check(build, image_size)
    except Exception as error:  # noqa: BLE001 - a model that cannot run in float64 on random images
        return False, f"channels_last=auto: off (its numerics could not be checked on this CPU: {error})"
    if not numerics.within_noise:
        return False, f"channels_last=auto: off (it changes this model's numbers on this CPU: {numerics.describe()})"
    return True, f"channels_last=auto: on ({faster}; {numerics.describe()})"


def settle_channels_last(config: Config, device: torch.device, classes: int) -> tuple[bool, str]:
    """channels_last settled to True or False for the config's model with ``classes`` outputs, and why (logged
    where it was auto; a run's provenance keeps it as ``memory_format``)."""
    chosen, why = choose(
        config.channels_last,
        device,
        lambda: models.build_model(config.model, config.model_kwargs, classes),
        config.image_size,
    )
    if config.channels_last == "auto":
        logger.info("memory format: %s", why)
    return chosen, why

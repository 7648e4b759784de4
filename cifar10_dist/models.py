"""Models by name: any torchvision classification model, CIFAR-adapted ResNets, and a small CNN for smoke runs.

Every model outputs 10 logits for a (N, 3, 32, 32) float batch. Nothing here knows about data or launching.
"""

from __future__ import annotations

import difflib

from torch import nn

from cifar10_dist.errors import UserError

NUM_CLASSES = 10
CIFAR_RESNETS = {"cifar_resnet18": "resnet18", "cifar_resnet34": "resnet34", "cifar_resnet50": "resnet50"}


def torchvision_models() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def available_models() -> list[str]:
    return ["simple_cnn", *CIFAR_RESNETS, *torchvision_models()]


def check_model_name(name: str) -> None:
    """Raise a UserError listing the choices when ``name`` is not a known model."""
    choices = available_models()
    if name in choices:
        return
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UserError(f"model='{name}' is unknown{hint}: choose one of {', '.join(choices)}")


def build_model(name: str) -> nn.Module:
    """A freshly initialised model with 10 outputs (initialised from the current torch RNG state)."""
    check_model_name(name)
    if name == "simple_cnn":
        return simple_cnn()
    if name in CIFAR_RESNETS:
        return cifar_resnet(CIFAR_RESNETS[name])
    import torchvision

    return torchvision.models.get_model(name, weights=None, num_classes=NUM_CLASSES)


def cifar_resnet(torchvision_name: str) -> nn.Module:
    """A torchvision ResNet with the CIFAR stem: 3x3 stride-1 first convolution and no max-pool."""
    import torchvision

    model = torchvision.models.get_model(torchvision_name, weights=None, num_classes=NUM_CLASSES)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def simple_cnn(width: int = 32) -> nn.Module:
    """Three conv-BN-ReLU-pool stages and a linear head: about 0.1M parameters, for tests and demos."""

    def stage(channels_in: int, channels_out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels_out),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    return nn.Sequential(
        stage(3, width),
        stage(width, 2 * width),
        stage(2 * width, 2 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, NUM_CLASSES),
    )


def count_parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel/DataParallel wrapper (or the model itself)."""
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model


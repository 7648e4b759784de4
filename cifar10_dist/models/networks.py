"""Models by name: any torchvision classification model, CIFAR-adapted ResNets, the airbench network (fast recipe),
a small CNN for smoke runs, and the user's own (``package.module:factory`` or ``path/to/file.py:factory``).

Every model outputs 10 logits for a (N, 3, 32, 32) float batch. Nothing here knows about data or launching.
A user model is imported by its reference in every process that needs it (never pickled).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from cifar10_dist.config import MODEL_REFERENCE, TIMM_PREFIX, is_model_reference
from cifar10_dist.errors import UserError
from cifar10_dist.models.traits import WHITENING_IMAGES
from cifar10_dist.sources import NUM_CLASSES

CIFAR_RESNETS = {"cifar_resnet18": "resnet18", "cifar_resnet34": "resnet34", "cifar_resnet50": "resnet50"}
REGISTRY: dict[str, Callable[..., nn.Module]] = {}  # this package's networks by name (``register_model``)


def register_model(name: str | None = None) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """A decorator that makes a network factory (a function or class taking ``num_classes``) a built-in model
    under ``name`` (default: its own), as timm's ``@register_model`` does. What a recipe needs to know of the
    model it builds, the model says itself (``models.traits``)."""

    def add(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        REGISTRY[name or factory.__name__] = factory
        return factory

    return add


def torchvision_models() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def available_models() -> list[str]:
    return [*REGISTRY, *torchvision_models()]


def check_model_name(name: str) -> None:
    """Raise a UserError listing the choices when ``name`` is not a known model."""
    if is_model_reference(name):
        import_factory(name)
        return
    if name in REGISTRY:
        return  # no need to import torchvision to know these
    if name.startswith(TIMM_PREFIX):
        check_timm_name(name)
        return
    choices = available_models()
    if name in choices:
        return
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UserError(f"model='{name}' is unknown{hint}: choose one of {', '.join(choices)}")


def build_model(name: str, kwargs: dict[str, Any] | None = None, num_classes: int = NUM_CLASSES) -> nn.Module:
    """A freshly initialised model with ``num_classes`` outputs (initialised from the current torch RNG state),
    built with the keyword arguments ``kwargs``; the name was checked before launch (``check_model``). A user's
    factory gets ``num_classes`` when it takes a parameter of that name."""
    if is_model_reference(name):
        factory = import_factory(name)
        check_keywords(name, factory, kwargs or {})
        return _call_factory(name, factory, {**_class_count(factory, num_classes), **(kwargs or {})})
    builder = _builtin_builder(name)
    check_keywords(name, REGISTRY.get(name, builder), kwargs or {})
    try:
        return builder(**{"num_classes": num_classes, **(kwargs or {})})
    except TypeError as error:  # a keyword the builder does not take
        raise UserError(f"model={name} does not accept model_kwargs={kwargs}: {error}") from error


def check_keywords(name: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Each model_kwargs key a parameter of the factory, where its signature names them all (no ``**kwargs``);
    else one line with the closest parameter and the list of them."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values()):
        return  # (torchvision's and timm's builders pass them on: their model's own error speaks)
    keywords = [key for key, one in parameters.items() if one.kind in (one.POSITIONAL_OR_KEYWORD, one.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in keywords:
            close = difflib.get_close_matches(key, keywords, n=1, cutoff=0.7)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UserError(
                f"model_kwargs={kwargs}: '{key}' is not a parameter of model='{name}': {hint}it takes "
                f"{', '.join(keywords) or 'none'}"
            )


def require_timm() -> Any:
    """The timm module, or one line saying how to install it."""
    try:
        import timm
    except ImportError as missing:
        raise UserError(
            "model=timm:NAME needs the timm package, which is not installed: pip install 'cifar10-dist[timm]'"
        ) from missing
    return timm


def check_timm_name(name: str) -> None:
    """A model of timm's zoo (a pretrained tag may follow the name: timm:resnet50.a1_in1k), else one line."""
    timm = require_timm()
    wanted = name[len(TIMM_PREFIX) :]
    if not timm.models.is_model(wanted):
        close = difflib.get_close_matches(wanted, timm.list_models(), n=1)
        hint = f" (did you mean 'timm:{close[0]}'?)" if close else ""
        raise UserError(f"model='{name}' is not a model of timm {timm.__version__}{hint}: see timm.list_models()")


def _builtin_builder(name: str) -> Callable[..., nn.Module]:
    if name.startswith(TIMM_PREFIX):
        return lambda **kwargs: require_timm().create_model(name[len(TIMM_PREFIX) :], pretrained=False, **kwargs)
    if name in REGISTRY:
        return REGISTRY[name]
    import torchvision

    return lambda **kwargs: torchvision.models.get_model(name, weights=None, **kwargs)


def _class_count(factory: Callable[..., Any], num_classes: int) -> dict[str, int]:
    """{"num_classes": n} when the factory takes that keyword, else nothing (its output is checked instead)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    takes = "num_classes" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    return {"num_classes": num_classes} if takes else {}


def check_model(
    name: str, kwargs: dict[str, Any] | None = None, num_classes: int = NUM_CLASSES, image_size: int = 32
) -> None:
    """Before launch: the model exists, and when it is the user's own, built with ``kwargs``, for another number
    of classes or another image size, it builds and maps a 2-image batch (N, 3, S, S) to (2, num_classes) logits.
    Each failure is one UserError naming the model."""
    check_model_name(name)
    if not is_model_reference(name) and not kwargs and num_classes == NUM_CLASSES and image_size == 32:
        return
    model = build_model(name, kwargs, num_classes)
    dummy = torch.zeros(2, 3, image_size, image_size)
    try:
        with torch.no_grad():
            output = model.eval()(dummy)
    except Exception as error:
        raise UserError(
            f"model='{name}': the model's forward on a {tuple(dummy.shape)} batch raised {_one_line(error)}"
        ) from error
    shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
    if shape != (2, num_classes):
        raise UserError(
            f"model='{name}' returned {shape} for a {tuple(dummy.shape)} batch: expected a tensor of "
            f"shape (2, {num_classes}), one logit per class"
        )


def import_factory(reference: str) -> Callable[..., Any]:
    """The callable that ``module:factory`` or ``file.py:factory`` names (a UserError naming what is wrong)."""
    match = MODEL_REFERENCE.match(reference)
    if match is None:
        raise UserError(
            f"model='{reference}' is not a model reference: write package.module:factory or path/to/file.py:factory"
        )
    module = _import_source(reference, match["source"])
    found: Any = module
    for part in match["attribute"].split("."):
        if not hasattr(found, part):
            names = [name for name in dir(found) if not name.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserError(f"model='{reference}': {match['source']} has no attribute '{part}'{hint}")
        found = getattr(found, part)
    if not callable(found):
        raise UserError(
            f"model='{reference}': {match['attribute']} is not callable (it is of type "
            f"{type(found).__name__}): name a function or class that returns an nn.Module"
        )
    return found


def _import_source(reference: str, source: str) -> Any:
    """Import a module by name (the current folder is searchable, as for ``python -m``) or a .py file by path."""
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise UserError(f"model='{reference}': the file {source} does not exist")
        name = "cifar10_dist_user_model_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None  # (a .py file: checked by the caller)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as error:
            del sys.modules[name]
            raise UserError(f"model='{reference}': importing {source} raised {_one_line(error)}") from error
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(source)
    except Exception as error:
        raise UserError(f"model='{reference}': cannot import {source}: {_one_line(error)}") from error


def _call_factory(reference: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> nn.Module:
    try:
        model = factory(**kwargs)
    except Exception as error:
        raise UserError(f"model='{reference}': the factory raised {_one_line(error)}") from error
    if not isinstance(model, nn.Module):
        raise UserError(f"model='{reference}': the factory returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def cifar_resnet(torchvision_name: str, num_classes: int = NUM_CLASSES, **kwargs: Any) -> nn.Module:
    """A torchvision ResNet with the CIFAR stem: 3x3 stride-1 first convolution and no max-pool."""
    import torchvision

    model = torchvision.models.get_model(torchvision_name, weights=None, num_classes=num_classes, **kwargs)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


@register_model()
def simple_cnn(width: int = 32, num_classes: int = NUM_CLASSES) -> nn.Module:
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
        nn.Linear(2 * width, num_classes),
    )


class _FastNorm(nn.BatchNorm2d):
    """BatchNorm with fast running statistics (momentum 0.4), tiny eps and a fixed scale of 1 (bias trained)."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels, eps=1e-12, momentum=0.4)
        self.weight.requires_grad = False


class _IdentityInitConv(nn.Conv2d):
    """3x3 'same' convolution without bias, initialised with identity (dirac) filters on its first channels."""

    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(channels_in, channels_out, kernel_size=3, padding="same", bias=False)
        nn.init.dirac_(self.weight.data[:channels_in])


class GlobalMaxPool(nn.Module):
    """The maximum over each channel's whole map, as max_pool2d with the map's size as its window: airbench's
    MaxPool2d(3) on the 3x3 map of 32-px images, and any other size (progressive resizing). Not AdaptiveMaxPool2d,
    whose CUDA kernel has no channels-last path: it copies its input to contiguous first (pytorch/pytorch#116482),
    200 us a call on an H200 (docs/gpu-report.md). The same maxima and gradients, bit for bit, on the CPU."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return nn.functional.max_pool2d(images, kernel_size=images.shape[-2:])


ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "silu": nn.SiLU}  # airbench94's; hiverge's record's


def _conv_group(channels_in: int, channels_out: int, activation: type[nn.Module] = nn.GELU) -> nn.Sequential:
    return nn.Sequential(
        _IdentityInitConv(channels_in, channels_out),
        nn.MaxPool2d(2),
        _FastNorm(channels_out),
        activation(),
        _IdentityInitConv(channels_out, channels_out),
        _FastNorm(channels_out),
        activation(),
    )


@register_model("airbench")
class AirbenchNet(nn.Module):
    """The network of Keller Jordan's airbench94 (arXiv 2404.00498): a frozen 2x2 whitening convolution
    (initialised from training patches by ``init_whitening``; only its bias trains), three conv groups of
    64/256/256 channels, a global max-pool (airbench's 3x3 max-pool at 32 px; smaller images too, for progressive
    resizing), a linear head scaled by 1/9. About 2M parameters, 0.24 GFLOP per image. ``activation``: GELU (as
    airbench94) or SiLU (as hiverge's cifar10_speedrun.py).

    ``whitening_bias_frozen`` (set by ``training.loop.freezing.WhiteningBiasFreeze`` once the bias's lr is 0 for good):
    the backward pass stops at the first conv group's filters, as airbench's own code does (the whitening output
    no longer needs a gradient: that saves the first group's input gradient and the activation before it); the bias
    still joins the graph with a zero gradient, so DDP sees every parameter used."""

    whitening_bias_frozen = False
    whitening_images = WHITENING_IMAGES  # training images whose 2x2 patches set the whitening filters (airbench94's)

    def __init__(
        self,
        widths: tuple[int, int, int] = (64, 256, 256),
        whitening_kernel: int = 2,
        num_classes: int = NUM_CLASSES,
        activation: str = "gelu",
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise UserError(f"model=airbench activation={activation!r} is not one of {', '.join(ACTIVATIONS)}")
        act = ACTIVATIONS[activation]
        whitened = 2 * 3 * whitening_kernel**2
        self.whiten = nn.Conv2d(3, whitened, kernel_size=whitening_kernel, padding=0, bias=True)
        self.whiten.weight.requires_grad = False
        nn.init.zeros_(self.whiten.bias)  # type: ignore[arg-type]  # (bias=True)
        self.layers = nn.Sequential(
            act(),
            _conv_group(whitened, widths[0], act),
            _conv_group(widths[0], widths[1], act),
            _conv_group(widths[1], widths[2], act),
            GlobalMaxPool(),  # airbench's MaxPool2d(3) on the 3x3 map of 32-px images; any size >= 16 px
            nn.Flatten(),
        )
        self.head = nn.Linear(widths[2], num_classes, bias=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and self.whitening_bias_frozen):  # (evaluation never reads the flag)
            return self.head(self.layers(self.whiten(images))) / 9
        bias = self.whiten.bias
        assert bias is not None
        whitened = nn.functional.conv2d(images, self.whiten.weight, bias.detach())
        return self.head(self.layers(whitened)) / 9 + 0 * bias.sum()  # exactly the same logits

    @torch.no_grad()
    def init_whitening(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        """Set the whitening filters from normalised float images (N, 3, 32, 32): the eigenvectors of the
        patch covariance scaled by 1/sqrt(eigenvalue + eps), each with its negative."""
        kernel = self.whiten.kernel_size[0]
        patches = images.float().unfold(2, kernel, 1).unfold(3, kernel, 1)  # (N, C, H', W', k, k)
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, 3 * kernel * kernel).double()
        covariance = patches.T @ patches / len(patches)
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
        filters = (eigenvectors.T / torch.sqrt(eigenvalues.clamp(min=0) + eps)[:, None]).flip(0)
        filters = filters.reshape(-1, 3, kernel, kernel).to(self.whiten.weight.dtype)
        self.whiten.weight.copy_(torch.cat([filters, -filters]))


for _name, _torchvision_name in CIFAR_RESNETS.items():
    register_model(_name)(functools.partial(cifar_resnet, _torchvision_name))


def count_parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside its DistributedDataParallel/DataParallel and torch.compile wrappers, in whichever order
    (or the model itself). A compiled module holds its model as ``_orig_mod``; with DDP inside it, attributes of
    the model are not reachable through the compiled module."""
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    while True:
        compiled = model._modules.get("_orig_mod") if type(model).__name__ == "OptimizedModule" else None
        if isinstance(model, wrappers):
            model = model.module
        elif compiled is not None:  # (torch._dynamo's class, known by name so as not to import dynamo here)
            model = compiled
        else:
            return model

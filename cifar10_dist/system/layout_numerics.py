"""Whether training channels-last changes a model's numbers on this machine beyond fp32 noise.

fp32 results depend on summation order, which a memory format changes: that difference is noise, the same kind a
different thread count makes. A kernel that computes less exactly in one layout (an implicit bf16 or TF32 path, a
bug) is not. So each layout's fp32 result is compared with a float64 reference of the same model and inputs, and
channels-last passes when its error is at most TOLERANCE times the contiguous layout's.

Two comparisons, both free of ReLU's kink (a pre-activation within fp32 noise of zero flips its ReLU and moves a
whole gradient by up to 1%, in either layout: seen on ResNet-18, docs/measurements/layout_numerics_zen5.json):
the model's forward pass (continuous), and forward and backward of each of its own convolution and BatchNorm layers
on the inputs they saw in that pass (input and weight gradients). Measured on a Zen 5 EPYC (AVX512-BF16) in fp32:
channels-last's error 1.3-1.9x the contiguous layout's for ResNet-18, airbench and simple_cnn, all between 1e-6
and 2e-5 relative (``python -m benchmarks.layout_numerics``, docs/measurements/layout_numerics_zen5.json).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

TOLERANCE = 10.0  # channels-last's error may be this many times the contiguous layout's
FLOOR = 1e-6  # errors below this relative size are fp32 noise whatever their ratio
LAYERS = (nn.Conv2d, nn.BatchNorm2d)


@dataclass(frozen=True)
class LayoutNumerics:
    """Relative L2 errors against float64 of the fp32 contiguous and channels-last results (the worse of the model's
    forward pass and every convolution and BatchNorm layer's forward and gradients), and how many layers."""

    contiguous_error: float
    channels_last_error: float
    layers: int

    @property
    def within_noise(self) -> bool:
        return self.channels_last_error <= max(TOLERANCE * self.contiguous_error, FLOOR)

    def describe(self) -> str:
        ratio = self.channels_last_error / max(self.contiguous_error, 1e-30)
        verdict = "within fp32 noise" if self.within_noise else f"beyond fp32 noise (over {TOLERANCE:g}x)"
        return (
            f"fp32 error against float64 {self.channels_last_error:.1e} channels-last, "
            f"{self.contiguous_error:.1e} contiguous ({ratio:.1f}x, {self.layers} layers): {verdict}"
        )


def check(build: Callable[[], nn.Module], image_size: int = 32, batch_size: int = 4) -> LayoutNumerics:
    """Compare both layouts on a model from ``build`` (random weights and images, seeded; the caller's random
    state is left as it was), on the CPU."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build().double().train()
        images = torch.randn(batch_size, 3, image_size, image_size, dtype=torch.float64)
        inputs = layer_inputs(model, images)
        expected = results(model, images, inputs, torch.float64, torch.contiguous_format)
        contiguous, channels_last = (
            max(map(relative_error, results(model, images, inputs, torch.float32, layout), expected))
            for layout in (torch.contiguous_format, torch.channels_last)
        )
    return LayoutNumerics(contiguous, channels_last, len(inputs))


def layer_inputs(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """The input each convolution and BatchNorm layer sees in a float64 forward pass of ``images``."""
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            seen.setdefault(name, args[0])  # the first call (a layer used twice is checked on its first input)

        return hook

    copied = copy.deepcopy(model)
    hooks = [
        module.register_forward_hook(keep(name))
        for name, module in copied.named_modules()
        if isinstance(module, LAYERS)
    ]
    try:
        with torch.no_grad():
            copied(images)
    finally:
        for hook in hooks:
            hook.remove()
    modules, distinct = dict(copied.named_modules()), {}
    for name, tensor in seen.items():  # one layer of each kind, size and input shape (ResNet-18: 14 of 40)
        layer = modules[name]
        kind = (repr(layer), tuple(tensor.shape))
        if tensor.dim() == 4 and kind not in distinct:
            distinct[kind] = name
    return {name: seen[name].detach() for name in distinct.values()}


def results(
    model: nn.Module,
    images: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    dtype: torch.dtype,
    layout: torch.memory_format,
) -> list[torch.Tensor]:
    """The model's output, then each checked layer's output and gradients, in ``dtype`` and ``layout``."""
    copied = copy.deepcopy(model).to(dtype=dtype).to(memory_format=layout)
    with torch.no_grad():
        found = [copied(images.to(dtype).contiguous(memory_format=layout)).double()]
    modules = dict(copied.named_modules())
    for name, tensor in inputs.items():
        found += layer_results(modules[name], tensor, dtype, layout)
    return found


def layer_results(
    layer: nn.Module, tensor: torch.Tensor, dtype: torch.dtype, layout: torch.memory_format
) -> list[torch.Tensor]:
    """A layer's output, input gradient and parameter gradients for a fixed output gradient."""
    copied = copy.deepcopy(layer).to(dtype=dtype).to(memory_format=layout)
    given = tensor.to(dtype=dtype, copy=True).contiguous(memory_format=layout).requires_grad_()
    output = copied(given)
    generator = torch.Generator().manual_seed(1)
    upstream = torch.randn(output.shape, generator=generator, dtype=torch.float64)
    output.backward(upstream.to(dtype).contiguous(memory_format=layout))
    gradients = [parameter.grad for parameter in copied.parameters() if parameter.grad is not None]
    return [result.double() for result in (output.detach(), given.grad, *gradients)]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm().clamp_min(1e-30))

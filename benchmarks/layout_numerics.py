"""Does channels-last change a model's fp32 numbers on this CPU beyond noise? The check ``channels_last=auto``
runs (``system.layout_numerics``) for several models, and for ResNet-18 the whole training step's gradient over
several random batches in each layout against float64, with the ReLUs whose sign differs from float64's. Last run:
AMD EPYC Zen 5 (AVX512-BF16), docs/measurements/layout_numerics_zen5.json: channels-last's error 1.3-1.9x the
contiguous layout's (about 1e-6 to 2e-5 relative), every model within fp32 noise; ResNet-18's whole gradient is off
by 5e-4 to 6e-3 only in the batches where one ReLU flips (2 of 8 in each layout), else by 3e-6 to 6e-6. About 20 s.

    python -m benchmarks.layout_numerics [--models=resnet18,cifar_resnet18,airbench,simple_cnn] [--batches=8]
        [--json=PATH]
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import torch
from torch import nn

from benchmarks import records
from cifar10_dist import models
from cifar10_dist.system import layout_numerics


def model_check(name: str) -> dict[str, Any]:
    started = time.perf_counter()
    numerics = layout_numerics.check(lambda: models.build_model(name))
    return {
        "model": name,
        "contiguous_error": numerics.contiguous_error,
        "channels_last_error": numerics.channels_last_error,
        "ratio": numerics.channels_last_error / numerics.contiguous_error,
        "layers": numerics.layers,
        "within_noise": numerics.within_noise,
        "seconds": time.perf_counter() - started,
    }


def step_gradient(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype, layout: torch.memory_format
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The whole gradient of one training step, and every ReLU's input, in ``dtype`` and ``layout``."""
    copied = copy.deepcopy(model).to(dtype=dtype, memory_format=layout)
    relu_inputs: list[torch.Tensor] = []
    for module in copied.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = False
            module.register_forward_hook(lambda module, args, output: relu_inputs.append(args[0].detach().double()))
    loss = nn.functional.cross_entropy(copied(images.to(dtype).contiguous(memory_format=layout)), labels)
    loss.backward()
    return torch.cat([parameter.grad.double().reshape(-1) for parameter in copied.parameters()]), relu_inputs


def whole_gradients(batches: int, batch_size: int = 16) -> list[dict[str, Any]]:
    """ResNet-18's whole step gradient in each fp32 layout against float64, batch by batch."""
    rows = []
    for seed in range(batches):
        torch.manual_seed(seed)
        model = models.build_model("resnet18")
        images, labels = torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))
        expected, expected_relus = step_gradient(model, images, labels, torch.float64, torch.contiguous_format)
        row: dict[str, Any] = {"seed": seed}
        for name, layout in (("contiguous", torch.contiguous_format), ("channels_last", torch.channels_last)):
            got, relus = step_gradient(model, images, labels, torch.float32, layout)
            row[f"{name}_gradient_error"] = layout_numerics.relative_error(got, expected)
            row[f"{name}_relu_flips"] = sum(
                int(((one > 0) != (other > 0)).sum()) for one, other in zip(relus, expected_relus)
            )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,cifar_resnet18,airbench,simple_cnn")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--json", dest="json_path", default="benchmark_layout_numerics.json")
    args = parser.parse_args()
    checks = [model_check(name) for name in args.models.split(",")]
    for row in checks:
        print(
            f"{row['model']:<16} channels-last {row['channels_last_error']:.1e}, contiguous "
            f"{row['contiguous_error']:.1e} ({row['ratio']:.1f}x, {row['layers']} layers): "
            f"{'within' if row['within_noise'] else 'BEYOND'} fp32 noise, {row['seconds']:.1f} s"
        )
    gradients = whole_gradients(args.batches)
    for row in gradients:
        print(
            f"resnet18 batch {row['seed']}: whole gradient error contiguous {row['contiguous_gradient_error']:.1e} "
            f"({row['contiguous_relu_flips']} ReLU flips), channels-last {row['channels_last_gradient_error']:.1e} "
            f"({row['channels_last_relu_flips']} flips)"
        )
    records.write(
        args.json_path,
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "tolerance": layout_numerics.TOLERANCE,
            "floor": layout_numerics.FLOOR,
            "torch": torch.__version__,
            "checks": checks,
            "resnet18_whole_gradients": gradients,
        },
    )


if __name__ == "__main__":
    main()

"""Augmentation cost: microseconds per image of each training-batch transform on this machine's CPU (crop+flip,
TrivialAugment, RandAugment, AutoAugment, RandomErasing, MixUp/CutMix, normalisation), applied as a run applies
them to a uint8 batch. Medians of --rounds rounds of one batch each; about 20 seconds on 2 cores. Last run:
docs/recipes.md, "Recipe options" (CPU named there).

    python -m benchmarks.augment_cost [--batch_size=512] [--image_size=32] [--rounds=5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from benchmarks import records
from cifar10_dist.data import augmentation


def cases(size: int) -> dict[str, Callable[[torch.Tensor, torch.Tensor], object]]:
    generator = torch.Generator().manual_seed(0)
    policies = {name: augmentation.policy(name) for name in ("trivialaugment", "randaugment", "autoaugment")}
    erasing = augmentation.random_erasing(1.0)
    mix = augmentation.mixing(0.2, 1.0, 10)
    return {
        "crop + flip (ours, batched)": lambda x, y: augmentation.augment(x, generator),
        **{
            f"{name} (per image)": (lambda p: lambda x, y: augmentation.per_image(p, x))(p)
            for name, p in policies.items()
        },
        "normalise": lambda x, y: augmentation.normalize(x),
        "random erasing p=1 (per image)": lambda x, y: augmentation.per_image(erasing, augmentation.normalize(x)),
        "mixup/cutmix (batched)": lambda x, y: mix(augmentation.normalize(x), y),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=512)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    images = torch.randint(0, 256, (args.batch_size, 3, args.image_size, args.image_size), dtype=torch.uint8)
    labels = torch.randint(0, 10, (args.batch_size,))
    print(
        f"batch {args.batch_size} of {args.image_size}x{args.image_size}, {args.rounds} rounds, "
        f"{records.machine('cpu')}, torch {torch.__version__}"
    )
    print(f"{'transform':<36}{'us/image':>10}")
    for name, transform in cases(args.image_size).items():
        transform(images, labels)  # warm-up
        seconds = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            transform(images, labels)
            seconds.append(time.perf_counter() - started)
        print(f"{name:<36}{statistics.median(seconds) / args.batch_size * 1e6:>10.1f}", flush=True)


if __name__ == "__main__":
    main()

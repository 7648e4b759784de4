"""Random-resized crops of a training batch on one device: torchvision's ``resized_crop`` per image
(``augmentation.resized_crops``, what a run uses) against one batched kernel (``augmentation.batched_resized_crops``,
torchvision.ops.roi_align), the same boxes and flips, in microseconds per image (median of --rounds, the device
synchronised). Two settings: 224-px crops of images stored at 256 (a photo folder) and 28-px crops of 32-px
images (CIFAR-size folders).

    python -m benchmarks.crops [--device=cuda] [--rounds=20] [--json=PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks import records
from cifar10_dist.data import augmentation

# name: (stored side, crop side, smallest area fraction, batch)
SETTINGS = {"photo_256_to_224": (256, 224, 0.08, 256), "cifar_32_to_28": (32, 28, 0.35, 512)}


def microseconds_per_image(crop: Callable[[], torch.Tensor], device: torch.device, count: int, rounds: int) -> float:
    def synchronise() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        crop()
    synchronise()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        crop()
        synchronise()
        times.append(time.perf_counter() - started)
    return 1e6 * statistics.median(times) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", dest="json_path", default="benchmark_crops.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(records.machine(args.device), flush=True)
    generator = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {}
    for name, (stored, size, scale, batch) in SETTINGS.items():
        images = torch.randint(0, 256, (batch, 3, stored, stored), dtype=torch.uint8, generator=generator).to(device)
        boxes = augmentation.random_resized_boxes(batch, stored, scale, generator)
        flips = torch.rand(batch, generator=generator) < 0.5
        per_image = microseconds_per_image(
            lambda: augmentation.resized_crops(images, boxes, size, flips), device, batch, args.rounds
        )
        batched = microseconds_per_image(
            lambda: augmentation.batched_resized_crops(images, boxes, size, flips), device, batch, args.rounds
        )
        results[name] = {
            "stored": stored,
            "size": size,
            "scale": scale,
            "batch": batch,
            "per_image_loop_us": per_image,
            "batched_us": batched,
            "speedup": per_image / batched,
        }
        print(
            f"{name}: per-image loop {per_image:.1f} us/image, batched {batched:.1f} us/image "
            f"({per_image / batched:.2f}x)",
            flush=True,
        )
    records.write(
        Path(args.json_path),
        {
            "device": str(device),
            "torch": str(torch.__version__),
            "hardware": records.hardware_record(args.device),
            "results": results,
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

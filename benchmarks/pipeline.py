"""Input pipeline at 224 px: images per second per CPU core with random-resized crop and flip, ours against
torchvision's ImageFolder + PIL transforms in a DataLoader.

The images are the JPEG archive's CIFAR-10 training images upscaled to 500x375 and saved as JPEG q90 (what a
photo folder holds; made here, once, under --work). Both pipelines run in this one process on one thread
(torch.set_num_threads(1), DataLoader without workers), so each figure is what one core delivers; a DataLoader
spreads the same work over its workers. torchvision: ImageFolder -> RandomResizedCrop(224) (PIL, bilinear) ->
RandomHorizontalFlip -> ToTensor -> Normalize, batches of 64. Ours: the folder's cache (decoded once at 256 px,
224 / 0.875, built in parallel and timed separately) read on demand per batch of 64 (``MappedImages``); then,
where a run does them on the training device, random-resized crops to 224 (``augmentation.resized_crops``) and
flips on uint8, and normalisation: three rows, for the work left on the CPU when the device is a GPU (the reads),
when the crops are made on this CPU, and for CPU training (all of it). Several rounds; the median is reported. Last run: docs/your-data.md (CPU named
there, JSON in docs/measurements/pipeline_cpu.json).

    python -m benchmarks.pipeline --work=DIR [--archive=../shared/data/cifar10-jpg.tar.xz] [--images=2000]
        [--rounds=3] [--json=PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks import records
from benchmarks.transfer import extract

SIZE, STORED, BATCH = 224, 256, 64
SCALE = 0.08  # torchvision's RandomResizedCrop default


def photo_folder(images: Path, target: Path, count: int) -> Path:
    """``count`` training images of the archive (an equal share per class), upscaled to 500x375, JPEG q90."""
    from PIL import Image

    classes = sorted(path.name for path in (images / "train").iterdir())
    for name in classes:
        folder = target / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        for source in sorted((images / "train" / name).glob("*.jpg"))[: count // len(classes)]:
            made = folder / source.name
            if not made.exists():
                with Image.open(source) as image:
                    image.convert("RGB").resize((500, 375), Image.BICUBIC).save(made, quality=90)
    return target


def images_per_second(run_epoch: Callable[[], int], rounds: int) -> tuple[float, list[float]]:
    """The median over ``rounds`` of images / seconds of one pass."""
    speeds = []
    for _ in range(rounds):
        started = time.perf_counter()
        count = run_epoch()
        speeds.append(count / (time.perf_counter() - started))
    return statistics.median(speeds), speeds


def torchvision_epoch(folder: Path) -> Callable[[], int]:
    from torchvision import datasets, transforms

    pipeline = transforms.Compose([transforms.RandomResizedCrop(SIZE, scale=(SCALE, 1.0)),
                                   transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                                   transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    loader = torch.utils.data.DataLoader(datasets.ImageFolder(str(folder / "train"), pipeline), batch_size=BATCH,
                                         shuffle=True, num_workers=0)

    def epoch() -> int:
        return sum(len(images) for images, _ in loader)

    return epoch


def our_epoch(folder: Path, stage: str) -> tuple[Callable[[], int], float]:
    """One pass of our training batches over the folder's train split, up to ``stage``: "reads" (the batch
    gathered from the cache: what the CPU does when the crops run on the GPU), "crops" (and random-resized crops
    and flips on this CPU, uint8: normalisation then happens on the training device) or "normalised" (and
    normalised here too: CPU training); and the cache's build seconds."""
    from cifar10_dist.data import augmentation, folder_source, loaders

    started = time.perf_counter()
    loaded = folder_source.load_folder(folder, STORED)  # the cache: built now (timed) or reused
    build = time.perf_counter() - started if loaded.built else loaded.meta.build_seconds
    train = loaders.make_loaders(loaded.train, loaded.train, batch_size=BATCH, num_workers=0, train_eval_size=0,
                                 seed=0).train
    generator = torch.Generator().manual_seed(0)

    def epoch() -> int:
        count = 0
        for images, _ in train:
            if stage != "reads":
                boxes = augmentation.random_resized_boxes(len(images), STORED, SCALE, generator)
                images = augmentation.augment(augmentation.resized_crops(images, boxes, SIZE), generator, 0)
            if stage == "normalised":
                images = augmentation.normalize(images, loaded.info.mean, loaded.info.std)
            count += len(images)
        return count

    return epoch, build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="a folder for the extracted archive and the photo folder")
    parser.add_argument("--archive", default=str(records.REPO.parent / "shared" / "data" / "cifar10-jpg.tar.xz"))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_path", default="benchmark_pipeline.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    machine = records.machine("cpu")
    print(f"{machine}, torch {torch.__version__}; one thread", flush=True)
    work = Path(args.work)
    folder = photo_folder(extract(Path(args.archive), work), work / f"photos-{args.images}", args.images)
    build = our_epoch(folder, "reads")[1]
    print(f"cache of {args.images} images at {STORED} px: {build:.1f} s to build (all cores, once)", flush=True)
    pipelines = {"torchvision ImageFolder + PIL (normalised)": torchvision_epoch(folder),
                 "ours: reads (crops on the GPU)": our_epoch(folder, "reads")[0],
                 "ours: reads + crops + flips (uint8)": our_epoch(folder, "crops")[0],
                 "ours: ... + normalised (CPU training)": our_epoch(folder, "normalised")[0]}
    results: dict[str, Any] = {}
    for name, epoch in pipelines.items():
        median, speeds = images_per_second(epoch, args.rounds)
        results[name] = {"images_per_second_per_core": median, "rounds": speeds}
        print(f"{name:<44} {median:8.1f} images/s on one core  (rounds: "
              f"{', '.join(f'{speed:.1f}' for speed in speeds)})", flush=True)
    base = results["torchvision ImageFolder + PIL (normalised)"]["images_per_second_per_core"]
    ratios = {name: result["images_per_second_per_core"] / base for name, result in results.items()}
    for name, ratio in list(ratios.items())[1:]:
        print(f"{name}: {ratio:.2f}x torchvision's per core")
    records.write(Path(args.json_path), {
        "machine": machine, "hardware": records.hardware_record(), "commit": records.commit(),
        "torch": str(torch.__version__), "images": args.images, "size": SIZE, "stored": STORED, "scale": SCALE,
        "batch": BATCH, "cache_build_seconds": build, "results": results, "ratios": ratios})
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

"""Input pipeline at 224 px: images per second per CPU core with random-resized crop, flip and normalisation, ours
against torchvision's ImageFolder + PIL transforms, the same work per image on both sides, the decoding counted.

The images are the JPEG archive's CIFAR-10 training images upscaled to 500x375 and saved as JPEG q90 (what a
photo folder holds; made here, once, under --work). Both pipelines run in this one process on one thread
(torch.set_num_threads(1), DataLoader without workers; freed memory kept, as a run keeps it), so each figure is
what one core delivers; a DataLoader spreads the same work over its workers (benchmarks/pipeline_training.py runs
it end to end).

Per image, torchvision: decode the JPEG, RandomResizedCrop(224, scale 0.08-1) from the whole photo (PIL,
bilinear), RandomHorizontalFlip, ToTensor, Normalize. Ours: the folder's cache holds each photo decoded once,
its shorter side scaled to 256 (224 / 0.875) and the centre 256x256 kept (built by one decoding process, timed
on its own); per batch of 64 the rows are read from the memory map (``MappedImages``), then random-resized crops
to 224 of that stored square (``augmentation.resized_crops``, the same scale range), flips and normalisation.
So after the cache exists both sides crop, flip and normalise, and only ours skips the decode, which the cache
build did once: the "amortised" ratios add the build's CPU seconds (the decoding process's and this one's, which
writes the rows) spread over 1 and over 10 epochs. Two
more rows say what the CPU alone must do when the training device normalises (uint8 crops) or also crops (the
reads alone): the CPU's share of the work, not a pipeline, and no GPU ran here. The median of several rounds.
Last run: docs/your-data.md (CPU named there, JSON in docs/measurements/pipeline_cpu.json).

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
from cifar10_dist.system import cpu

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

    pipeline = transforms.Compose(
        [
            transforms.RandomResizedCrop(SIZE, scale=(SCALE, 1.0)),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    loader = torch.utils.data.DataLoader(
        datasets.ImageFolder(str(folder / "train"), pipeline), batch_size=BATCH, shuffle=True, num_workers=0
    )

    def epoch() -> int:
        return sum(len(images) for images, _ in loader)

    return epoch


def build_cache(folder: Path) -> tuple[float, float]:
    """The folder's cache at STORED px, built now by one decoding process: (wall seconds, CPU seconds of the
    decoding process and of this one, which scans the folder and writes the decoded rows into the map); a cache
    left by an earlier run is removed first, so the build is always measured."""
    import resource
    import shutil

    from cifar10_dist.data import cache_builds, folder_scan

    def cpu_seconds() -> float:
        usages = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return sum(usage.ru_utime + usage.ru_stime for usage in usages)

    shutil.rmtree(folder / folder_scan.CACHE_FOLDER, ignore_errors=True)
    before, started = cpu_seconds(), time.perf_counter()
    cache_builds.ensure_cache(folder, STORED, workers=1)
    return time.perf_counter() - started, cpu_seconds() - before


def our_epoch(folder: Path, stage: str) -> Callable[[], int]:
    """One pass of our training batches over the folder's train split (its cache built), up to ``stage``:
    "reads" (the batch gathered from the cache), "uint8" (and random-resized crops and flips on this CPU) or
    "normalised" (and normalised here too: the same per-image work as torchvision's row, less the decode)."""
    from cifar10_dist.data import augmentation, folder_source, loaders

    loaded = folder_source.load_folder(folder, STORED)
    train = loaders.make_loaders(
        loaded.train, loaded.train, batch_size=BATCH, num_workers=0, train_eval_size=0, seed=0
    ).train
    generator = torch.Generator().manual_seed(0)

    def epoch() -> int:
        count = 0
        for images, _ in train:
            if stage != "reads":
                boxes = augmentation.random_resized_boxes(len(images), STORED, SCALE, generator)
                flips = augmentation.flip_draws(len(images), generator)
                images = augmentation.resized_crops(images, boxes, SIZE, flips)
            if stage == "normalised":
                images = augmentation.normalize(images, loaded.info.mean, loaded.info.std)
            count += len(images)
        return count

    return epoch


PIPELINES = {  # name: what each does per image
    "torchvision": "decode the JPEG, RandomResizedCrop from the whole photo, flip, ToTensor, Normalize",
    "ours_normalised": "read from the cache, random-resized crop of the stored square, flip, normalise",
    "ours_uint8": "read, crop, flip (uint8): the CPU's share when the training device normalises",
    "ours_reads": "read only: the CPU's share when the crops run on the training device",
}


def amortised_ratio(ours: float, build_core_seconds: float, images: int, epochs: int, theirs: float) -> float:
    """Our per-image time with the cache build's CPU seconds spread over ``epochs``, against theirs."""
    seconds_per_image = 1 / ours + build_core_seconds / (images * epochs)
    return (1 / theirs) / seconds_per_image


def photo_arguments(description: str, images: int) -> argparse.ArgumentParser:
    """The options of a benchmark on the photo folder: --work, --archive, --images (default ``images``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--work", required=True, help="a folder for the extracted archive and the photo folder")
    parser.add_argument("--archive", default=str(records.REPO.parent / "shared" / "data" / "cifar10-jpg.tar.xz"))
    parser.add_argument("--images", type=int, default=images)
    return parser


def main() -> None:
    parser = photo_arguments(__doc__.splitlines()[0], 2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_path", default="benchmark_pipeline.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cpu.keep_freed_memory()  # as a training process does (keep_freed_memory): fresh batches fault no pages in
    print(f"{records.machine('cpu')}, torch {torch.__version__}; one thread", flush=True)
    work = Path(args.work)
    folder = photo_folder(extract(Path(args.archive), work), work / f"photos-{args.images}", args.images)
    build_seconds, build_cpu = build_cache(folder)
    images = sum(1 for _ in (folder / "train").rglob("*.jpg"))
    print(
        f"cache of {images} images at {STORED} px: {build_seconds:.1f} s, {build_cpu:.1f} s of CPU (one decoding "
        f"process and this one: {1000 * build_cpu / images:.2f} ms an image)",
        flush=True,
    )
    epochs = {
        "torchvision": torchvision_epoch(folder),
        **{name: our_epoch(folder, name.split("_")[1]) for name in PIPELINES if name != "torchvision"},
    }
    results: dict[str, Any] = {}
    for name, epoch in epochs.items():
        median, speeds = images_per_second(epoch, args.rounds)
        results[name] = {"does": PIPELINES[name], "images_per_second_per_core": median, "rounds": speeds}
        print(
            f"{name:<16} {median:9.1f} images/s on one core  (rounds: {', '.join(f'{v:.1f}' for v in speeds)})",
            flush=True,
        )
    theirs = results["torchvision"]["images_per_second_per_core"]
    ours = results["ours_normalised"]["images_per_second_per_core"]
    ratios = {
        "after_the_cache": ours / theirs,
        **{f"amortised_over_{n}_epochs": amortised_ratio(ours, build_cpu, images, n, theirs) for n in (1, 10)},
    }
    for name, ratio in ratios.items():
        print(f"ours vs torchvision, the same work, {name.replace('_', ' ')}: {ratio:.2f}x")
    records.write(
        Path(args.json_path),
        {
            "torch": str(torch.__version__),
            "images": images,
            "size": SIZE,
            "stored": STORED,
            "scale": SCALE,
            "batch": BATCH,
            "cache_build": {
                "seconds": build_seconds,
                "decoding_processes": 1,
                "cpu_seconds": build_cpu,
                "cpu_ms_per_image": 1000 * build_cpu / images,
            },
            "results": results,
            "ratios": ratios,
            "microseconds_per_image": {
                name: 1e6 / result["images_per_second_per_core"] for name, result in results.items()
            },
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

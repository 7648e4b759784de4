"""The input pipeline end to end, as a user meets it: a near-zero model (global average pool + linear) trained
for 2 epochs on photos at 224 px with random-resized crops (scale 0.08-1) and flips, on this machine's CPU; images
per second of each training epoch (evaluation excluded), both sides in this one invocation.

The photos: --images of the JPEG archive's CIFAR-10 training images upscaled to 500x375, JPEG q90 (made once under
--work; 20 test images per class beside them). torchvision's side: ``ImageFolder`` + PIL transforms
(``RandomResizedCrop(224, scale=(0.08, 1))``, ``RandomHorizontalFlip``, ``ToTensor``, ``Normalize``), a DataLoader of
batch 64 with 2 persistent workers, a plain loop (forward, cross-entropy, backward, SGD step). Ours: ``cifar10-dist
train --dataset=folder --image_size=224 --crop_fraction=0.875 --random_resized_crop=0.08 --batch_size=64`` with the
same model in a fresh process, with its default num_workers (auto: none on a CPU, the crops cut in the training
process) and with 2 workers (which then cut the crops); its cache (each photo decoded once, stored at 256 px)
is built first by ``prepare-data`` in its own timed process, so the epochs read the cache and skip the decode
that torchvision's side does every epoch: the build is reported beside the ratio and spread over 2 and 10 epochs.
With 2 workers, two thread settings, each on both sides: torch's default intra-op threads in the training process
(one per core), and one thread there (OMP_NUM_THREADS=1 for ours, torch.set_num_threads(1) for theirs), which
leaves the cores to the workers when the step is this light: idle intra-op threads spin and take their cores.

    python -m benchmarks.pipeline_training --work=DIR [--archive=../shared/data/cifar10-jpg.tar.xz]
        [--images=6000] [--epochs=2] [--json=PATH]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import records, runner
from benchmarks.pipeline import photo_arguments, photo_folder
from benchmarks.transfer import extract

SIZE, STORED, BATCH, WORKERS, SCALE = 224, 256, 64, 2, 0.08
DEFAULT_THREADS = torch.get_num_threads()
# name: (our num_workers, the training process's intra-op threads on both sides: None for torch's default);
# torchvision's side always has WORKERS workers
SETTINGS = {"defaults": ("auto", None), "two_workers": (WORKERS, None), "two_workers_one_thread": (WORKERS, 1)}
TEST_PER_CLASS = 20

TINY_MODEL = '''"""A near-zero model: what is left of a training step is the input pipeline."""
import torch


def tiny(num_classes: int = 10) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, num_classes))
'''


def test_split(images: Path, target: Path) -> None:
    """TEST_PER_CLASS test images per class, upscaled as the training photos (so our run evaluates on its own)."""
    from PIL import Image

    for source_class in sorted((images / "test").iterdir()):
        folder = target / "test" / source_class.name
        folder.mkdir(parents=True, exist_ok=True)
        for source in sorted(source_class.glob("*.jpg"))[:TEST_PER_CLASS]:
            if not (folder / source.name).exists():
                with Image.open(source) as image:
                    image.convert("RGB").resize((500, 375), Image.BICUBIC).save(folder / source.name, quality=90)


def torchvision_epochs(folder: Path, model_file: Path, epochs: int, threads: int | None) -> list[float]:
    """Images per second of each epoch of the plain loop over torchvision's pipeline (``threads``: the loop's
    intra-op threads; None: torch's default)."""
    from torchvision import datasets, transforms

    torch.set_num_threads(threads or DEFAULT_THREADS)
    namespace: dict[str, Any] = {}
    exec(model_file.read_text(), namespace)
    torch.manual_seed(0)
    model = namespace["tiny"]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pipeline = transforms.Compose(
        [
            transforms.RandomResizedCrop(SIZE, scale=(SCALE, 1.0)),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    loader = torch.utils.data.DataLoader(
        datasets.ImageFolder(str(folder / "train"), pipeline),
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        persistent_workers=True,
        drop_last=True,
    )
    speeds = []
    for _ in range(epochs):
        started, count = time.perf_counter(), 0
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            count += len(images)
        speeds.append(count / (time.perf_counter() - started))
    return speeds


def build_cache(folder: Path) -> float:
    """Wall seconds of ``prepare-data`` building the folder's cache at STORED px in a fresh process (its decoding
    processes: one per core); a cache left by an earlier run is removed first."""
    import shutil

    from cifar10_dist.data import folder_scan

    shutil.rmtree(folder / folder_scan.CACHE_FOLDER, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cifar10_dist",
            "prepare-data",
            "--dataset=folder",
            f"--data_path={folder}",
            f"--image_size={SIZE}",
            "--crop_fraction=0.875",
        ],
        cwd=runner.REPO,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def our_epochs(
    folder: Path, model_file: Path, epochs: int, work: Path, workers: int | str, threads: int | None
) -> list[float]:
    """Images per second of each training epoch of our run (metrics.jsonl), evaluation excluded; ``threads``:
    OMP_NUM_THREADS for its training process (None: the default)."""
    run = runner.train_ours(
        work / "ours",
        environment={"OMP_NUM_THREADS": None if threads is None else str(threads)},
        dataset="folder",
        data_path=str(folder),
        image_size=SIZE,
        crop_fraction=0.875,
        random_resized_crop=SCALE,
        num_workers=workers,
        batch_size=BATCH,
        num_epochs=epochs,
        model=f"{model_file}:tiny",
        train_eval_size=0,
        overwrite=True,
    )
    return [row["images_per_second"] for row in sorted(run.epochs, key=lambda row: row["epoch"])]


def amortised(ours: float, theirs: float, build_seconds: float, images: int, epochs: int) -> float:
    """Our epoch rate with the cache build's wall seconds spread over ``epochs``, against theirs."""
    return (1 / theirs) / (1 / ours + build_seconds / (images * epochs))


def compare(
    setting: str,
    workers: int | str,
    threads: int | None,
    folder: Path,
    model_file: Path,
    work: Path,
    epochs: int,
    build: float,
    images: int,
) -> dict[str, Any]:
    """torchvision's pipeline and ours, epoch by epoch, in one setting (our workers, the step's threads)."""
    theirs = torchvision_epochs(folder, model_file, epochs, threads)
    ours = our_epochs(folder, model_file, epochs, work, workers, threads)
    per_epoch = [mine / their for mine, their in zip(ours, theirs)]
    mean_ours, mean_theirs = statistics.mean(ours), statistics.mean(theirs)
    ratios = {
        "per_epoch": per_epoch,
        "mean_epoch": mean_ours / mean_theirs,
        **{f"build_over_{n}_epochs": amortised(mean_ours, mean_theirs, build, images, n) for n in (epochs, 10)},
    }
    print(
        f"{setting} (our num_workers={workers}, theirs {WORKERS}; {threads or DEFAULT_THREADS} thread(s) for "
        f"the step): torchvision "
        f"{', '.join(f'{v:.0f}' for v in theirs)}, ours {', '.join(f'{v:.0f}' for v in ours)} images/s per "
        f"epoch: {', '.join(f'{r:.2f}x' for r in per_epoch)}; the build spread over {epochs} epochs "
        f"{ratios[f'build_over_{epochs}_epochs']:.2f}x, over 10 {ratios['build_over_10_epochs']:.2f}x",
        flush=True,
    )
    return {
        "our_num_workers": workers,
        "their_num_workers": WORKERS,
        "threads": threads or DEFAULT_THREADS,
        "torchvision_images_per_second": theirs,
        "ours_images_per_second": ours,
        "ratios": ratios,
    }


def main() -> None:
    parser = photo_arguments(__doc__.splitlines()[0], 6000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--json", dest="json_path", default="benchmark_pipeline_training.json")
    args = parser.parse_args()
    print(f"{records.machine('cpu')}, torch {torch.__version__}", flush=True)
    work = Path(args.work)
    extracted = extract(Path(args.archive), work)
    folder = photo_folder(extracted, work / f"photos-{args.images}", args.images)
    test_split(extracted, folder)
    model_file = work / "tiny_model.py"
    model_file.write_text(TINY_MODEL)
    images = sum(1 for _ in (folder / "train").rglob("*.jpg"))
    build = build_cache(folder)
    print(f"our cache of {images} photos at {STORED} px (prepare-data): {build:.1f} s", flush=True)
    results = {
        setting: compare(setting, workers, threads, folder, model_file, work, args.epochs, build, images)
        for setting, (workers, threads) in SETTINGS.items()
    }
    records.write(
        Path(args.json_path),
        {
            "torch": str(torch.__version__),
            "images": images,
            "size": SIZE,
            "stored": STORED,
            "scale": SCALE,
            "batch": BATCH,
            "workers": WORKERS,
            "epochs": args.epochs,
            "model": "global average pool + linear (3 -> 10)",
            "cache_build_seconds": build,
            "settings": results,
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

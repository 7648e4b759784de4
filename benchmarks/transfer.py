"""Transfer: what a pretrained start gains on a small dataset of one's own. airbench (configs/fast.yaml) is
pretrained on five CIFAR-10 classes (airplane, automobile, bird, cat, deer: 25,000 training images, as an image
folder), then trained on the other five (dog, frog, horse, ship, truck) from 100 training images per class, and
tested on all 5,000 of their test images: (a) from scratch, (b) from the pretrained checkpoint, (c) the head alone
for the first quarter of the epochs, then everything; same epochs, batch and seed. One run of each (seeds with
--seeds); about 8 minutes on 2 cores. Last run: docs/fine-tuning.md (CPU named there, JSON in
docs/measurements/transfer_cpu.json).

    python -m benchmarks.transfer --work=DIR [--archive=../shared/data/cifar10-jpg.tar.xz] [--pretrain_epochs=8]
        [--epochs=40] [--per_class=100] [--seeds=1] [--json=PATH] [--quick]

DIR receives the extracted archive and the two folders (symbolic links to its images); nothing of it is kept in
the repository.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import records, runner

SOURCE = ("airplane", "automobile", "bird", "cat", "deer")
TARGET = ("dog", "frog", "horse", "ship", "truck")
QUICK = {"epoch_length": 2, "tta": 0}


def extract(archive: Path, work: Path) -> Path:
    """The archive's train/ and test/ folders of JPEGs under work/images (extracted once)."""
    images = work / "images"
    if not (images / "train").is_dir():
        images.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "xJf", str(archive), "-C", str(images)], check=True)
    return images


def linked_folder(images: Path, target: Path, classes: tuple[str, ...], per_class: int | None) -> Path:
    """An image folder of ``classes``: the first ``per_class`` training images of each (sorted by name; all when
    None) and all their test images, as symbolic links."""
    for split in ("train", "test"):
        for name in classes:
            folder = target / split / name
            folder.mkdir(parents=True, exist_ok=True)
            files = sorted((images / split / name).glob("*.jpg"))
            for file in files[:per_class] if split == "train" and per_class else files:
                link = folder / file.name
                if not link.exists():
                    link.symlink_to(file)
    return target


def run(output: Path, name: str, quick: bool, **overrides: Any) -> runner.OurRun:
    overrides = {**overrides, **(QUICK if quick else {})}
    return runner.train_ours(output, records.REPO / "configs" / "fast.yaml", "cpu", run_name=name, **overrides)


def row(variant: str, finished: runner.OurRun) -> dict[str, Any]:
    test = finished.summary.final["test"]
    return {
        "variant": variant,
        "accuracy": test.accuracy,
        "test_images": test.num_samples,
        "training_seconds": finished.summary.training_time,
        "run_dir": str(finished.run_dir),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="a folder for the extracted images and the two datasets")
    parser.add_argument("--archive", default=str(records.REPO.parent / "shared" / "data" / "cifar10-jpg.tar.xz"))
    parser.add_argument("--pretrain_epochs", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=40, help="epochs of each run on the five new classes")
    parser.add_argument("--per_class", type=int, default=100, help="training images per new class")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--json", dest="json_path", default="benchmark_transfer.json")
    parser.add_argument("--quick", action="store_true", help="a few steps of each run (checks the tool)")
    return parser.parse_args()


def fine_tune(
    output: Path, args: argparse.Namespace, common: dict[str, Any], target: Path, start: Path
) -> list[dict[str, Any]]:
    """Each seed's three runs on the new classes: from scratch, from the checkpoint, head first then thawed."""
    small = {
        **common,
        "data_path": str(target),
        "num_epochs": args.epochs,
        "validate_every": args.epochs,
        "batch_size": min(100, args.per_class * len(TARGET)),
    }
    variants = {
        "from scratch": {},
        "from the checkpoint": {"pretrained": str(start)},
        "head first, then thawed": {"pretrained": str(start), "freeze_epochs": max(1, args.epochs // 4)},
    }
    results: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        for variant, extra in variants.items():
            finished = run(
                output, f"{variant.replace(' ', '-').replace(',', '')}-{seed}", args.quick, **small, **extra, seed=seed
            )
            results.append({**row(variant, finished), "seed": seed})
            print(
                f"seed {seed}  {variant:<26} {finished.accuracy:.4f}  ({finished.summary.training_time:.0f} s)",
                flush=True,
            )
    return results


def main() -> None:
    args = parse_args()
    machine = records.machine("cpu")
    print(f"{machine}, torch {torch.__version__}", flush=True)
    work = Path(args.work)
    images = extract(Path(args.archive), work)
    source = linked_folder(images, work / "source", SOURCE, None)
    target = linked_folder(images, work / "target", TARGET, args.per_class)
    common = {"dataset": "folder", "tta": 0}
    with tempfile.TemporaryDirectory(prefix="benchmark-transfer-") as temporary:
        output = Path(temporary)
        pretrained = run(
            output,
            "pretrain",
            args.quick,
            **common,
            data_path=str(source),
            num_epochs=args.pretrain_epochs,
            validate_every=args.pretrain_epochs,
            seed=0,
        )
        start = sorted(pretrained.run_dir.glob("best_model_*.pt"))[-1]
        print(
            f"pretrained on {', '.join(SOURCE)}: {pretrained.accuracy:.4f} on their test images "
            f"({pretrained.summary.training_time:.0f} s)",
            flush=True,
        )
        results = fine_tune(output, args, common, target, start)
    records.write(
        Path(args.json_path),
        {
            "machine": machine,
            "hardware": records.hardware_record(),
            "commit": records.commit(),
            "torch": str(torch.__version__),
            "source_classes": SOURCE,
            "target_classes": TARGET,
            "per_class": args.per_class,
            "pretrain_epochs": args.pretrain_epochs,
            "epochs": args.epochs,
            "pretrained_accuracy": pretrained.accuracy,
            "runs": results,
            "quick": args.quick,
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

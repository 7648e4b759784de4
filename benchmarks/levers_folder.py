"""The work-cutting levers on your own images: a folder of CIFAR-10's classes upscaled to 64 px (``--per_class``
training and ``--test_per_class`` test images of each class, linked from an ImageFolder copy), the airbench network
with random-resized crops and Muon (configs/fast_muon.yaml's optimiser at batch 500), trained without and with
progressive resizing and data selection, validated every epoch; the training seconds each needed to reach the
lower of the two final accuracies (time to a fixed accuracy), one run each, one after the other.

    python -m benchmarks.levers_folder --folder=DIR [--per_class=500] [--test_per_class=200] [--image_size=64]
        [--epochs=10] [--seed=S] [--json=PATH]

--folder holds train/<class>/*.jpg and test/<class>/*.jpg (tar xJf ../shared/data/cifar10-jpg.tar.xz).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import records, runner

LEVERS = {
    "plain": {},
    "levers": {"resize_start": 0.5, "resize_until": 0.75, "select_hardest_fraction": 0.5, "select_hardest_until": 0.5},
}


def linked_subset(folder: Path, target: Path, per_split: dict[str, int]) -> None:
    """target/<split>/<class>/ holding links to the first N images of each class of folder/<split>/<class>/."""
    for split, count in per_split.items():
        for class_dir in sorted(p for p in (folder / split).iterdir() if p.is_dir()):
            destination = target / split / class_dir.name
            destination.mkdir(parents=True)
            for image in sorted(class_dir.iterdir())[:count]:
                (destination / image.name).symlink_to(image.resolve())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--per_class", type=int, default=500)
    parser.add_argument("--test_per_class", type=int, default=200)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="the runs' seed (default: the config's, 543)")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "data"
        linked_subset(Path(args.folder), data, {"train": args.per_class, "test": args.test_per_class})
        common = {
            "dataset": "folder",
            "data_path": str(data),
            "cache_dir": str(Path(work) / "cache"),
            "image_size": args.image_size,
            "random_resized_crop": 0.35,
            "batch_size": 500,
            "learning_rate": 1.656 * 500 / 2000,
            "num_epochs": args.epochs,
            "validate_every": 1,
            "tta": 0,
            "whitening_bias_epochs": 0.3 * args.epochs,
            "train_eval_size": 0,
            **({} if args.seed is None else {"seed": args.seed}),
        }
        for name, levers in LEVERS.items():
            run = runner.train_ours(
                Path(work) / name, records.REPO / "configs" / "fast_muon.yaml", "cpu", **common, **levers
            )
            runs[name] = {
                "accuracy": run.accuracy,
                "training_seconds": run.summary.training_time,
                "curve": run.curve("test"),
                "overrides": {**common, **levers, "data_path": "SUBSET"},
            }
            print(f"{name}: {run.accuracy:.4f} in {run.summary.training_time:.0f} s", flush=True)
    target = min(run["accuracy"] for run in runs.values())
    for name, run in runs.items():
        run["seconds_to_target"] = runner.time_to(run["curve"], target)
        print(
            f"{name:<8} final {100 * run['accuracy']:.2f}%, {run['training_seconds']:.0f} s of training, "
            f"{run['seconds_to_target']:.0f} s to {100 * target:.2f}%"
        )
    if args.json_path:
        records.write(
            args.json_path,
            {
                "hardware": records.hardware_record("cpu"),
                "target": target,
                "runs": runs,
                "per_class": args.per_class,
                "test_per_class": args.test_per_class,
                "image_size": args.image_size,
                "epochs": args.epochs,
                "seed": args.seed,
            },
        )


if __name__ == "__main__":
    main()

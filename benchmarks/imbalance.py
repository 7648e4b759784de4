"""Imbalanced classes: what class_weights=auto and sampler=balanced change on a long-tailed CIFAR-10.

The training set is the archive's CIFAR-10 cut to a long tail as in the CIFAR-10-LT protocol (Cui et al., 2019):
class c keeps 5000 x ratio^(-c/9) images (ratio 50: 5,000 airplanes down to 100 trucks, 14,197 in all); the test
set is all 10,000 test images, balanced. airbench (configs/fast.yaml) trains the same epochs with the same seed
(a) as it is, (b) with class_weights=auto, (c) with sampler=balanced; each is scored by accuracy, balanced accuracy
and macro-F1 on the test set, and by the recall of the three rarest classes. About 12 minutes on 2 cores. Last run:
docs/your-data.md (CPU named there, JSON in docs/measurements/imbalance_cpu.json).

    python -m benchmarks.imbalance --work=DIR [--archive=../shared/data/cifar10-jpg.tar.xz] [--ratio=50]
        [--epochs=10] [--seed=0] [--json=PATH] [--quick]

DIR receives the extracted archive and the long-tailed folder (symbolic links to its images); nothing of it is
kept in the repository.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import records, runner
from benchmarks.transfer import extract
from cifar10_dist.data.cifar import CLASSES

VARIANTS = {
    "as it is": {},
    "class_weights=auto": {"class_weights": "auto"},
    "sampler=balanced": {"sampler": "balanced"},
}


def long_tail_counts(ratio: float, largest: int = 5000) -> dict[str, int]:
    """Training images per class: largest x ratio^(-c/9) for the c-th class."""
    return {name: int(largest * ratio ** (-index / (len(CLASSES) - 1))) for index, name in enumerate(CLASSES)}


def long_tailed_folder(images: Path, target: Path, counts: dict[str, int]) -> Path:
    """An image folder: the first counts[class] training images of each class (sorted by name) and all the test
    images, as symbolic links."""
    for split in ("train", "test"):
        for name in CLASSES:
            folder = target / split / name
            folder.mkdir(parents=True, exist_ok=True)
            files = sorted((images / split / name).glob("*.jpg"))
            for file in files[: counts[name]] if split == "train" else files:
                link = folder / file.name
                if not link.exists():
                    link.symlink_to(file)
    return target


def scores(run_dir: Path, rarest: list[str]) -> dict[str, Any]:
    """The final test evaluation's accuracy, balanced accuracy and macro-F1 (metrics.jsonl), and the recall of the
    rarest classes from an evaluate of the final checkpoint."""
    from cifar10_dist import api

    final = json.loads((run_dir / "metrics.json").read_text())["test"]
    checkpoint = sorted(run_dir.glob("training_checkpoint_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))[-1]
    evaluated = api.evaluate(str(checkpoint), output_dir=run_dir / "evaluation")
    recall = dict(zip(evaluated.classes, evaluated.per_class_accuracy))
    return {
        "accuracy": final["accuracy"],
        "balanced_accuracy": final["balanced_accuracy"],
        "macro_f1": final["macro_f1"],
        "rarest_recall": {name: recall[name] for name in rarest},
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="a folder for the extracted images and the long-tailed folder")
    parser.add_argument("--archive", default=str(records.REPO.parent / "shared" / "data" / "cifar10-jpg.tar.xz"))
    parser.add_argument("--ratio", type=float, default=50.0, help="images of the largest class / of the smallest")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", default="benchmark_imbalance.json")
    parser.add_argument("--quick", action="store_true", help="a few steps of each run (checks the tool)")
    return parser.parse_args()


def train_variants(common: dict[str, Any], rarest: list[str]) -> list[dict[str, Any]]:
    """fast.yaml on the long-tailed folder with each remedy (VARIANTS), one line each as it ends."""
    results = []
    print(f"{'variant':<20} {'accuracy':>8} {'balanced':>8} {'macro-F1':>8}  recall of {', '.join(rarest)}  seconds")
    with tempfile.TemporaryDirectory(prefix="benchmark-imbalance-") as temporary:
        for variant, extra in VARIANTS.items():
            name = variant.replace("=", "-").replace(" ", "-")
            finished = runner.train_ours(
                Path(temporary), records.REPO / "configs" / "fast.yaml", "cpu", run_name=name, **common, **extra
            )
            row = {
                "variant": variant,
                **scores(finished.run_dir, rarest),
                "training_seconds": finished.summary.training_time,
            }
            results.append(row)
            recalls = ", ".join(f"{value:.3f}" for value in row["rarest_recall"].values())
            print(
                f"{variant:<20} {row['accuracy']:8.4f} {row['balanced_accuracy']:8.4f} {row['macro_f1']:8.4f}  "
                f"{recalls}  {row['training_seconds']:.0f}",
                flush=True,
            )
    return results


def main() -> None:
    args = parse_args()
    machine = records.machine("cpu")
    print(f"{machine}, torch {torch.__version__}", flush=True)
    work = Path(args.work)
    counts = long_tail_counts(args.ratio)
    folder = long_tailed_folder(extract(Path(args.archive), work), work / f"long-tail-{args.ratio:g}", counts)
    rarest = list(CLASSES[-3:])
    print("training images: " + ", ".join(f"{name} {count}" for name, count in counts.items()), flush=True)
    common = {
        "dataset": "folder",
        "data_path": str(folder),
        "num_epochs": args.epochs,
        "validate_every": args.epochs,
        "tta": 0,
        "seed": args.seed,
        **({"epoch_length": 2} if args.quick else {}),
    }
    results = train_variants(common, rarest)
    records.write(
        Path(args.json_path),
        {
            "machine": machine,
            "hardware": records.hardware_record(),
            "commit": records.commit(),
            "torch": str(torch.__version__),
            "ratio": args.ratio,
            "training_images": counts,
            "epochs": args.epochs,
            "seed": args.seed,
            "config": "configs/fast.yaml",
            "runs": results,
            "quick": args.quick,
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

"""lr-find against the recipes' own learning rates: what the sweep suggests, and a short run at each.

(a) CIFAR-10 with configs/default.yaml (ResNet-18, batch 512, learning_rate 0.4): the sweep, then --epochs
epochs at the suggestion and at 0.4. (b) An image folder with a pretrained start: ResNet-18 trained on five
CIFAR-10 classes (airplane ... deer, --pretrain_epochs epochs), fine-tuned on the other five from 100 images per
class with the fine-tuning recipe of docs/fine-tuning.md (freeze_epochs=2, backbone_lr_scale=0.1, 10 epochs,
batch 100); the sweep with the same flags, then a run at the suggestion and at the recipe's 0.4. One seed.

    python -m benchmarks.lr_find --cifar=DIR --work=DIR [--epochs=2] [--pretrain_epochs=3] [--json=PATH]

--cifar holds cifar-10-batches-py (python ../shared/tools/make_cifar10.py DIR); --work receives the extracted
archive and the two folders (as benchmarks.transfer makes them). Docs: docs/before-you-train.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import records, runner, transfer
from cifar10_dist import api

RECIPE = records.REPO / "configs" / "default.yaml"
FINE_TUNING = {
    "freeze_epochs": 2,
    "backbone_lr_scale": 0.1,
    "num_epochs": 10,
    "batch_size": 100,
    "tta": 0,
    "validate_every": 10,
}


def sweep(output: Path, name: str, **overrides: Any) -> dict[str, Any]:
    started = time.perf_counter()
    found = api.lr_find(str(RECIPE), output_dir=output / name, output_path=str(output), **overrides)
    seconds = time.perf_counter() - started
    print(
        f"{name}: suggested {found.suggestion:.4g} ({found.rule}; other: {found.candidates}), "
        f"{len(found.losses)} iterations, {found.stopped}, {seconds:.0f} s",
        flush=True,
    )
    return {
        "suggestion": found.suggestion,
        "rule": found.rule,
        "candidates": found.candidates,
        "iterations": len(found.losses),
        "stopped": found.stopped,
        "seconds": seconds,
        "learning_rates": found.learning_rates,
        "losses": found.losses,
    }


def short_run(output: Path, name: str, learning_rate: float, **overrides: Any) -> dict[str, Any]:
    finished = runner.train_ours(output, RECIPE, "cpu", run_name=name, learning_rate=learning_rate, **overrides)
    print(
        f"{name}: learning_rate {learning_rate:.4g}: test accuracy {finished.accuracy:.4f} "
        f"({finished.summary.training_time:.0f} s)",
        flush=True,
    )
    return {
        "learning_rate": learning_rate,
        "accuracy": finished.accuracy,
        "test_images": finished.summary.final["test"].num_samples,
        "training_seconds": finished.summary.training_time,
        "epochs": finished.summary.epochs,
    }


def cifar(output: Path, data: Path, epochs: int) -> dict[str, Any]:
    found = sweep(output, "cifar-sweep", data_path=str(data))
    short = {"num_epochs": epochs, "validate_every": epochs, "data_path": str(data)}
    return {
        "config": "configs/default.yaml",
        "recipe_learning_rate": 0.4,
        "sweep": found,
        "epochs": epochs,
        "runs": [
            short_run(output, "cifar-suggested", found["suggestion"], **short),
            short_run(output, "cifar-recipe", 0.4, **short),
        ],
    }


def folder(output: Path, work: Path, pretrain_epochs: int) -> dict[str, Any]:
    images = transfer.extract(records.REPO.parent / "shared" / "data" / "cifar10-jpg.tar.xz", work)
    source = transfer.linked_folder(images, work / "source", transfer.SOURCE, None)
    target = transfer.linked_folder(images, work / "target", transfer.TARGET, 100)
    pretrained = runner.train_ours(
        output,
        RECIPE,
        "cpu",
        run_name="pretrain",
        dataset="folder",
        data_path=str(source),
        num_epochs=pretrain_epochs,
        validate_every=pretrain_epochs,
    )
    start = str(sorted(pretrained.run_dir.glob("best_model_*.pt"))[-1])
    print(f"pretrained on {', '.join(transfer.SOURCE)}: {pretrained.accuracy:.4f}", flush=True)
    tuned = {"dataset": "folder", "data_path": str(target), "pretrained": start, **FINE_TUNING}
    found = sweep(output, "folder-sweep", **tuned)
    return {
        "recipe": "configs/default.yaml + " + ", ".join(f"{k}={v}" for k, v in FINE_TUNING.items()),
        "recipe_learning_rate": 0.4,
        "pretrain_epochs": pretrain_epochs,
        "pretrained_accuracy": pretrained.accuracy,
        "sweep": found,
        "runs": [
            short_run(output, "folder-suggested", found["suggestion"], **tuned),
            short_run(output, "folder-recipe", 0.4, **tuned),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar", required=True, help="folder holding cifar-10-batches-py")
    parser.add_argument("--work", required=True, help="a folder for the extracted images and the two folders")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each short CIFAR-10 run")
    parser.add_argument("--pretrain_epochs", type=int, default=3)
    parser.add_argument("--json", dest="json_path", default="docs/measurements/lr_find_cpu.json")
    args = parser.parse_args()
    machine = records.machine("cpu")
    print(f"{machine}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="benchmark-lr-find-") as temporary:
        output = Path(temporary)
        result = {
            "cifar10": cifar(output, Path(args.cifar), args.epochs),
            "folder": folder(output, Path(args.work), args.pretrain_epochs),
        }
    records.write(
        Path(args.json_path),
        {"machine": machine, "hardware": records.hardware_record(), "torch": str(torch.__version__), **result},
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

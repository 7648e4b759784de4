"""Temperature scaling measured: the test ECE and NLL of a recipe's model before and after ``calibrate=temperature``
(T fitted on a 10% validation split), for configs/fast.yaml (label smoothing 0.2) and configs/default.yaml.

    python -m benchmarks.calibration --cifar=DIR [--recipes=fast,default] [--json=PATH]

One run per recipe with --val_split=0.1 --calibrate=temperature; "before" is the same best-model file evaluated
without its temperature (the weights are the same: calibration comes after training), "after" the run's own
final test evaluation. Docs: docs/ship-it.md.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import records, runner
from cifar10_dist import api
from cifar10_dist.outputs import checkpoint_files

RECIPES = {"fast": "configs/fast.yaml", "default": "configs/default.yaml"}


def without_temperature(best: Path, folder: Path) -> Path:
    """A copy of the best-model file without its temperature: the model as it was before calibration."""
    checkpoint = checkpoint_files.load_checkpoint(best)
    checkpoint.pop("temperature")
    copy = folder / f"uncalibrated_{best.name}"
    torch.save(checkpoint, copy)
    return copy


def measure(output: Path, name: str, config: str, cifar: str) -> dict[str, Any]:
    finished = runner.train_ours(
        output, records.REPO / config, "cpu", run_name=name, data_path=cifar, val_split=0.1, calibrate="temperature"
    )
    best = sorted(finished.run_dir.glob("best_model_*.pt"))[-1]
    before = api.evaluate(without_temperature(best, output), data_path=cifar)
    after = finished.summary.final["test"]
    found = finished.summary.calibration
    row = {
        "config": config,
        "temperature": found["temperature"],
        "val": found,
        "test_before": {"accuracy": before.accuracy, "nll": before.loss, "ece": before.ece},
        "test_after": {"accuracy": after.accuracy, "nll": after.loss, "ece": after.ece},
        "training_seconds": finished.summary.training_time,
    }
    print(
        f"{name}: T {found['temperature']:.3f}; test ECE {before.ece:.4f} -> {after.ece:.4f}, NLL "
        f"{before.loss:.4f} -> {after.loss:.4f}, accuracy {before.accuracy:.4f} / {after.accuracy:.4f}",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar", required=True, help="folder holding cifar-10-batches-py")
    parser.add_argument("--recipes", default="fast,default")
    parser.add_argument("--json", dest="json_path", default="docs/measurements/calibration_cpu.json")
    args = parser.parse_args()
    machine = records.machine("cpu")
    print(f"{machine}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="benchmark-calibration-") as temporary:
        runs = {name: measure(Path(temporary), name, RECIPES[name], args.cifar) for name in args.recipes.split(",")}
    records.write(
        Path(args.json_path),
        {"machine": machine, "hardware": records.hardware_record(), "torch": str(torch.__version__), "runs": runs},
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

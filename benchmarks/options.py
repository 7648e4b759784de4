"""Options: what each recipe option family does to accuracy and speed in one setting: `cifar10-dist run`'s
defaults (ResNet-18, batch 512, SGD, linear schedule, gradient clipped at 1.0) for --num_epochs epochs on real
CIFAR-10, then the same with one family changed at a time (AdamW, cosine, step, TrivialAugment + RandomErasing,
MixUp/CutMix, no clipping), then configs/modern.yaml. One seed, one run each; 5 epochs take about 5 minutes a
run on 2 cores (40 minutes in all).
Last run: docs/recipes.md, "Recipe options" (CPU named there, JSON in docs/measurements/options_cpu.json).

    python -m benchmarks.options --data_path=DIR [--num_epochs=5] [--only=default,adamw,...] [--json=PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import records, runner

# entry: (config file or None, overrides); each changes one family of the defaults
ENTRIES: dict[str, tuple[str | None, dict[str, Any]]] = {
    "default": (None, {}),
    "adamw": (None, {"optimizer": "adamw", "learning_rate": 0.003, "weight_decay": 0.05, "norm_weight_decay": 0.0}),
    "cosine": (None, {"lr_schedule": "cosine"}),
    "step": (None, {"lr_schedule": "step", "lr_milestones": "3,4", "lr_gamma": 0.2}),
    "trivialaugment": (None, {"auto_augment": "trivialaugment", "random_erasing": 0.1}),
    "mixup_cutmix": (None, {"mixup_alpha": 0.2, "cutmix_alpha": 1.0}),
    "no_clip": (None, {"clip_grad_norm": None}),  # the defaults clip at 1.0 since 2026-11-27 (before: entry "clip")
    "modern": ("modern.yaml", {}),
}


def run_entry(name: str, data_path: str, num_epochs: int) -> dict[str, Any]:
    config, overrides = ENTRIES[name]
    with tempfile.TemporaryDirectory() as output:
        run = runner.train_ours(
            Path(output),
            records.REPO / "configs" / config if config else None,
            "cpu",
            **{**overrides, "data_path": data_path, "num_epochs": num_epochs, "download": False},
        )
    seconds = [row["epoch_time"] for row in sorted(run.epochs, key=lambda row: row["epoch"])]
    return {
        "entry": name,
        "overrides": overrides,
        "config": config,
        "accuracy": run.accuracy,
        "epoch_seconds": seconds,
        "mean_epoch_seconds": sum(seconds) / len(seconds),
        "precision": run.summary.precision,
        "wall_seconds": run.wall_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--num_epochs", type=int, default=5)
    parser.add_argument("--only", default=",".join(ENTRIES))
    parser.add_argument("--json", dest="json_path", default="benchmark_options.json")
    args = parser.parse_args()
    chosen = [name for name in args.only.split(",") if name]
    if any(name not in ENTRIES for name in chosen):
        parser.error(f"--only={args.only}: entries are {', '.join(ENTRIES)}")
    print(f"{records.machine('cpu')}, torch {torch.__version__}, {args.num_epochs} epochs each", flush=True)
    runs = []
    for name in chosen:
        runs.append(run_entry(name, args.data_path, args.num_epochs))
        print(
            f"{name:<16}accuracy {100 * runs[-1]['accuracy']:6.2f}%  {runs[-1]['mean_epoch_seconds']:6.1f} s/epoch",
            flush=True,
        )
        records.write(
            args.json_path,
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "num_epochs": args.num_epochs,
                "commit": records.commit(),
                "hardware": records.hardware_record(),
                "torch": torch.__version__,
                "runs": runs,
            },
        )


if __name__ == "__main__":
    main()

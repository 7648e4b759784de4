"""The real output of the before-you-train tools, recorded for docs/before-you-train.md: lr-find, batch-size
and a profiled run, on CIFAR-10 with configs/default.yaml and on an image folder with a pretrained start.

    python -m benchmarks.tool_outputs --cifar=DIR --folder=DIR --pretrained=FILE --work=DIR [--json=PATH]

--cifar holds cifar-10-batches-py; --folder is an image folder (benchmarks.lr_find's target: five CIFAR-10
classes, 100 training images each); --pretrained a best-model file to start from on it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks import records

RECIPE = "configs/default.yaml"
FINE_TUNING = ["--freeze_epochs=2", "--backbone_lr_scale=0.1", "--num_epochs=10", "--batch_size=100"]


def commands(cifar: str, folder: str, pretrained: str, work: Path) -> dict[str, list[str]]:
    on_folder = [f"--config={RECIPE}", "--dataset=folder", f"--data_path={folder}"]
    return {
        "lr-find, CIFAR-10": [
            "lr-find",
            f"--config={RECIPE}",
            f"--data_path={cifar}",
            f"--output_dir={work / 'lr-cifar'}",
        ],
        "batch-size, CIFAR-10": ["batch-size", f"--config={RECIPE}"],
        "profile, CIFAR-10": [
            "run",
            f"--config={RECIPE}",
            f"--data_path={cifar}",
            "--num_epochs=2",
            "--epoch_length=40",
            "--validate_every=2",
            "--train_eval_size=1000",
            "--profile=10",
            f"--output_path={work}",
            "--run_name=profiled-cifar",
        ],
        "lr-find, folder, pretrained": [
            "lr-find",
            *on_folder,
            f"--pretrained={pretrained}",
            *FINE_TUNING,
            f"--output_dir={work / 'lr-folder'}",
        ],
        "batch-size, folder at 64 px": ["batch-size", *on_folder, "--image_size=64"],
        "profile, folder": [
            "run",
            *on_folder,
            f"--pretrained={pretrained}",
            "--learning_rate=0.0288",
            *FINE_TUNING,
            "--num_epochs=3",
            "--freeze_epochs=1",
            "--profile=5",
            f"--output_path={work}",
            "--run_name=profiled-folder",
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar", required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--pretrained", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--json", dest="json_path", default="docs/measurements/before_you_train_cpu.json")
    args = parser.parse_args()
    machine = records.machine("cpu")
    print(f"{machine}, torch {torch.__version__}", flush=True)
    outputs = []
    for name, arguments in commands(args.cifar, args.folder, args.pretrained, Path(args.work)).items():
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "cifar10_dist", *arguments], cwd=records.REPO, capture_output=True, text=True
        )
        seconds = time.perf_counter() - started
        print(f"== {name} (exit {done.returncode}, {seconds:.0f} s)\n{done.stdout}", flush=True)
        outputs.append(
            {
                "name": name,
                "command": "cifar10-dist " + " ".join(arguments),
                "exit": done.returncode,
                "seconds": seconds,
                "stdout": done.stdout,
                "log": done.stderr,
            }
        )
    records.write(
        Path(args.json_path),
        {
            "machine": machine,
            "hardware": records.hardware_record(),
            "torch": str(torch.__version__),
            "outputs": outputs,
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

"""The Ignite CIFAR-10 tutorial's own script next to ``cifar10-dist run`` (whose defaults are the tutorial's:
ResNet-18, 5 epochs, batch 512), one after the other on the same data and machine: final test accuracy, wall
seconds, seconds of the epochs that only trained, and the ratios ours / tutorial from the same invocation. Last run:
2 cores, CPU not recorded (docs/measurements/tutorial_cpu.json): 69.74% in 382 s against the tutorial's 66.71% in
542 s (0.70x the wall time, 0.79x per training epoch); one run of each, about 16 minutes in all.

    python -m benchmarks.tutorial --data_path=DIR --tutorial=PATH [--only=tutorial,ours] [--json=PATH]
        [--num_epochs=5]

  tutorial  the tutorial's script as published (pytorch-ignite/examples, tutorials/intermediate/
            cifar10-distributed.py; give your copy with --tutorial, it is not shipped here), run in a process of its
            own through its own run() with one process. One change at run time, none to its code: torchvision's
            CIFAR10 md5 check is skipped (files and meta), because this machine's copy of the data is re-encoded.
  ours      ``cifar10-dist run --data_path=DATA`` with all defaults (benchmarks.runner)
Both run as shipped: ours with its default speed settings (keep_freed_memory on a CPU), the tutorial with none.
The tutorial evaluates the whole training set and the test set after epochs 3 and 5; ours a 5,000-image training
subset and the test set after the last epoch.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import records, runner

TUTORIAL_DRIVER = """
import runpy, sys
import torchvision.datasets.cifar
torchvision.datasets.cifar.check_integrity = lambda *args, **kwargs: True  # re-encoded copy: no md5 matches
tutorial = runpy.run_path(sys.argv[1], run_name="tutorial")  # its definitions; its __main__ block does not run
tutorial["config"].update(data_path=sys.argv[2], output_path=sys.argv[3], num_epochs=int(sys.argv[4]))
tutorial["run"]()
"""


def hms_seconds(text: str) -> int:
    hours, minutes, seconds = (int(part) for part in text.split(":"))
    return 3600 * hours + 60 * minutes + seconds


def run_tutorial(tutorial: str, data_path: str, output: Path, num_epochs: int) -> dict[str, Any]:
    """The tutorial's run() in its own process; its log gives the epoch times and the last test accuracy."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", TUTORIAL_DRIVER, tutorial, data_path, str(output), str(num_epochs)],
                            capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"the tutorial failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    log = result.stderr + result.stdout
    epochs = {int(n): hms_seconds(t) for n, t in re.findall(r"Epoch\[(\d+)\] Complete\. Time taken: ([\d:]+)", log)}
    validated = {int(n) for n in re.findall(r"Epoch (\d+) - Evaluation time", log)}
    accuracy = float(re.findall(r"val metrics:\s*\n\s*Accuracy: ([0-9.]+)", log)[-1])
    return {"entry": "tutorial", "accuracy": accuracy, "wall_seconds": wall, "epoch_seconds": epochs,
            "training_only_epochs": sorted(set(epochs) - validated)}


def run_ours(data_path: str, output: Path, num_epochs: int) -> dict[str, Any]:
    """``cifar10-dist run`` with its defaults (benchmarks.runner); summary.json and metrics.jsonl give accuracy
    and each epoch's training time."""
    run = runner.train_ours(output, run_name="ours", data_path=data_path, num_epochs=num_epochs)
    epochs = {row["epoch"]: row["epoch_time"] for row in run.epochs}
    return {"entry": "ours", "accuracy": run.accuracy, "wall_seconds": run.wall_seconds, "epoch_seconds": epochs,
            "training_only_epochs": sorted(epochs)}


def training_only_mean(run: dict[str, Any]) -> float:
    """Mean seconds of the epochs that trained without evaluating."""
    only = [run["epoch_seconds"][epoch] for epoch in run["training_only_epochs"]]
    return sum(only) / len(only)


def table(runs: list[dict[str, Any]]) -> str:
    lines = [f"{'entry':<9} {'accuracy':>9} {'wall s':>8} {'train-only epoch s (mean)':>26}"]
    for run in runs:
        lines.append(f"{run['entry']:<9} {100 * run['accuracy']:8.2f}% {run['wall_seconds']:8.1f} "
                     f"{training_only_mean(run):26.1f}")
    by_entry = {run["entry"]: run for run in runs}
    if {"ours", "tutorial"} <= set(by_entry):
        ours, tutorial = by_entry["ours"], by_entry["tutorial"]
        lines.append(f"ours / tutorial: wall {ours['wall_seconds'] / tutorial['wall_seconds']:.3f}, training-only "
                     f"epoch {training_only_mean(ours) / training_only_mean(tutorial):.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--tutorial", help="path of the tutorial's cifar10-distributed.py")
    parser.add_argument("--only", default="tutorial,ours")
    parser.add_argument("--num_epochs", type=int, default=5)
    parser.add_argument("--json", dest="json_path", default="benchmark_tutorial.json")
    args = parser.parse_args()
    entries = args.only.split(",")
    if not set(entries) <= {"tutorial", "ours"}:
        sys.exit(f"error: --only={args.only!r}: entries are tutorial and ours")
    if "tutorial" in entries and not (args.tutorial and Path(args.tutorial).is_file()):
        sys.exit(f"error: --tutorial={args.tutorial!r} is not a file: give the tutorial's cifar10-distributed.py")
    runs = []
    with tempfile.TemporaryDirectory(prefix="benchmark-tutorial-") as folder:
        for entry in entries:
            output = Path(folder) / entry
            if entry == "tutorial":
                runs.append(run_tutorial(args.tutorial, args.data_path, output, args.num_epochs))
            else:
                runs.append(run_ours(args.data_path, output, args.num_epochs))
            runs[-1]["training_only_epoch_mean"] = training_only_mean(runs[-1])
            print(f"{entry}: {100 * runs[-1]['accuracy']:.2f}% in {runs[-1]['wall_seconds']:.0f} s", flush=True)
    print(table(runs))
    records.write(args.json_path, {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "num_epochs": args.num_epochs,
                                   "hardware": records.hardware_record(), "commit": records.commit(), "runs": runs})


if __name__ == "__main__":
    main()

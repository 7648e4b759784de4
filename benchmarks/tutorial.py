"""The Ignite CIFAR-10 tutorial's own script next to ``cifar10-dist run`` (ResNet-18, 5 epochs, batch 512, lr 0.4),
one after the other on the same data and machine, over several seeds: final test accuracy (mean, spread, lowest),
the largest training loss of the first epoch (the recipe's start-up spike), wall seconds, seconds of the epochs that
only trained, and the ratios ours / tutorial from the same invocation. Last run: see docs/recipes.md ("Against the
tutorial's own script") and docs/measurements/tutorial_seeds_*.json (AMD EPYC Zen 5, AVX512-BF16, 3 seeds of 4
entries, about 75 minutes).

    python -m benchmarks.tutorial --data_path=DIR --tutorial=PATH [--only=tutorial,ours,...] [--seeds=3]
        [--first_seed=543] [--num_epochs=5] [--json=PATH]

  tutorial                the tutorial's script as published (pytorch-ignite/examples, tutorials/intermediate/
                          cifar10-distributed.py; give your copy with --tutorial, it is not shipped here), run in a
                          process of its own through its own run() with one process, its config's seed set. Changes
                          at run time, none to its code: torchvision's CIFAR10 md5 check is skipped (this machine's
                          copy is re-encoded), and its trainer also records each first-epoch batch loss.
  ours                    ``cifar10-dist run --data_path=DATA --seed=S`` with all defaults (benchmarks.runner)
  ours_contiguous         the defaults with channels_last=False (what the layout changes in the clipped recipe)
  ours_no_clip            the defaults before clip_grad_norm=1.0 became one: the tutorial's recipe exactly
  ours_no_clip_contiguous the same with channels_last=False (what the layout alone changes)
Ours log the training loss every iteration (log_every_iters=1: logging only, the same training) so that the
first epoch's largest loss is seen. The tutorial evaluates the whole training set and the test set after epochs 3 and
5; ours a 5,000-image training subset and the test set after the last epoch. Each run is appended to the JSON file
the moment it ends.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import records, runner

OURS = {
    "ours": {},
    "ours_contiguous": {"channels_last": False},
    "ours_no_clip": {"clip_grad_norm": None},
    "ours_no_clip_contiguous": {"clip_grad_norm": None, "channels_last": False},
}

TUTORIAL_DRIVER = """
import json, runpy, sys
import torchvision.datasets.cifar
from ignite.engine import Events
torchvision.datasets.cifar.check_integrity = lambda *args, **kwargs: True  # re-encoded copy: no md5 matches
tutorial = runpy.run_path(sys.argv[1], run_name="tutorial")  # its definitions; its __main__ block does not run
tutorial["config"].update(data_path=sys.argv[2], output_path=sys.argv[3], num_epochs=int(sys.argv[4]),
                          seed=int(sys.argv[5]))
its_globals, create = tutorial["run"].__globals__, tutorial["create_supervised_trainer"]

def create_and_record(*args, **kwargs):
    trainer, losses = create(*args, **kwargs), []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(e.state.output["batch loss"]))
    trainer.add_event_handler(Events.EPOCH_COMPLETED(once=1), lambda e: print("FIRST_EPOCH_LOSSES", json.dumps(losses)))
    return trainer

its_globals["create_supervised_trainer"] = create_and_record
tutorial["run"]()
"""


def hms_seconds(text: str) -> int:
    hours, minutes, seconds = (int(part) for part in text.split(":"))
    return 3600 * hours + 60 * minutes + seconds


def run_tutorial(tutorial: str, data_path: str, output: Path, num_epochs: int, seed: int) -> dict[str, Any]:
    """The tutorial's run() in its own process; its log gives the epoch times, the last test accuracy and (through
    the driver) the first epoch's batch losses."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", TUTORIAL_DRIVER, tutorial, data_path, str(output), str(num_epochs), str(seed)],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"the tutorial failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    log = result.stderr + result.stdout
    epochs = {n: hms_seconds(t) for n, t in re.findall(r"Epoch\[(\d+)\] Complete\. Time taken: ([\d:]+)", log)}
    validated = {n for n in re.findall(r"Epoch (\d+) - Evaluation time", log)}
    accuracy = float(re.findall(r"val metrics:\s*\n\s*Accuracy: ([0-9.]+)", log)[-1])
    losses = json.loads(re.findall(r"FIRST_EPOCH_LOSSES (\[.*\])", log)[-1])
    return {
        "entry": "tutorial",
        "seed": seed,
        "accuracy": accuracy,
        "wall_seconds": wall,
        "epoch_seconds": epochs,
        "training_only_epochs": sorted(set(epochs) - validated, key=int),
        **spike(losses),
    }


def run_ours(entry: str, data_path: str, output: Path, num_epochs: int, seed: int) -> dict[str, Any]:
    """``cifar10-dist run`` with its defaults and the entry's overrides (benchmarks.runner); summary.json and
    metrics.jsonl give accuracy and each epoch's training time, TensorBoard the batch losses."""
    run = runner.train_ours(
        output, run_name=entry, data_path=data_path, num_epochs=num_epochs, seed=seed, log_every_iters=1, **OURS[entry]
    )
    epochs = {str(row["epoch"]): row["epoch_time"] for row in run.epochs}
    losses = scalars(run.run_dir, "training/batch_loss")[: run.epochs[0]["iteration"]]
    norms = scalars(run.run_dir, "training/grad_norm")  # logged with clip_grad_norm: pre-clip, every iteration
    clipped = (
        {"grad_norm_median": statistics.median(norms), "clipped_share": sum(n > 1.0 for n in norms) / len(norms)}
        if norms
        else {}
    )
    return {
        "entry": entry,
        "seed": seed,
        "accuracy": run.accuracy,
        "wall_seconds": run.wall_seconds,
        "epoch_seconds": epochs,
        "training_only_epochs": sorted(epochs, key=int),
        **spike(losses),
        **clipped,
    }


def scalars(run_dir: Path, tag: str) -> list[float]:
    """A scalar's values in step order from the run's TensorBoard events (none when it was not logged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return []
    return [event.value for event in sorted(events.Scalars(tag), key=lambda event: event.step)]


def spike(losses: list[float]) -> dict[str, Any]:
    """The first epoch's largest batch loss, where it came, and the loss it started from."""
    worst = max(range(len(losses)), key=losses.__getitem__)
    return {"first_epoch_max_loss": losses[worst], "first_epoch_max_loss_iteration": worst + 1, "first_loss": losses[0]}


def training_only_mean(run: dict[str, Any]) -> float:
    """Mean seconds of the epochs that trained without evaluating."""
    only = [run["epoch_seconds"][epoch] for epoch in run["training_only_epochs"]]
    return sum(only) / len(only)


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per entry: seeds, mean, sample standard deviation and lowest test accuracy, the largest first-epoch loss, the
    mean wall seconds and training-only epoch seconds."""
    entries: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        entries.setdefault(run["entry"], []).append(run)
    summary = {}
    for entry, group in entries.items():
        accuracies = [run["accuracy"] for run in group]
        summary[entry] = {
            "seeds": len(group),
            "mean": statistics.fmean(accuracies),
            "std": statistics.stdev(accuracies) if len(group) > 1 else 0.0,
            "min": min(accuracies),
            "max_first_epoch_loss": max(run["first_epoch_max_loss"] for run in group),
            "wall_seconds": statistics.fmean(run["wall_seconds"] for run in group),
            "training_only_epoch": statistics.fmean(training_only_mean(run) for run in group),
        }
    return summary


def table(summary: dict[str, dict[str, float]]) -> str:
    lines = [
        f"{'entry':<24} {'seeds':>5} {'mean':>7} {'std':>6} {'lowest':>7} {'max loss ep.1':>13} {'wall s':>7} "
        f"{'train-only epoch s':>18}"
    ]
    for entry, row in summary.items():
        lines.append(
            f"{entry:<24} {row['seeds']:>5} {100 * row['mean']:6.2f}% {100 * row['std']:5.2f} "
            f"{100 * row['min']:6.2f}% {row['max_first_epoch_loss']:13.2f} {row['wall_seconds']:7.1f} "
            f"{row['training_only_epoch']:18.1f}"
        )
    if {"ours", "tutorial"} <= set(summary):
        ours, tutorial = summary["ours"], summary["tutorial"]
        lines.append(
            f"ours / tutorial: wall {ours['wall_seconds'] / tutorial['wall_seconds']:.3f}, training-only "
            f"epoch {ours['training_only_epoch'] / tutorial['training_only_epoch']:.3f}; mean accuracy "
            f"{100 * (ours['mean'] - tutorial['mean']):+.2f} points; ours' lowest seed "
            f"{100 * (ours['min'] - tutorial['mean']):+.2f} points from the tutorial's mean"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--tutorial", help="path of the tutorial's cifar10-distributed.py")
    parser.add_argument("--only", default="tutorial,ours")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first_seed", type=int, default=543)
    parser.add_argument("--num_epochs", type=int, default=5)
    parser.add_argument("--json", dest="json_path", default="benchmark_tutorial.json")
    args = parser.parse_args()
    entries = args.only.split(",")
    if not set(entries) <= {"tutorial", *OURS}:
        sys.exit(f"error: --only={args.only!r}: entries are tutorial, {', '.join(OURS)}")
    if "tutorial" in entries and not (args.tutorial and Path(args.tutorial).is_file()):
        sys.exit(f"error: --tutorial={args.tutorial!r} is not a file: give the tutorial's cifar10-distributed.py")
    invocation = time.strftime("%Y-%m-%dT%H:%M:%S")
    runs = []
    with tempfile.TemporaryDirectory(prefix="benchmark-tutorial-") as folder:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for entry in entries:
                output = Path(folder) / f"{entry}-{seed}"
                run = (
                    run_tutorial(args.tutorial, args.data_path, output, args.num_epochs, seed)
                    if entry == "tutorial"
                    else run_ours(entry, args.data_path, output, args.num_epochs, seed)
                )
                run.update(
                    training_only_epoch_mean=training_only_mean(run), invocation=invocation, num_epochs=args.num_epochs
                )
                runs.append(run)
                records.append_run(args.json_path, run)
                print(
                    f"{entry} seed {seed}: {100 * run['accuracy']:.2f}% in {run['wall_seconds']:.0f} s, first "
                    f"epoch's largest loss {run['first_epoch_max_loss']:.2f}",
                    flush=True,
                )
    summary = summarise(runs)
    print(table(summary))
    record = json.loads(Path(args.json_path).read_text())
    records.write(args.json_path, {"runs": record["runs"], "summary": summarise(record["runs"])})


if __name__ == "__main__":
    main()

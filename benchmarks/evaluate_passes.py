"""``cifar10-dist evaluate`` timed in two checkouts side by side, interleaved in one invocation: this one and an
earlier one (``--before``, e.g. a ``git worktree`` of the commit before evaluation became one pass), on the same
checkpoint and test set, each writing its confusion matrix and mistakes into a folder of its own; wall seconds of
each command, the median over rounds. Last run: ResNet-18 on the 10,000 CIFAR-10 test images, the Zen 4 EPYC
(docs/measurements/evaluate_cpu.json; about 3 minutes).

    python -m benchmarks.evaluate_passes --checkpoint=FILE --data_path=DIR --before=DIR [--rounds=2] [--json=PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import records


def timed_evaluate(checkout: Path, checkpoint: str, data_path: str, output: Path) -> float:
    """Seconds of ``python -m cifar10_dist evaluate`` with the package of ``checkout`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cifar10_dist",
            "evaluate",
            f"--checkpoint={checkpoint}",
            f"--data_path={data_path}",
            f"--output_dir={output}",
            "--num_workers=0",
            "--json",
        ],
        cwd=checkout,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--before", required=True, help="a checkout of the earlier code")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", dest="json_path", default="benchmark_evaluate.json")
    args = parser.parse_args()
    checkouts = {"before": Path(args.before).resolve(), "after": records.REPO}
    seconds: dict[str, list[float]] = {name: [] for name in checkouts}
    with tempfile.TemporaryDirectory() as folder:
        for number in range(args.rounds):
            for name, checkout in checkouts.items():
                seconds[name].append(
                    timed_evaluate(checkout, args.checkpoint, args.data_path, Path(folder) / f"{name}-{number}")
                )
                print(f"round {number + 1}, {name}: {seconds[name][-1]:.1f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"after / before: {medians['after'] / medians['before']:.2f}")
    before_commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=checkouts["before"], capture_output=True, text=True
    ).stdout.strip()
    records.write(
        args.json_path,
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "checkpoint": args.checkpoint,
            "before_commit": before_commit,
            "seconds": seconds,
            "median_seconds": medians,
            "after_over_before": medians["after"] / medians["before"],
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

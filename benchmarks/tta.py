"""What each test-time augmentation level buys and costs: one checkpoint evaluated on the test set at tta 0
(the image), 1 (and its mirror: 2 views) and 2 (mirrors of the image and of two 1-pixel shifts: 6 views), each
``cifar10-dist evaluate`` timed end to end in a fresh process, in rounds that alternate the levels.

    python -m benchmarks.tta --checkpoint=FILE --data_path=DIR [--rounds=2] [--json=PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks import records

LEVELS = (0, 1, 2)
VIEWS = {0: 1, 1: 2, 2: 6}


def evaluate(checkpoint: str, data_path: str, tta: int) -> tuple[float, float]:
    """(accuracy, wall seconds) of one ``evaluate --tta=N`` in its own process."""
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cifar10_dist",
            "evaluate",
            f"--checkpoint={checkpoint}",
            f"--data_path={data_path}",
            f"--tta={tta}",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=records.REPO,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"evaluate --tta={tta} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["accuracy"], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    seconds: dict[int, list[float]] = {level: [] for level in LEVELS}
    accuracy: dict[int, float] = {}
    for round_index in range(args.rounds):
        for level in LEVELS if round_index % 2 == 0 else LEVELS[::-1]:
            accuracy[level], wall = evaluate(args.checkpoint, args.data_path, level)
            seconds[level].append(wall)
    base = statistics.median(seconds[0])
    rows = [
        {
            "tta": level,
            "views": VIEWS[level],
            "accuracy": accuracy[level],
            "wall_seconds": statistics.median(seconds[level]),
            "extra_seconds": statistics.median(seconds[level]) - base,
            "rounds": seconds[level],
        }
        for level in LEVELS
    ]
    print(f"{'tta':>3}{'views':>6}{'accuracy':>10}{'wall s':>8}{'extra s':>9}")
    for row in rows:
        print(
            f"{row['tta']:>3}{row['views']:>6}{100 * row['accuracy']:>9.2f}%{row['wall_seconds']:>8.1f}"
            f"{row['extra_seconds']:>9.1f}"
        )
    if args.json_path:
        records.write(
            args.json_path, {"checkpoint": args.checkpoint, "hardware": records.hardware_record("cpu"), "rows": rows}
        )


if __name__ == "__main__":
    main()

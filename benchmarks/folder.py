"""Folder: CIFAR-10 as an image folder against the pickle copy built from the same JPEGs: the time to build the
folder's cache (60,000 images), then configs/fast.yaml trained on each with the same seed (accuracy, seconds per
epoch once the cache exists). One run of each; about 25 minutes on 2 cores. Last run: docs/your-data.md,
"Measured on CIFAR-10 as a folder" (CPU named there, JSON in docs/measurements/folder_cpu.json).

    python -m benchmarks.folder --folder=DIR --data_path=DIR [--seed=0] [--only=cache,pickle,folder] [--json=PATH]
        [--quick]

--folder holds train/<class>/*.jpg and test/<class>/*.jpg (tar xJf ../shared/data/cifar10-jpg.tar.xz);
--data_path holds cifar-10-batches-py built from the same archive (../shared/tools/make_cifar10.py). The cache
is built in a fresh temporary folder (the run of ``folder`` then reuses it), in a process of its own (its peak
memory is that process's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import records, runner

QUICK = {"num_epochs": 1, "epoch_length": 2, "tta": 0, "num_warmup_epochs": 0}
BUILD = """
import json, sys, time, resource
from pathlib import Path
from cifar10_dist.data import cache_builds, folder_scan
started = time.perf_counter()
folder, meta, found, how = cache_builds.ensure_cache(Path(sys.argv[1]), 32, Path(sys.argv[2]))
seconds = time.perf_counter() - started
peak = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
images = sum(count for _, count in meta.splits.values())
print(json.dumps({"seconds": seconds, "decode_seconds": meta.build_seconds, "images": images,
                  "workers": folder_scan.default_workers(), "peak_rss_mib": peak, "built": how == "built"}))
"""


def build_cache(folder: str, cache_under: Path) -> dict[str, Any]:
    """The cache built from nothing in a process of its own: seconds (scan, fingerprint, decode, write), peak
    memory of that process and its decoding processes."""
    done = subprocess.run(
        [sys.executable, "-c", BUILD, folder, str(cache_under)], capture_output=True, text=True, cwd=records.REPO
    )
    if done.returncode != 0:
        raise SystemExit(f"building the cache failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fast_run(output: Path, seed: int, quick: bool, **data: Any) -> dict[str, Any]:
    """configs/fast.yaml on the given data (benchmarks.runner): accuracy and the epochs' seconds."""
    run = runner.train_ours(
        output, records.REPO / "configs" / "fast.yaml", "cpu", **{**data, "seed": seed, **(QUICK if quick else {})}
    )
    seconds = [row["epoch_time"] for row in sorted(run.epochs, key=lambda row: row["epoch"])]
    later = seconds[1:] or seconds  # the first epoch pays one-time costs
    return {
        "accuracy": run.accuracy,
        "epoch_seconds": seconds,
        "mean_epoch_seconds_after_first": sum(later) / len(later),
        "training_seconds": run.summary.training_time,
        "wall_seconds": run.wall_seconds,
        "precision": run.summary.precision,
        "data_checks": run.summary.data_checks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="CIFAR-10 as train/<class>/, test/<class>/")
    parser.add_argument("--data_path", required=True, help="holding cifar-10-batches-py from the same images")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="cache,pickle,folder")
    parser.add_argument("--json", dest="json_path", default="benchmark_folder.json")
    parser.add_argument("--quick", action="store_true", help="a few steps of each run (checks the tool)")
    args = parser.parse_args()
    entries = args.only.split(",")
    print(f"{records.machine('cpu')}, torch {torch.__version__}", flush=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="benchmark-folder-") as temporary:
        cache_under = Path(temporary) / "cache"
        if "cache" in entries:
            results["cache"] = build_cache(args.folder, cache_under)
            print(
                f"cache: {results['cache']['images']} images in {results['cache']['seconds']:.1f} s "
                f"({results['cache']['workers']} decoding processes), "
                f"peak {results['cache']['peak_rss_mib']:.0f} MiB",
                flush=True,
            )
        for entry in ("pickle", "folder"):
            if entry not in entries:
                continue
            data = (
                {"data_path": args.data_path}
                if entry == "pickle"
                else {"dataset": "folder", "data_path": args.folder, "cache_dir": str(cache_under)}
            )
            results[entry] = fast_run(Path(temporary) / entry, args.seed, args.quick, **data)
            print(
                f"{entry}: accuracy {results[entry]['accuracy']:.4f}, "
                f"{results[entry]['mean_epoch_seconds_after_first']:.1f}"
                f" s per epoch after the first",
                flush=True,
            )
    if {"pickle", "folder"} <= set(results):
        pickle_run, folder_run = results["pickle"], results["folder"]
        results["folder_minus_pickle_points"] = 100 * (folder_run["accuracy"] - pickle_run["accuracy"])
        results["epoch_time_folder_over_pickle"] = (
            folder_run["mean_epoch_seconds_after_first"] / pickle_run["mean_epoch_seconds_after_first"]
        )
        print(
            f"folder - pickle: {results['folder_minus_pickle_points']:+.2f} points; epoch time folder/pickle "
            f"{results['epoch_time_folder_over_pickle']:.3f}"
        )
    records.write(
        args.json_path,
        {
            "seed": args.seed,
            "quick": args.quick,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "commit": records.commit(),
            "hardware": records.hardware_record(),
            "torch": torch.__version__,
            **results,
        },
    )


if __name__ == "__main__":
    main()

"""README's two command lines timed on a fresh clone of this checkout's HEAD: ``bash .ci/run`` as CI runs it (CI=true,
no stdin: a new virtualenv, the install, then exactly the test command README gives), and the demo command
(``cifar10-dist run --config=configs/demo.yaml``) in the environment it made: the seconds of the install, of
pytest and of the demo (its training time from its summary.json), pytest's counts, the CPU. About 6-8 minutes on
2 cores. Its runs: docs/measured.md (each with its CPU kind and its JSON in docs/measurements/).

    python -m benchmarks.suite [--json=PATH] [--keep=DIR] [--emulate=avx2]

Without ``--keep`` the clone (its virtualenv about 7 GB) is removed at the end, its logs kept beside it.

``--emulate=avx2`` runs both with benchmarks/avx2_only on PYTHONPATH: this machine with the AVX2-only kind's code
paths (torch's and oneDNN's kernels at AVX2, no native bf16), to see on a faster kind which tests that kind makes
dearer; the JSON says so under ``emulated``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import records

SUMMARY = re.compile(r"^(?:=+ )?(?P<counts>\d+ passed.*?) in (?P<seconds>[\d.]+)s", re.M)


EMULATIONS = {"avx2": "benchmarks/avx2_only"}  # --emulate's kinds: the folder (in the clone) put on PYTHONPATH


def timed(command: list[str], cwd: Path, log: Path, env: dict[str, str]) -> tuple[int, float, str]:
    """(exit code, wall seconds, output) of ``command`` run as CI runs it: CI=true, no stdin."""
    started = time.perf_counter()
    with log.open("w") as stream:
        process = subprocess.run(
            command,
            cwd=cwd,
            env={**env, "CI": "true"},
            stdin=subprocess.DEVNULL,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
    return process.returncode, time.perf_counter() - started, log.read_text()


def emulating(kind: str, clone: Path) -> dict[str, str]:
    """This environment with the clone's emulation of ``kind`` first on PYTHONPATH."""
    path = [str(clone / EMULATIONS[kind]), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def counts(summary: str) -> dict[str, int]:
    """'438 passed, 12 skipped, 7 warnings' as {'passed': 438, 'skipped': 12, 'warnings': 7}."""
    return {word: int(number) for number, word in re.findall(r"(\d+) (\w+)", summary)}


def measure(clone: Path, folder: Path, env: dict[str, str]) -> dict[str, Any]:
    """README's two lines run in ``clone`` (their logs in ``folder``): what the JSON records of them."""
    code, ci_seconds, output = timed(["bash", ".ci/run"], clone, folder / "ci.log", env)
    found = SUMMARY.findall(output)
    if code != 0 or not found:
        raise SystemExit(f".ci/run ended with {code}; its output is in {folder / 'ci.log'}")
    summary, pytest_seconds = found[-1][0], float(found[-1][1])
    print(f".ci/run: {ci_seconds:.1f} s in all, pytest {pytest_seconds:.1f} s ({summary})", flush=True)
    demo = (
        ". .venv/bin/activate && cifar10-dist run --config=configs/demo.yaml --output_path=demo-output --run_name=demo"
    )
    demo_code, demo_seconds, _ = timed(["bash", "-c", demo], clone, folder / "demo.log", env)
    if demo_code != 0:
        raise SystemExit(f"the demo ended with {demo_code}; its output is in {folder / 'demo.log'}")
    demo_training = json.loads((clone / "demo-output" / "demo" / "summary.json").read_text())["training_time"]
    print(f"demo: {demo_seconds:.1f} s in all, training {demo_training:.1f} s", flush=True)
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "tested_commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True
        ).stdout.strip(),
        "ci_run": {
            "seconds": ci_seconds,
            "pytest_seconds": pytest_seconds,
            "before_pytest_seconds": ci_seconds - pytest_seconds,  # apt checks, the virtualenv, the install
            "summary": summary,
            "counts": counts(summary),
        },
        "demo": {"seconds": demo_seconds, "training_seconds": demo_training},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", dest="json_path", default="benchmark_suite.json")
    parser.add_argument("--keep", help="clone into this (new) folder and keep it, instead of a temporary one")
    parser.add_argument("--emulate", choices=sorted(EMULATIONS), help="run as this kind of CPU would (see above)")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="suite-"))
    clone = folder / "clone"
    subprocess.run(["git", "clone", "--quiet", str(records.REPO), str(clone)], check=True)
    env = emulating(args.emulate, clone) if args.emulate else dict(os.environ)
    try:
        record = measure(clone, folder, env)
    finally:
        if not args.keep:  # the clone and its virtualenv (about 7 GB); the logs stay in the folder
            shutil.rmtree(clone, ignore_errors=True)
    if args.emulate:
        record["emulated"] = {"kind": args.emulate, "pythonpath": EMULATIONS[args.emulate]}
    records.write(args.json_path, record)
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

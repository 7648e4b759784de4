"""Our training run as every benchmark runs it: ``api.train`` in a fresh Python process (no other model's memory,
threads or allocator state in it; the GPUs hidden for a CPU run), its results read back through ``outputs.reading``
(summary.json, metrics.jsonl), never from its log.

    python -m benchmarks.runner REQUEST_JSON      (the worker side; benchmarks call ``train_ours``)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cifar10_dist.outputs import reading
from cifar10_dist.results import RunSummary

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class OurRun:
    """A finished run: its folder, summary.json, epoch and evaluation lines of metrics.jsonl, the wall seconds of
    its process (start-up, data, training, evaluation, exit) and the peak resident memory of its largest process."""

    run_dir: Path
    summary: RunSummary
    epochs: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    wall_seconds: float
    peak_rss_mib: float
    log: str = ""  # what its process printed on stderr (our log, and torch's where TORCH_LOGS asks)

    @property
    def accuracy(self) -> float:
        return self.summary.final["test"].accuracy

    def evaluation_seconds(self, split: str | None = None) -> float:
        """Seconds spent evaluating (one split, or all)."""
        return sum(row["duration"] for row in self.evaluations if split is None or row["split"] == split)

    def curve(self, split: str = "test") -> list[tuple[float, float]]:
        """(training seconds so far, accuracy) at each evaluation of ``split``, in epoch order."""
        elapsed, seconds = 0.0, {}
        for epoch in sorted(self.epochs, key=lambda row: row["epoch"]):
            elapsed += epoch["epoch_time"]
            seconds[epoch["epoch"]] = elapsed
        return [
            (seconds[row["epoch"]], row["accuracy"])
            for row in sorted(self.evaluations, key=lambda r: r["epoch"])
            if row["split"] == split and row["epoch"] in seconds
        ]


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds when a curve (``OurRun.curve``) first reached ``target`` (None: never)."""
    return next((seconds for seconds, accuracy in curve if accuracy >= target), None)


def train_ours(
    output: Path,
    config_file: str | Path | None = None,
    device: str = "cpu",
    environment: dict[str, str | None] | None = None,
    **overrides: Any,
) -> OurRun:
    """Train ``config_file`` (a YAML file, or the defaults) with ``overrides`` into output/<run_name, default
    "bench"> in a fresh process (``environment``: variables set for it, None: removed); a failed run ends the
    benchmark with the tail of its log."""
    overrides = {"run_name": "bench", **overrides, "output_path": str(output)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    for name, value in (environment or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    with tempfile.TemporaryDirectory() as folder:
        answer = Path(folder) / "answer.json"
        request = {
            "config": None if config_file is None else str(config_file),
            "overrides": overrides,
            "answer": str(answer),
        }
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.runner", json.dumps(request)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0 or not answer.is_file():
            raise SystemExit(f"our benchmark run failed (exit {done.returncode}): {done.stderr.strip()[-3000:]}")
        reported = json.loads(answer.read_text())
    run_dir = Path(reported["run_dir"])
    summary = reading.read_summary(run_dir)
    if summary is None:
        raise SystemExit(f"our benchmark run wrote no summary.json in {run_dir}")
    epochs, evaluations = reading.read_metrics(run_dir)
    return OurRun(run_dir, summary, epochs, evaluations, wall, reported["peak_rss_mib"], done.stderr)


def _work(request: dict[str, Any]) -> None:
    """The worker: one api.train, then the run folder and the peak resident memory (this process and the ones it
    spawned) for the parent."""
    from cifar10_dist import api

    result = api.train(request["config"], **request["overrides"])
    peak_kib = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    Path(request["answer"]).write_text(json.dumps({"run_dir": result.run_dir, "peak_rss_mib": peak_kib / 1024}))


if __name__ == "__main__":
    _work(json.loads(sys.argv[1]))

"""The GPU benchmark's record and tables (benchmarks.gpu): its JSON written after every run, the race's table and
its summary over seeds, and epoch 1's seconds against the steady epoch's."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks import records


class Record:
    """The benchmark's JSON, written again after every run."""

    def __init__(self, path: str | None, header: dict[str, Any]) -> None:
        self.path, self.data = path, dict(header)

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def add(self, part: str, name: str, value: Any) -> None:
        self.data.setdefault(part, {})[name] = value
        self.save()

    def save(self) -> None:
        if self.path:
            records.write(self.path, self.data)

    def say(self, line: str) -> None:
        """Print a line of the tables and keep it in the JSON's ``table`` (the GPU report shows it)."""
        print(line, flush=True)
        self.data["table"] = self.data.get("table", "") + line + "\n"
        self.save()


def epoch_seconds(curve: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(epoch 1's training seconds, the median of epochs 2+'s) from a curve evaluated after every epoch (training
    seconds so far, accuracy): what is first-epoch cost (autotuning, first launches) and what is the steady step."""
    ends = [seconds for seconds, _ in curve]
    if not ends:
        return None, None
    steady = [later - earlier for earlier, later in zip(ends, ends[1:])]
    return ends[0], statistics.median(steady) if steady else None


def side_of(recipe: str) -> str:
    """The JSON key of a recipe's runs: "ours" for fast.yaml (as earlier records have it), "ours:NAME" else."""
    return "ours" if recipe == "fast" else f"ours:{recipe}"


def summarise(data: dict[str, Any]) -> dict[str, Any]:
    """Means over the seeds that ran, and each of ours over the peer's training seconds and steady epoch."""
    summary = {}
    for side in ["peer", *(key for key in data if key == "ours" or key.startswith("ours:"))]:
        done = [row for row in data.get(side, {}).values() if isinstance(row, dict) and "accuracy" in row]
        if done:
            summary[side] = {
                key: statistics.mean(row[key] for row in done)
                for key in ("accuracy", "training_seconds", "first_epoch_seconds", "steady_epoch_seconds")
                if all(row.get(key) is not None for row in done)
            }
            summary[side]["seeds"] = len(done)
    for side in [key for key in summary if key.startswith("ours")]:
        for key in ("training_seconds", "steady_epoch_seconds"):
            if "peer" in summary and key in summary[side] and key in summary["peer"]:
                summary[f"{key}_{side.replace(':', '_')}_over_peer"] = summary[side][key] / summary["peer"][key]
    return summary


def print_race(out: Record) -> None:
    out.say(f"{'run':<34}{'accuracy':>10}{'train s':>9}{'epoch 1 s':>11}{'steady s':>10}{'wall s':>8}")
    for side in ["peer", *(key for key in out.data if key == "ours" or key.startswith("ours:"))]:
        seeds = out.data.get(side, {})
        if seeds:
            seed, row = list(seeds.items())[-1]
            out.say(f"{side + ' seed ' + seed:<34}" + cells(row))


def cells(row: dict[str, Any] | str) -> str:
    if not isinstance(row, dict) or "accuracy" not in row:
        return f"  {row if isinstance(row, str) else row.get('failed', '?')[-200:]}"
    return (
        f"{row['accuracy']:>10.4f}{row['training_seconds']:>9.2f}{_s(row.get('first_epoch_seconds'), 3):>11}"
        f"{_s(row.get('steady_epoch_seconds'), 3):>10}{_s(row.get('wall_seconds'), 1):>8}"
    )


def _s(value: float | None, decimals: int) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"

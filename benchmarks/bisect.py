"""Where fast.yaml lost about a point on the GPU (issue 72): a bisect over the commits that touched the package,
and the A/B of each suspect alone at this checkout. Prepared for one GPU lease call each (about 5 minutes); rehearsed
with --device=cpu on a small synthetic set. The fourth lease ran both: the first bad commit was 13ce246, whose
protocol check Python 3.12 answers differently (docs/gpu-report.md).

    python -m benchmarks.bisect bisect --data_path=DIR [--good=5bbdca2] [--bad=4d49e38] [--seeds=0,1]
        [--threshold=0.9035] [--budget_minutes=5] [--history=.lease/history.bundle] [--json=PATH] [--quick]
    python -m benchmarks.bisect ab --data_path=DIR [--seeds=0,1] [--budget_minutes=5] [--json=PATH] [--quick]

  bisect: the commits from --good to --bad that touch cifar10_dist/ or configs/, oldest first. Each is checked out
     into a git worktree (from this checkout's history, or from --history, a ``git bundle`` of it, where the copy
     has no .git) and runs its own configs/fast.yaml in a fresh process with the worktree first on PYTHONPATH: the
     installed dependencies are shared, nothing is installed per commit. A commit's verdict is the mean test
     accuracy over --seeds: good at --threshold or above. Both ends first (when they do not differ here, there is
     nothing to search, and it says so), then a binary search; the JSON is written after every run, and the search
     stops before a commit whose runs would overrun --budget_minutes, saying where it stood.
  ab: at this checkout, fast.yaml as shipped and with each suspect switched alone (the warm-up off, lookahead per
     tensor instead of its two foreach launches, the loader's order and draws instead of the device's, TF32 off,
     cuDNN's autotuning off, fp32), seed by seed.
--quick: 2 epochs of at most 8 steps of 64 images, for a rehearsal on a CPU (the accuracies mean nothing then).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from benchmarks import records

PACKAGE_PATHS = ("cifar10_dist", "configs")
QUICK = (
    "--num_epochs=2",
    "--epoch_length=8",
    "--batch_size=64",
    "--validate_every=2",
    "--num_warmup_epochs=0.5",
    "--whitening_bias_epochs=1",
    "--tta=0",
)
FINAL = re.compile(r"^final test: accuracy ([0-9.]+)", re.MULTILINE)
SUSPECTS: dict[str, tuple[list[str], dict[str, str]]] = {  # name: (flags, environment)
    "as shipped": ([], {}),
    "warm_up_steps=0": (["--warm_up_steps=0"], {}),
    "lookahead per tensor": ([], {"CIFAR10_DIST_LOOKAHEAD_PER_TENSOR": "1"}),
    "loader's order and draws (data_on_device=False)": (["--data_on_device=False"], {}),
    "tf32=False": (["--tf32=False"], {}),
    "cudnn_benchmark=False": (["--cudnn_benchmark=False"], {}),
    "fp32 (with_amp=False)": (["--with_amp=False"], {}),
}


def run_fast(
    source: Path, data_path: str, seed: int, flags: list[str], environment: dict[str, str], quick: bool
) -> dict[str, Any]:
    """fast.yaml of the package in ``source`` at one seed, in a fresh process: its final test accuracy and seconds
    (or the last lines it printed when it failed)."""
    with tempfile.TemporaryDirectory() as output:
        command = [
            sys.executable,
            "-m",
            "cifar10_dist",
            "run",
            "--config=configs/fast.yaml",
            f"--data_path={data_path}",
            f"--seed={seed}",
            f"--output_path={output}",
            "--run_name=run",
            *(QUICK if quick else ()),
            *flags,
        ]
        env = {
            **os.environ,
            **environment,
            "PYTHONPATH": os.pathsep.join([str(source), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        started = time.perf_counter()
        done = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - started
    found = FINAL.search(done.stdout)
    if done.returncode != 0 or found is None:
        return {"seed": seed, "failed": (done.stdout + done.stderr)[-1500:], "seconds": seconds}
    return {"seed": seed, "accuracy": float(found.group(1)), "seconds": seconds}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def history(history_bundle: str | None) -> Iterator[Path]:
    """A repository holding the commits: this checkout's, or a clone of the bundle (a copy without .git), removed
    at the end."""
    try:
        git(records.REPO, "rev-parse", "--verify", "-q", "5bbdca2^{commit}")
        has_history = True
    except subprocess.CalledProcessError:
        has_history = False
    if has_history:
        yield records.REPO
        return
    if history_bundle is None:
        raise SystemExit("this copy has no git history: give --history=BUNDLE (git bundle create F --all)")
    with tempfile.TemporaryDirectory(prefix="bisect-history-") as clone:
        subprocess.run(["git", "clone", "-q", "--no-checkout", history_bundle, clone], check=True)
        yield Path(clone)


@contextlib.contextmanager
def worktrees_of(repo: Path) -> Iterator[Path]:
    """A folder for the commits' worktrees; at the end each is removed from ``repo`` and the folder goes."""
    with tempfile.TemporaryDirectory(prefix="bisect-worktrees-") as folder:
        try:
            yield Path(folder)
        finally:
            for tree in Path(folder).iterdir():
                removed = subprocess.run(
                    ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True, text=True
                )
                if removed.returncode != 0:  # the folder goes with its parent; git's entry stays until a prune
                    print(f"bisect: worktree {tree} stays listed in {repo}: {removed.stderr.strip()}", flush=True)


def commits(repo: Path, good: str, bad: str) -> list[tuple[str, str]]:
    """(sha, subject) of good and of every commit after it up to bad that touches the package, oldest first."""
    listed = git(repo, "log", "--reverse", "--format=%h %s", f"{good}..{bad}", "--", *PACKAGE_PATHS).splitlines()
    first = git(repo, "log", "-1", "--format=%h %s", good)
    return [tuple(line.split(" ", 1)) for line in [first, *listed]]  # type: ignore[misc]


def checkout(repo: Path, sha: str, tree: Path) -> Path:
    """The commit's files in a worktree of their own (made once)."""
    if not tree.exists():
        git(repo, "worktree", "add", "-q", "--detach", str(tree), sha)
    return tree


class Search:
    """The binary search's state and its JSON, written after every run."""

    def __init__(self, args: argparse.Namespace, order: list[tuple[str, str]]) -> None:
        self.args, self.order = args, order
        self.started = time.perf_counter()
        self.data: dict[str, Any] = {
            "command": " ".join(sys.argv),
            "part": args.part,
            "machine": records.machine(args.device),
            "threshold": args.threshold,
            "commits": [{"sha": sha, "subject": subject[:120]} for sha, subject in order],
            "runs": [],
            "verdicts": {},
        }

    def save(self) -> None:
        if self.args.json:
            records.write(self.args.json, self.data)

    def fits(self) -> bool:
        """Whether one more commit's runs fit the budget (their mean seconds so far, doubled for the first)."""
        runs = [run["seconds"] for run in self.data["runs"]]
        each = statistics.mean(runs) if runs else 0.0
        needed = each * len(self.args.seeds)
        return time.perf_counter() - self.started + needed <= self.args.budget_minutes * 60

    def measure(self, source: Path, label: str, flags: list[str], environment: dict[str, str]) -> float | None:
        """The mean accuracy of ``source`` over the seeds (None when a run failed)."""
        accuracies = []
        for seed in self.args.seeds:
            run = {"label": label, **run_fast(source, self.args.data_path, seed, flags, environment, self.args.quick)}
            self.data["runs"].append(run)
            self.save()
            print(
                f"{label:<58} seed {seed}: "
                + (
                    f"{run['accuracy']:.4f} in {run['seconds']:.0f} s"
                    if "accuracy" in run
                    else f"failed: {run['failed'][-300:]}"
                ),
                flush=True,
            )
            if "accuracy" not in run:
                return None
            accuracies.append(run["accuracy"])
        return statistics.mean(accuracies)


def bisect(args: argparse.Namespace) -> None:
    with history(args.history) as repo, worktrees_of(repo) as worktrees:
        search_commits(args, repo, worktrees)


def search_commits(args: argparse.Namespace, repo: Path, worktrees: Path) -> None:
    """Both ends, then the binary search between them, each commit checked out in a worktree under ``worktrees``."""
    order = commits(repo, args.good, args.bad)
    search = Search(args, order)

    def verdict(index: int) -> bool | None:
        sha, subject = order[index]
        mean = search.measure(checkout(repo, sha, worktrees / sha), f"{sha} {subject[:44]}", [], {})
        good = None if mean is None else mean >= args.threshold
        search.data["verdicts"][sha] = {"mean_accuracy": mean, "good": good}
        search.save()
        return good

    low, high = 0, len(order) - 1
    ends = (verdict(low), verdict(high))
    if ends != (True, False):
        search.data["conclusion"] = (
            f"the ends do not differ here (good end {ends[0]}, bad end {ends[1]} at "
            f"threshold {args.threshold}): nothing to search"
        )
    while ends == (True, False) and high - low > 1:
        if not search.fits():
            search.data["conclusion"] = (
                f"budget spent: the change lies after {order[low][0]} and at or before "
                f"{order[high][0]} ({high - low} commits)"
            )
            break
        middle = (low + high) // 2
        good = verdict(middle)
        if good is None:
            search.data["conclusion"] = f"{order[middle][0]} failed to run: the search stops there"
            break
        low, high = (middle, high) if good else (low, middle)
    else:
        if ends == (True, False):
            search.data["conclusion"] = f"first bad commit: {order[high][0]} {order[high][1][:200]}"
    print(search.data.get("conclusion", ""), flush=True)
    search.save()


def ab(args: argparse.Namespace) -> None:
    search = Search(args, [])
    results = {}
    for name, (flags, environment) in SUSPECTS.items():
        if not search.fits():
            search.data["conclusion"] = f"budget spent before {name!r}"
            break
        results[name] = search.measure(records.REPO, name, flags, environment)
        search.data["means"] = results
        search.save()
    print(
        "\n".join(
            f"{name:<58} mean {mean:.4f}" if mean is not None else f"{name:<58} failed"
            for name, mean in results.items()
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("bisect", "ab"))
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--good", default="5bbdca2")
    parser.add_argument("--bad", default="4d49e38")
    parser.add_argument("--seeds", default="0,1", type=lambda text: [int(seed) for seed in text.split(",")])
    parser.add_argument("--threshold", default=0.9035, type=float)
    parser.add_argument("--budget_minutes", default=5.0, type=float)
    parser.add_argument("--history", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the runs' processes see no GPU
    bisect(args) if args.part == "bisect" else ab(args)


if __name__ == "__main__":
    main()

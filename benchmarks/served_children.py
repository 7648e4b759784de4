"""The CPU a process forked by the tests' CLI server (tests/cli_server.py) costs, in two checkouts side by side:
a served ``--help`` and a served tiny run (tests/conftest.py's TINY), each repeated, the checkouts taking turns so
that the machine's drift falls on both. Each child's user and kernel seconds come from Linux process accounting
(root: ``accton``, ``dump-acct``), summed over the processes the server forked. Results: docs/measured.md.

    python -m benchmarks.served_children OLD_CHECKOUT NEW_CHECKOUT [--rounds=5] [--json=PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import records

# run in each checkout (its folder first on the import path, as ``python -c`` puts it): its server, then one
# served --help or tiny run; prints the server's pid
CHILD = """
from pathlib import Path
from tests.conftest import TINY, cli_server, run_forked, write_dataset
folder = Path({folder!r})
if not (folder / "data").exists():
    write_dataset(folder / "data", 600, 301)
server = cli_server()
tiny_run = ["run", *TINY, f"--data_path={{folder / 'data'}}", f"--output_path={{folder}}"]
result = run_forked(*(["--help"] if {what!r} == "help" else tiny_run))
assert result.returncode == 0, result.stderr[-2000:]
print(server.process.pid)
"""


def served_child_seconds(checkout: Path, what: str, folder: Path) -> dict[str, float]:
    """User and kernel seconds of the one process the server of ``checkout`` forked for ``what``."""
    log = folder / "acct"
    log.write_bytes(b"")
    subprocess.run(["accton", str(log)], check=True, capture_output=True)
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(folder=str(folder), what=what)],
            capture_output=True,
            text=True,
            check=True,
            cwd=checkout,
        )
    finally:
        subprocess.run(["accton", "off"], check=True, capture_output=True)
    server = int(done.stdout.split()[-1])
    rows = subprocess.run(["dump-acct", str(log)], capture_output=True, text=True, check=True).stdout
    user = system = 0.0
    for row in rows.splitlines():
        fields = [field.strip() for field in row.split("|")]
        if len(fields) > 10 and fields[10] == str(server) and fields[0].startswith("python"):
            user += float(fields[2]) / 100
            system += float(fields[3]) / 100
    return {"user": round(user, 2), "system": round(system, 2), "cpu": round(user + system, 2)}


def measure(checkouts: dict[str, Path], rounds: int) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, float]]]] = {side: {"help": [], "tiny_run": []} for side in checkouts}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(rounds):
            for what in ("help", "tiny_run"):
                for side, checkout in checkouts.items():
                    folder = Path(scratch) / side
                    folder.mkdir(exist_ok=True)
                    runs[side][what].append(served_child_seconds(checkout, what, folder))
    medians = {
        side: {what: statistics.median(one["cpu"] for one in each) for what, each in per.items()}
        for side, per in runs.items()
    }
    return {"runs": runs, "median_cpu_seconds": medians}


def checkout_commit(checkout: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    checkouts = {"old": options.old.resolve(), "new": options.new.resolve()}
    result = {
        "checkouts": {side: checkout_commit(path) for side, path in checkouts.items()},
        **measure(checkouts, options.rounds),
    }
    print(json.dumps(result["median_cpu_seconds"]))
    if options.json:
        records.write(options.json, result)


if __name__ == "__main__":
    main()

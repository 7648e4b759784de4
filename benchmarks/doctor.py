"""The doctor's probe, recorded: ``cifar10-dist doctor``'s report (the CPU, what each setting trains at, its advice)
as a benchmark JSON with the command, commit and machine, so that docs quote it from a file. About 6 s on a CPU
(3 settings of about --budget_seconds each). Figures: docs/measured.md, "The doctor's probe" (CPU named there,
JSON in docs/measurements/).

    python -m benchmarks.doctor [--model=airbench] [--batch_size=32] [--budget_seconds=2] [--json=PATH]
"""

from __future__ import annotations

import argparse
import time

from benchmarks import records
from cifar10_dist import api
from cifar10_dist.system.doctor import render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="airbench")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--budget_seconds", type=float, default=2.0)
    parser.add_argument("--json", dest="json_path", default="benchmark_doctor.json")
    args = parser.parse_args()
    started = time.perf_counter()
    report = api.doctor(args.model, args.batch_size, args.budget_seconds)
    seconds = time.perf_counter() - started
    print(render(report), flush=True)
    print(f"{seconds:.1f} s in all")
    records.write(
        args.json_path, {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": seconds, "report": report.to_dict()}
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

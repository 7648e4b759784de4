"""DDP: what DistributedDataParallel itself costs on this machine, over gloo; prints a table (and writes JSON with
--json: the rounds and each case's medians). Figures: docs/measured.md, "Several processes: DDP over gloo" (CPU
named there, JSON in docs/measurements/); ResNet-18, 128 images per process, --steps=15 --rounds=4, about 20 minutes on
2 cores.

    python -m benchmarks.ddp [--model=resnet18] [--batch_size=128] [--steps=20] [--warmup=3] [--rounds=3]
        [--json=PATH]

"2 processes / 1 process" on a 2-core machine is bounded by single-thread speed, so it says little about
DistributedDataParallel. Here every process has one thread and the same per-process batch, and the cases are:
  one          one process alone;
  two alone    two processes at once, no communication (what sharing the machine costs: memory, caches);
  ddp ...      two processes under DDP over gloo, with its default settings and with the ones that move the
               all-reduce: gradient_as_bucket_view, static_graph, bucket_cap_mb (1: many small all-reduces
               overlapped with the backward pass; 200: one all-reduce after it).
"DDP cost" is a case's step time over "two alone"'s: the all-reduce and its synchronisation, with the contention
of sharing the machine taken out; "vs one" adds that contention back. Every case runs in fresh processes, all
cases --rounds times, interleaved; each ratio is taken within a round, then the median over rounds is printed
with its range (this machine's speed drifts over minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from benchmarks import records
from benchmarks.steps import make_step, setup
from cifar10_dist.launch.supervision import free_port

CASES: dict[str, dict[str, Any] | None] = {  # None: no DDP
    "one": None,
    "two alone": None,
    "ddp defaults (bucket 25 MB)": {},
    "ddp gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "ddp static_graph": {"static_graph": True},
    "ddp static_graph + bucket view": {"static_graph": True, "gradient_as_bucket_view": True},
    "ddp bucket_cap_mb=1": {"bucket_cap_mb": 1},
    "ddp bucket_cap_mb=200 (one bucket)": {"bucket_cap_mb": 200},
}


def timed_steps(model_name: str, batch_size: int, steps: int, warmup: int, ddp: dict[str, Any] | None) -> float:
    """Seconds per step of this process (one thread), after warm-up; under DDP with ``ddp`` when given."""
    torch.set_num_threads(1)
    model, optimizer, loss_fn = setup(model_name)
    if ddp is not None:
        model = DistributedDataParallel(model, **ddp)
    step = make_step(model, optimizer, loss_fn)
    generator = torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0)
    inputs = torch.randn(batch_size, 3, 32, 32, generator=generator)
    targets = torch.randint(0, 10, (batch_size,), generator=generator)
    for _ in range(warmup):
        step(inputs, targets)
    if dist.is_initialized():
        dist.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        step(inputs, targets)
    return (time.perf_counter() - started) / steps


def _worker(
    rank: int, world_size: int, port: int, args: argparse.Namespace, ddp: dict[str, Any] | None, results: Any
) -> None:
    if world_size == 1:
        results[rank] = timed_steps(args.model, args.batch_size, args.steps, args.warmup, None)
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results[rank] = timed_steps(args.model, args.batch_size, args.steps, args.warmup, ddp)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_case(name: str, args: argparse.Namespace) -> float:
    """Seconds per step of the slower process of a case, in processes started for it."""
    world_size = 1 if name == "one" else 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(world_size, free_port(), args, CASES[name], results), nprocs=world_size, join=True)
        return max(results.values())


def spread(values: list[float]) -> str:
    """Median, and the range when there is more than one value."""
    middle = statistics.median(values)
    return f"{middle:.3f}" if len(values) == 1 else f"{middle:.3f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch_size", type=int, default=128, help="per process")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="every case this many times, interleaved")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    rounds = []
    for number in range(args.rounds):
        rounds.append({name: run_case(name, args) for name in CASES})
        print(
            f"round {number + 1}: " + ", ".join(f"{name} {value:.3f}" for name, value in rounds[-1].items()), flush=True
        )
    print(
        f"{args.model}, {args.batch_size} images per process and step, 1 thread per process, "
        f"torch {torch.__version__}, {args.rounds} round(s); medians over rounds (range)"
    )
    print(f"{'case':<38}{'s/step':>20}{'img/s':>8}{'DDP cost':>22}{'vs one':>22}")
    summary = {}
    for name in CASES:
        per_step = [r[name] for r in rounds]
        processes = 1 if name == "one" else 2
        costs = None if name in ("one", "two alone") else [r[name] / r["two alone"] for r in rounds]
        versus_one = [r[name] / r["one"] for r in rounds]
        speed = processes * args.batch_size / statistics.median(per_step)
        print(
            f"{name:<38}{spread(per_step):>20}{speed:>8.0f}{spread(costs) if costs else '-':>22}"
            f"{spread(versus_one):>22}"
        )
        summary[name] = {
            "seconds_per_step": statistics.median(per_step),
            "images_per_second": speed,
            "ddp_cost": statistics.median(costs) if costs else None,
            "vs_one": statistics.median(versus_one),
        }
    if args.json_path:
        records.write(args.json_path, {"arguments": vars(args), "rounds": rounds, "medians": summary})


if __name__ == "__main__":
    main()

"""What data parallelism itself costs on this machine, run by hand: prints a table (and writes JSON with --json).

"2 processes / 1 process" on a 2-core machine is bounded by single-thread speed, so it says little about
DistributedDataParallel. Here every process has one thread and the same per-process batch, and the cases are:
  one          one process alone;
  two alone    two processes at once, no communication (what sharing the machine costs: memory, caches);
  ddp ...      two processes under DDP over gloo, with its default settings and with the ones that move the
               all-reduce: gradient_as_bucket_view, static_graph, bucket_cap_mb (1: many small all-reduces
               overlapped with the backward pass; 200: one all-reduce after it).
"DDP cost" is a case's step time over "two alone"'s: the all-reduce and its synchronisation, with the contention
of sharing the machine taken out; "vs one" adds that contention back.

Usage: python scripts/benchmark_ddp.py [--model=resnet18] [--batch_size=128] [--steps=20] [--warmup=3] [--json=PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmark import make_step, setup  # noqa: E402
from cifar10_dist.launch import free_port  # noqa: E402

CASES: dict[str, dict[str, Any] | None] = {  # None: no DDP
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


def _worker(rank: int, port: int, args: argparse.Namespace, ddp: dict[str, Any] | None, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        results[rank] = timed_steps(args.model, args.batch_size, args.steps, args.warmup, ddp)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def two_processes(args: argparse.Namespace, ddp: dict[str, Any] | None) -> float:
    """Seconds per step of the slower of two processes started together."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(free_port(), args, ddp, results), nprocs=2, join=True)
        return max(results.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch_size", type=int, default=128, help="per process")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    seconds = {"one": timed_steps(args.model, args.batch_size, args.steps, args.warmup, None)}
    for name, ddp in CASES.items():
        seconds[name] = two_processes(args, ddp)
    alone = seconds["two alone"]
    print(f"{args.model}, {args.batch_size} images per process and step, 1 thread per process, "
          f"torch {torch.__version__}")
    print(f"{'case':<38}{'s/step':>8}{'img/s':>8}{'DDP cost':>10}{'vs one':>8}")
    for name, value in seconds.items():
        processes = 1 if name == "one" else 2
        cost = "-" if name in ("one", "two alone") else f"{value / alone:.3f}"
        print(f"{name:<38}{value:>8.3f}{processes * args.batch_size / value:>8.0f}{cost:>10}"
              f"{value / seconds['one']:>8.3f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"arguments": vars(args), "seconds_per_step": seconds}, indent=2))


if __name__ == "__main__":
    main()

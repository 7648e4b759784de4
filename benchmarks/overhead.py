"""Overhead: the microseconds per iteration our trainer adds to a bare loop, with its default handlers, on a model
whose step costs microseconds (so only the framework around it shows), and each handler's share. Figures:
docs/measured.md, "The trainer's own cost"; 5 interleaved rounds after a warm-up round, under a minute on 2 cores.

    python -m benchmarks.overhead [--rounds=5] [--short=300] [--long=1800] [--json=PATH] [--default_allocator]

Each round runs the bare loop and a real run (``api.train`` in this process: LR schedule, stop and NaN checks,
checkpoints every 200 iterations, progress and TensorBoard/metrics.jsonl every 15) for ``short`` and ``long``
iterations; their difference cancels start-up and warm-up. Then one run profiled by Ignite's
HandlersTimeProfiler gives the handlers' shares.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import records
from cifar10_dist import api
from cifar10_dist.data import augmentation
from cifar10_dist.data.synthetic import make_synthetic
from cifar10_dist.outputs import reading
from cifar10_dist.system import cpu, hardware
from cifar10_dist.training import engines as worker

BATCH = 8


def tiny_linear() -> nn.Module:
    """A model whose training step costs microseconds: only the framework around it shows."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))


def bare_loop(iterations: int) -> float:
    """Seconds of a bare PyTorch loop over in-memory uint8 images: shuffled batches of 8, normalised, one SGD
    step each, the loss never read (what a careful hand-written loop does)."""
    torch.manual_seed(0)
    train, _ = make_synthetic(BATCH * iterations, 1, 0)
    model = tiny_linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(train.labels))
    start = time.perf_counter()
    for index in range(iterations):
        chosen = order[index * BATCH : (index + 1) * BATCH]
        inputs, targets = augmentation.normalize(train.images[chosen]), train.labels[chosen]
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def our_run(iterations: int, profiler: Any = None) -> float:
    """Seconds of the training epoch of a real run in this process with the same model, batch and data, no
    augmentation; ``profiler`` (Ignite's HandlersTimeProfiler) is attached to its trainer when given."""
    setup_engines = worker.setup_engines

    def with_profiler(*args: Any, **kwargs: Any) -> Any:
        engine_set = setup_engines(*args, **kwargs)
        profiler.attach(engine_set.trainer)
        return engine_set

    with tempfile.TemporaryDirectory() as output:
        config = api.resolve(
            None,
            dataset="synthetic",
            synthetic_size=BATCH * iterations,
            model="benchmarks.overhead:tiny_linear",
            batch_size=BATCH,
            num_epochs=1,
            num_warmup_epochs=0.1,
            num_workers=0,
            data_on_device=True,
            train_eval_size=0,
            crop_padding=0,
            flip="none",
            output_path=output,
            run_name="overhead",
        )
        worker.setup_engines = with_profiler if profiler is not None else setup_engines
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                result = api.train(config)
        finally:
            worker.setup_engines = setup_engines
        epochs, _ = reading.read_metrics(Path(result.run_dir))
    return epochs[-1]["epoch_time"]


def measure(rounds: int, short: int, long: int) -> dict[str, Any]:
    """Microseconds per iteration of the bare loop and of our run, from the difference between a long and a short
    run, in ``rounds`` interleaved rounds after one unrecorded warm-up round (the first runs of a process pay its
    one-time costs); medians and ranges."""
    bare_loop(short), our_run(short)
    per_iteration: dict[str, list[float]] = {"bare": [], "ours": []}
    for round_index in range(rounds):
        for name, run in (("bare", bare_loop), ("ours", our_run)):
            per_iteration[name].append((run(long) - run(short)) / (long - short) * 1e6)
        print(
            f"round {round_index + 1}: bare {per_iteration['bare'][-1]:.1f} us, ours {per_iteration['ours'][-1]:.1f} "
            f"us per iteration",
            flush=True,
        )
    above = [ours - bare for bare, ours in zip(per_iteration["bare"], per_iteration["ours"])]
    return {
        "bare_us": statistics.median(per_iteration["bare"]),
        "ours_us": statistics.median(per_iteration["ours"]),
        "above_bare_us": statistics.median(above),
        "above_bare_range_us": [min(above), max(above)],
        "rounds": per_iteration,
        "short": short,
        "long": long,
    }


def handler_costs(iterations: int) -> dict[str, float]:
    """Microseconds per iteration of each per-iteration handler of our trainer, of the step and of the data,
    from Ignite's HandlersTimeProfiler in one run (the profiler's own cost is not in these numbers)."""
    from ignite.handlers import HandlersTimeProfiler

    profiler = HandlersTimeProfiler()
    our_run(iterations, profiler)
    costs: dict[str, float] = {}
    for event, handlers in profiler.event_handlers_times.items():
        if not str(getattr(event, "name", event)).startswith(("ITERATION", "GET_BATCH")):
            continue  # epoch-level handlers (validation, epoch logs): not a per-iteration cost
        for name, times in handlers.items():
            costs[name] = costs.get(name, 0.0) + sum(times) / iterations * 1e6
    step = "(the step: batch preparation, forward, backward, optimizer)"
    costs[step] = sum(profiler.processing_times) / iterations * 1e6
    costs["(the data: the next batch from the loader)"] = sum(profiler.dataflow_times) / iterations * 1e6
    return dict(sorted(costs.items(), key=lambda item: -item[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--short", type=int, default=300, help="iterations of the short runs")
    parser.add_argument("--long", type=int, default=1800, help="iterations of the long runs")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--default_allocator", action="store_true", help="leave glibc's allocator as it is")
    args = parser.parse_args()
    if not args.default_allocator and cpu.keep_freed_memory():
        print("reuse_freed_memory: on in this process, as in a run (--default_allocator leaves it off)")
    os.environ["OMP_NUM_THREADS"] = "1"  # our run keeps it (else it takes a thread per core)
    torch.set_num_threads(1)
    print(
        f"per-iteration cost of our trainer over a bare loop: a linear model, batch {BATCH}, 1 thread, runs of "
        f"{args.short} and {args.long} iterations, {args.rounds} interleaved rounds; torch {torch.__version__}; "
        f"{hardware.one_line()}"
    )
    measured = measure(args.rounds, args.short, args.long)
    costs = handler_costs(args.long)
    print(f"{'median per iteration':<60}{'us':>10}")
    for key, label in (
        ("bare_us", "bare loop"),
        ("ours_us", "our run (default handlers)"),
        ("above_bare_us", "ours above the bare loop"),
    ):
        print(f"{label:<60}{measured[key]:>10.1f}")
    low, high = measured["above_bare_range_us"]
    print(f"{'  range over the rounds':<60}{f'{low:.0f}..{high:.0f}':>10}")
    print(f"\n{'handler (one profiled run of ' + str(args.long) + ' iterations)':<60}{'us/iter':>10}")
    for name, micros in costs.items():
        print(f"{name[:59]:<60}{micros:>10.1f}")
    if args.json_path:
        records.write(
            args.json_path,
            {
                "overhead": measured,
                "handlers_us": costs,
                "torch": torch.__version__,
                "hardware": records.hardware_record(),
                "commit": records.commit(),
            },
        )


if __name__ == "__main__":
    main()

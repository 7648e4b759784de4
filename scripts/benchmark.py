"""Throughput benchmark, run by hand: prints a table (and writes JSON with --json PATH).

Measures, in one run on this machine, images per second of:
  1. a bare PyTorch training loop on pre-made tensors;
  2. our Ignite trainer with its default handlers on the same tensors;
  3. our full training epoch end to end (CLI, real data), 1 process;
  4. the same with 2 gloo processes (1 thread each);
  5. a conventional pipeline: torchvision CIFAR10 + PIL transforms, DataLoader with 2 workers, same step;
  6. evaluation (train subset + test set), from run 3.
Usage: python scripts/benchmark.py --data_path=DIR [--model=resnet18] [--batch_size=512] [--steps=10] [--json=PATH]

With --variants, only the bare loop in each speed setting (fp32, channels_last, bf16 autocast with and
without channels_last, torch.compile alone and on top of both, with its warm-up time): the measurement behind the CPU defaults.
With --profile [--amp] [--channels_last], torch.profiler's top operators of a few bare training steps.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Events
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cifar10_dist import augmentation, data, diagnostics, engines, faults, hardware, launch, models, tracking

CPU = torch.device("cpu")


def make_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module, amp: bool = False,
              device: torch.device = CPU):
    """One plain training step (fp16 with a GradScaler on CUDA, as our trainer does), returning the loss as a float
    (the bare loop reads it, as most hand-written loops do)."""
    step = diagnostics.plain_training_step(model, optimizer, loss_fn, engines.choose_precision(device, amp))
    return lambda inputs, targets: step(inputs, targets).item()


def setup(model_name: str, device: torch.device = CPU):
    torch.manual_seed(0)
    model = models.build_model(model_name).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    return model, optimizer, nn.CrossEntropyLoss()


def prepared(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device, channels_last: bool,
             compile: bool) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model and batch on the device, in channels_last and compiled when asked."""
    inputs, targets = batch[0].to(device), batch[1].to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return (torch.compile(model) if compile else model), (inputs, targets)


def bare_loop(model_name: str, batch: tuple[torch.Tensor, torch.Tensor], steps: int, warmup: int,
              channels_last: bool = False, amp: bool = False, compile: bool = False, device: torch.device = CPU
              ) -> float:
    model, optimizer, loss_fn = setup(model_name, device)
    model, (inputs, targets) = prepared(model, batch, device, channels_last, compile)
    step = make_step(model, optimizer, loss_fn, amp, device)
    started = time.perf_counter()
    for _ in range(warmup):
        step(inputs, targets)
    bare_loop.warmup_seconds = time.perf_counter() - started
    start = time.perf_counter()
    losses = [step(inputs, targets) for _ in range(steps)]
    seconds = time.perf_counter() - start
    bare_loop.last = {"steps": len(losses), "seconds": seconds, "losses": losses}
    return len(losses) * len(targets) / seconds


VARIANTS = {
    "fp32": {},
    "channels_last": {"channels_last": True},
    "bf16 autocast": {"amp": True},
    "bf16 autocast + channels_last": {"amp": True, "channels_last": True},
    "torch.compile": {"compile": True},
    "bf16 autocast + channels_last + compile": {"amp": True, "channels_last": True, "compile": True},
}


def print_variants(model_name: str, batch: tuple[torch.Tensor, torch.Tensor], steps: int, warmup: int) -> None:
    print(f"{model_name}, batch {len(batch[1])}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{'bare loop setting':<42}{'img/s':>8}{'vs fp32':>9}{'warm-up s':>11}")
    baseline = None
    for name, options in VARIANTS.items():
        speed = bare_loop(model_name, batch, steps, warmup, **options)
        baseline = baseline or speed
        print(f"{name:<42}{speed:>8.1f}{speed / baseline:>9.2f}{bare_loop.warmup_seconds:>11.1f}", flush=True)


def engine_loop(model_name: str, batch: tuple[torch.Tensor, torch.Tensor], steps: int, warmup: int,
                channels_last: bool = False, amp: bool = False, compile: bool = False, device: torch.device = CPU
                ) -> float:
    """Our trainer and its per-iteration handlers (LR schedule, stop checks, progress, TensorBoard)."""
    model, optimizer, loss_fn = setup(model_name, device)
    model, batch = prepared(model, batch, device, channels_last, compile)
    precision = engines.choose_precision(device, amp)
    trainer = engines.create_trainer(model, optimizer, loss_fn, lambda b, i: b, precision,
                                     engines.make_grad_scaler(precision))
    total = (steps + warmup) * 10
    trainer.add_event_handler(Events.ITERATION_STARTED, engines.create_lr_scheduler(optimizer, 0.01, 5, total))
    faults.attach_stop_checks(trainer, faults.StopRequest(), lambda engine: None, Path(tempfile.gettempdir()))
    tracking.attach_progress_logging(trainer, optimizer, 15, len(batch[1]), 1)
    with tempfile.TemporaryDirectory() as folder:
        recorder = tracking.Recorder(Path(folder))  # TensorBoard and metrics.jsonl, as in a run
        recorder.attach_training(trainer, optimizer, 15, len(batch[1]))
        trainer.run([batch] * warmup, max_epochs=1)
        start = time.perf_counter()
        state = trainer.run([batch] * steps, max_epochs=1)
        seconds = time.perf_counter() - start
        recorder.close()
        engine_loop.last = {"steps": state.iteration, "seconds": seconds,
                            "recorded": (Path(folder) / "metrics.jsonl").read_text().count('"event": "epoch"')}
    return state.iteration * len(batch[1]) / seconds


def conventional_pipeline(model_name: str, data_path: str, batch_size: int, steps: int, warmup: int) -> float:
    """torchvision CIFAR10 with PIL transforms per image in a 2-worker DataLoader, then the same step."""
    import torchvision
    from torchvision import transforms as T

    class UncheckedCIFAR10(torchvision.datasets.CIFAR10):
        def _check_integrity(self) -> bool:  # our copy is JPEG re-encoded: md5s differ by design
            return True

        def _load_meta(self) -> None:
            self.classes = list(data.CLASSES)

    transform = T.Compose([T.Pad(4), T.RandomCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(data.MEAN, data.STD)])
    dataset = UncheckedCIFAR10(data_path, train=True, transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2, drop_last=True)
    step = make_step(*setup(model_name))
    batches = iter(loader)
    for _ in range(warmup):
        step(*next(batches))
    start = time.perf_counter()
    for _ in range(steps):
        step(*next(batches))
    return steps * batch_size / (time.perf_counter() - start)


def full_epoch(data_path: str, model_name: str, batch_size: int, launch: list[str]) -> dict[str, float]:
    """One real epoch through the CLI; epoch and evaluation times parsed from its log."""
    with tempfile.TemporaryDirectory() as output:
        command = [sys.executable, "-m", "cifar10_dist", "run", f"--data_path={data_path}", f"--model={model_name}",
                   f"--batch_size={batch_size}", "--num_epochs=1", "--num_warmup_epochs=0.2",
                   f"--output_path={output}", "--run_name=bench", *launch]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    log = result.stderr
    epoch_seconds = float(re.search(r"epoch 1 done in ([0-9.]+) s", log).group(1))
    train_eval = float(re.search(r"train_subset: .* on \d+ images \(([0-9.]+) s\)", log).group(1))
    test_eval = float(re.search(r"epoch 1 test: .* on (\d+) images \(([0-9.]+) s\)", log).group(2))
    test_count = int(re.search(r"epoch 1 test: .* on (\d+) images", log).group(1))
    iterations = int(re.search(r"iter \d+/(\d+)", log).group(1))
    memory = re.search(r"peak resident memory ([0-9.]+) MiB", log)
    return {
        "epoch_seconds": epoch_seconds,
        "images_per_second": iterations * batch_size / epoch_seconds,
        "eval_seconds": train_eval + test_eval,
        "eval_images_per_second": test_count / test_eval,
        "peak_rss_mib": float(memory.group(1)) if memory else float("nan"),
    }


def flops_per_image(model_name: str) -> float:
    """FLOPs of one training step (forward + backward) per image, counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    model, _, loss_fn = setup(model_name)
    inputs, targets = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(inputs), targets).backward()
    return counter.get_total_flops() / 8


def print_profile(model_name: str, batch: tuple[torch.Tensor, torch.Tensor], steps: int, channels_last: bool,
                  amp: bool) -> None:
    """Where a training step's time goes: operators by self CPU time over ``steps`` steps (after 2 warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    model, optimizer, loss_fn = setup(model_name)
    inputs, targets = batch
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    step = make_step(model, optimizer, loss_fn, amp)
    for _ in range(2):
        step(inputs, targets)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            step(inputs, targets)
    print(f"{model_name}, batch {len(targets)}, channels_last={channels_last}, bf16 autocast={amp}, {steps} steps")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def tiny_linear() -> nn.Module:
    """A model whose training step costs microseconds (--overhead): only the framework around it shows."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))


OVERHEAD_BATCH = 8


def bare_overhead_loop(iterations: int) -> float:
    """Seconds of a bare PyTorch loop over in-memory uint8 images: shuffled batches of 8, normalised, one SGD
    step each, the loss never read (what a careful hand-written loop does; the measure of --overhead)."""
    torch.manual_seed(0)
    train, _ = data.make_synthetic(OVERHEAD_BATCH * iterations, 1, 0)
    model = tiny_linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(train.labels))
    start = time.perf_counter()
    for index in range(iterations):
        chosen = order[index * OVERHEAD_BATCH:(index + 1) * OVERHEAD_BATCH]
        inputs, targets = augmentation.normalize(train.images[chosen]), train.labels[chosen]
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def our_overhead_run(iterations: int, profiler: Any = None) -> float:
    """Seconds of the training epoch of a real run (api.train in this process, the default handlers: LR schedule,
    stop and NaN checks, checkpoints every 200 iterations, progress and TensorBoard/metrics.jsonl every 15) with
    the same model, batch and data, no augmentation; ``profiler`` (Ignite's HandlersTimeProfiler) is attached
    to its trainer when given."""
    from cifar10_dist import api, reports, training

    setup_engines = training.setup_engines

    def with_profiler(*args: Any, **kwargs: Any) -> Any:
        engine_set = setup_engines(*args, **kwargs)
        profiler.attach(engine_set.trainer)
        return engine_set

    with tempfile.TemporaryDirectory() as output:
        config = api.resolve(None, dataset="synthetic", synthetic_size=OVERHEAD_BATCH * iterations,
                             model=f"{Path(__file__).resolve()}:tiny_linear", batch_size=OVERHEAD_BATCH,
                             num_epochs=1, num_warmup_epochs=0.1, num_workers=0, data_on_device=True,
                             train_eval_size=0, crop_padding=0, flip="none", output_path=output, run_name="overhead")
        training.setup_engines = with_profiler if profiler is not None else setup_engines
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                result = api.train(config)
        finally:
            training.setup_engines = setup_engines
        epochs, _ = reports.read_metrics(Path(result.run_dir))
    return epochs[-1]["epoch_time"]


def measure_overhead(rounds: int, short: int, long: int) -> dict[str, Any]:
    """Microseconds per iteration of the bare loop and of our run, from the difference between a long and a short
    run (start-up and warm-up cancel out), in ``rounds`` interleaved rounds after one unrecorded warm-up round
    (the first runs of a process pay its one-time costs); medians and ranges."""
    bare_overhead_loop(short), our_overhead_run(short)
    per_iteration: dict[str, list[float]] = {"bare": [], "ours": []}
    for round_index in range(rounds):
        for name, run in (("bare", bare_overhead_loop), ("ours", our_overhead_run)):
            seconds = run(long) - run(short)
            per_iteration[name].append(seconds / (long - short) * 1e6)
        print(f"round {round_index + 1}: bare {per_iteration['bare'][-1]:.1f} us, ours {per_iteration['ours'][-1]:.1f} "
              f"us per iteration", flush=True)
    above = [ours - bare for bare, ours in zip(per_iteration["bare"], per_iteration["ours"])]
    return {"bare_us": statistics.median(per_iteration["bare"]), "ours_us": statistics.median(per_iteration["ours"]),
            "above_bare_us": statistics.median(above), "above_bare_range_us": [min(above), max(above)],
            "rounds": per_iteration, "short": short, "long": long}


def handler_costs(iterations: int) -> dict[str, float]:
    """Microseconds per iteration of each per-iteration handler of our trainer, of the step and of the data,
    from Ignite's HandlersTimeProfiler in one run (the profiler's own cost is not in these numbers)."""
    from ignite.handlers import HandlersTimeProfiler

    profiler = HandlersTimeProfiler()
    our_overhead_run(iterations, profiler)
    costs: dict[str, float] = {}
    for event, handlers in profiler.event_handlers_times.items():
        if not str(getattr(event, "name", event)).startswith(("ITERATION", "GET_BATCH")):
            continue  # epoch-level handlers (validation, epoch logs): not a per-iteration cost
        for name, times in handlers.items():
            costs[name] = costs.get(name, 0.0) + sum(times) / iterations * 1e6
    costs["(the step: batch preparation, forward, backward, optimizer)"] = sum(profiler.processing_times) / iterations * 1e6
    costs["(the data: the next batch from the loader)"] = sum(profiler.dataflow_times) / iterations * 1e6
    return dict(sorted(costs.items(), key=lambda item: -item[1]))


def print_overhead(rounds: int, short: int, long: int, json_path: str | None) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # our run keeps it (else it takes a thread per core)
    torch.set_num_threads(1)
    print(f"per-iteration cost of our trainer over a bare loop: a linear model, batch {OVERHEAD_BATCH}, 1 thread, "
          f"runs of {short} and {long} iterations, {rounds} interleaved rounds; torch {torch.__version__}; "
          f"{hardware.one_line()}")
    measured = measure_overhead(rounds, short, long)
    costs = handler_costs(long)
    print(f"{'median per iteration':<60}{'us':>10}")
    for key, label in (("bare_us", "bare loop"), ("ours_us", "our run (default handlers)"),
                       ("above_bare_us", "ours above the bare loop")):
        print(f"{label:<60}{measured[key]:>10.1f}")
    low, high = measured["above_bare_range_us"]
    print(f"{'  range over the rounds':<60}{f'{low:.0f}..{high:.0f}':>10}")
    print(f"\n{'handler (one profiled run of ' + str(long) + ' iterations)':<60}{'us/iter':>10}")
    for name, micros in costs.items():
        print(f"{name[:59]:<60}{micros:>10.1f}")
    if json_path:
        Path(json_path).write_text(json.dumps({"overhead": measured, "handlers_us": costs, "torch": torch.__version__,
                                               "hardware": hardware.describe(CPU)}, indent=2) + "\n")


def print_loops(model_name: str, batch: tuple[torch.Tensor, torch.Tensor], steps: int, warmup: int,
                rounds: int) -> None:
    """Our trainer against the bare loop on the same batches, in interleaved rounds: the ratio of each round."""
    print(f"{model_name}, batch {len(batch[1])}, {steps} steps after {warmup}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; {hardware.one_line()}")
    ratios = []
    for round_index in range(rounds):
        bare, engine = bare_loop(model_name, batch, steps, warmup), engine_loop(model_name, batch, steps, warmup)
        ratios.append(engine / bare)
        print(f"round {round_index + 1}: bare {bare:.1f} img/s, trainer {engine:.1f} img/s, trainer/bare "
              f"{ratios[-1]:.3f}", flush=True)
    print(f"trainer/bare: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}..{max(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path")
    parser.add_argument("--variants", action="store_true", help="only the bare loop in each speed setting")
    parser.add_argument("--profile", action="store_true", help="only a profile of bare training steps")
    parser.add_argument("--overhead", action="store_true",
                        help="only the per-iteration cost of our trainer over a bare loop, and of each handler")
    parser.add_argument("--loops", action="store_true",
                        help="only the bare loop and our trainer (1. and 2.) in --rounds interleaved rounds")
    parser.add_argument("--rounds", type=int, default=5, help="with --overhead or --loops: interleaved rounds")
    parser.add_argument("--short", type=int, default=300, help="with --overhead: iterations of the short runs")
    parser.add_argument("--long", type=int, default=1800, help="with --overhead: iterations of the long runs")
    parser.add_argument("--amp", action="store_true", help="with --profile: bf16 autocast")
    parser.add_argument("--channels_last", action="store_true", help="with --profile: channels_last")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch_size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--default_allocator", action="store_true",
                        help="leave glibc's allocator as it is (runs apply keep_freed_memory on CPU, so this process "
                             "does too unless told not to)")
    args = parser.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    if not args.default_allocator and launch.keep_freed_memory():
        print("keep_freed_memory: on in this process, as in a run (--default_allocator leaves it off)")

    batch = (torch.randn(args.batch_size, 3, 32, 32), torch.randint(0, 10, (args.batch_size,)))
    if args.variants:
        print_variants(args.model, batch, args.steps, args.warmup)
        return
    if args.overhead:
        print_overhead(args.rounds, args.short, args.long, args.json_path)
        return
    if args.loops:
        print_loops(args.model, batch, args.steps, args.warmup, args.rounds)
        return
    if args.profile:
        print_profile(args.model, batch, args.steps, args.channels_last, args.amp)
        return
    if not args.data_path:
        parser.error("--data_path is required (except with --variants)")
    results: dict[str, float] = {}
    results["bare_loop"] = bare_loop(args.model, batch, args.steps, args.warmup)
    results["engine"] = engine_loop(args.model, batch, args.steps, args.warmup)
    one = full_epoch(args.data_path, args.model, args.batch_size, [])
    two = full_epoch(args.data_path, args.model, args.batch_size, ["--backend=gloo", "--nproc_per_node=2"])
    results["epoch_1_process"] = one["images_per_second"]
    results["epoch_2_gloo_processes"] = two["images_per_second"]
    results["conventional_pipeline"] = conventional_pipeline(
        args.model, args.data_path, args.batch_size, args.steps, args.warmup
    )
    results["evaluation"] = one["eval_images_per_second"]
    flops = flops_per_image(args.model)
    ratios = {
        "engine_over_bare": results["engine"] / results["bare_loop"],
        "epoch_over_engine": results["epoch_1_process"] / results["engine"],
        "two_procs_over_one": results["epoch_2_gloo_processes"] / results["epoch_1_process"],
        "eval_fraction": one["eval_seconds"] / one["epoch_seconds"],
    }
    labels = {
        "bare_loop": "1. bare PyTorch loop, pre-made tensors",
        "engine": "2. our trainer + handlers, same tensors",
        "epoch_1_process": "3. full epoch, 1 process",
        "epoch_2_gloo_processes": "4. full epoch, 2 gloo processes",
        "conventional_pipeline": "5. torchvision CIFAR10 + PIL, 2 workers",
        "evaluation": "6. evaluation (test set)",
    }
    print(f"{args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{'measurement':<44}{'img/s':>10}")
    for key, label in labels.items():
        print(f"{label:<44}{results[key]:>10.1f}")
    for key, value in ratios.items():
        print(f"{key:<44}{value:>10.3f}")
    print(f"{'training FLOPs per image (GFLOP)':<44}{flops / 1e9:>10.3f}")
    print(f"{'achieved GFLOP/s, bare loop':<44}{flops * results['bare_loop'] / 1e9:>10.1f}")
    print(f"{'peak RSS, 1 process (MiB)':<44}{one['peak_rss_mib']:>10.0f}")
    print(f"{'peak RSS, rank 0 of 2 (MiB)':<44}{two['peak_rss_mib']:>10.0f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "images_per_second": results, **ratios, "flops_per_image": flops,
            "peak_rss_mib": {"1_process": one["peak_rss_mib"], "2_processes_rank0": two["peak_rss_mib"]},
            "eval_seconds": one["eval_seconds"], "epoch_seconds": one["epoch_seconds"],
        }, indent=2))


if __name__ == "__main__":
    main()

"""Throughput, images per second, in one invocation on this machine: (1) a bare PyTorch loop on pre-made tensors,
(2) our trainer with its handlers on the same tensors, (3) a full epoch of a real run on real data, 1 process,
(4) the same with 2 gloo processes, (5) torchvision's CIFAR10 + PIL transforms in a 2-worker DataLoader with the
same step, (6) evaluation; FLOPs per image and peak memory. One run of each; ResNet-18, batch 512 takes about
10 minutes on 2 cores. Figures: docs/measured.md, "The throughput benchmark" and "Against a bare loop on a real
model" (--loops: about 4 minutes).

    python -m benchmarks.throughput --data_path=DIR [--model=resnet18] [--batch_size=512] [--steps=10] [--json=PATH]
    --variants   only the bare loop in each speed setting (fp32, channels_last, bf16 autocast with and without
                 channels_last, torch.compile alone and on top of both, with its warm-up time)
    --profile    [--amp] [--channels_last]: torch.profiler's top operators of a few bare training steps
    --loops      [--rounds=5]: our trainer against the bare loop, interleaved, the ratio of each round
The process applies reuse_freed_memory as a run does (--default_allocator leaves glibc alone).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import records, runner
from benchmarks.steps import Batch, bare_loop, engine_loop, flops_per_image, make_step, setup
from cifar10_dist.data import cifar
from cifar10_dist.data.datasets import MEAN, STD
from cifar10_dist.system import cpu, hardware

VARIANTS = {
    "fp32": {},
    "channels_last": {"channels_last": True},
    "bf16 autocast": {"amp": True},
    "bf16 autocast + channels_last": {"amp": True, "channels_last": True},
    "torch.compile": {"compile": True},
    "bf16 autocast + channels_last + compile": {"amp": True, "channels_last": True, "compile": True},
}


def print_variants(model_name: str, batch: Batch, steps: int, warmup: int) -> None:
    print(
        f"{model_name}, batch {len(batch[1])}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"{hardware.one_line()}"
    )
    print(f"{'bare loop setting':<42}{'img/s':>8}{'vs fp32':>9}{'warm-up s':>11}")
    baseline = None
    for name, options in VARIANTS.items():
        timed = bare_loop(model_name, batch, steps, warmup, **options)
        baseline = baseline or timed.images_per_second
        print(
            f"{name:<42}{timed.images_per_second:>8.1f}{timed.images_per_second / baseline:>9.2f}"
            f"{timed.warmup_seconds:>11.1f}",
            flush=True,
        )


def conventional_pipeline(model_name: str, data_path: str, batch_size: int, steps: int, warmup: int) -> float:
    """torchvision CIFAR10 with PIL transforms per image in a 2-worker DataLoader, then the same step."""
    import torchvision
    from torchvision import transforms as T

    class UncheckedCIFAR10(torchvision.datasets.CIFAR10):
        def _check_integrity(self) -> bool:  # our copy is JPEG re-encoded: md5s differ by design
            return True

        def _load_meta(self) -> None:
            self.classes = list(cifar.CLASSES)

    transform = T.Compose([T.Pad(4), T.RandomCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
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


def full_epoch(data_path: str, model_name: str, batch_size: int, **launch_options: object) -> dict[str, float]:
    """One real epoch of a run (benchmarks.runner): its training speed, evaluation time and speed, peak memory."""
    with tempfile.TemporaryDirectory() as output:
        run = runner.train_ours(
            Path(output),
            data_path=data_path,
            model=model_name,
            batch_size=batch_size,
            num_epochs=1,
            num_warmup_epochs=0.2,
            **launch_options,
        )
    test = next(row for row in run.evaluations if row["split"] == "test")
    return {
        "epoch_seconds": run.epochs[-1]["epoch_time"],
        "images_per_second": run.epochs[-1]["images_per_second"],
        "eval_seconds": run.evaluation_seconds(),
        "eval_images_per_second": test["num_samples"] / test["duration"],
        "peak_rss_mib": run.peak_rss_mib,
    }


def print_profile(model_name: str, batch: Batch, steps: int, channels_last: bool, amp: bool) -> None:
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


def print_loops(model_name: str, batch: Batch, steps: int, warmup: int, rounds: int) -> None:
    """Our trainer against the bare loop on the same batches, in interleaved rounds: the ratio of each round."""
    print(
        f"{model_name}, batch {len(batch[1])}, {steps} steps after {warmup}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; {hardware.one_line()}"
    )
    ratios = []
    for round_index in range(rounds):
        bare = bare_loop(model_name, batch, steps, warmup).images_per_second
        engine = engine_loop(model_name, batch, steps, warmup).images_per_second
        ratios.append(engine / bare)
        print(
            f"round {round_index + 1}: bare {bare:.1f} img/s, trainer {engine:.1f} img/s, trainer/bare "
            f"{ratios[-1]:.3f}",
            flush=True,
        )
    print(f"trainer/bare: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}..{max(ratios):.3f}")


LABELS = {
    "bare_loop": "1. bare PyTorch loop, pre-made tensors",
    "engine": "2. our trainer + handlers, same tensors",
    "epoch_1_process": "3. full epoch, 1 process",
    "epoch_2_gloo_processes": "4. full epoch, 2 gloo processes",
    "conventional_pipeline": "5. torchvision CIFAR10 + PIL, 2 workers",
    "evaluation": "6. evaluation (test set)",
}


def print_table(args: argparse.Namespace, batch: Batch) -> None:
    results = {
        "bare_loop": bare_loop(args.model, batch, args.steps, args.warmup).images_per_second,
        "engine": engine_loop(args.model, batch, args.steps, args.warmup).images_per_second,
    }
    one = full_epoch(args.data_path, args.model, args.batch_size)
    two = full_epoch(args.data_path, args.model, args.batch_size, backend="gloo", nproc_per_node=2)
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
    print(f"{args.model}, batch {args.batch_size}, {records.machine()}, torch {torch.__version__}")
    print(f"{'measurement':<44}{'img/s':>10}")
    for key, label in LABELS.items():
        print(f"{label:<44}{results[key]:>10.1f}")
    for key, value in ratios.items():
        print(f"{key:<44}{value:>10.3f}")
    print(f"{'training FLOPs per image (GFLOP)':<44}{flops / 1e9:>10.3f}")
    print(f"{'achieved GFLOP/s, bare loop':<44}{flops * results['bare_loop'] / 1e9:>10.1f}")
    print(f"{'peak RSS, 1 process (MiB)':<44}{one['peak_rss_mib']:>10.0f}")
    print(f"{'peak RSS, largest of 2 processes (MiB)':<44}{two['peak_rss_mib']:>10.0f}")
    if args.json_path:
        records.write(
            args.json_path,
            {
                "images_per_second": results,
                **ratios,
                "flops_per_image": flops,
                "peak_rss_mib": {"1_process": one["peak_rss_mib"], "2_processes_largest": two["peak_rss_mib"]},
                "eval_seconds": one["eval_seconds"],
                "epoch_seconds": one["epoch_seconds"],
                "hardware": records.hardware_record(),
                "commit": records.commit(),
                "torch": torch.__version__,
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", help="folder holding cifar-10-batches-py (the full table)")
    parser.add_argument("--variants", action="store_true", help="only the bare loop in each speed setting")
    parser.add_argument("--profile", action="store_true", help="only a profile of bare training steps")
    parser.add_argument("--loops", action="store_true", help="only the bare loop and our trainer, --rounds rounds")
    parser.add_argument("--rounds", type=int, default=5, help="with --loops: interleaved rounds")
    parser.add_argument("--amp", action="store_true", help="with --profile: bf16 autocast")
    parser.add_argument("--channels_last", action="store_true", help="with --profile: channels_last")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch_size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument(
        "--default_allocator",
        action="store_true",
        help="leave glibc's allocator as it is (runs apply reuse_freed_memory on CPU, so this process "
        "does too unless told not to)",
    )
    args = parser.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    if not args.default_allocator and cpu.keep_freed_memory():
        print("reuse_freed_memory: on in this process, as in a run (--default_allocator leaves it off)")
    batch = (torch.randn(args.batch_size, 3, 32, 32), torch.randint(0, 10, (args.batch_size,)))
    if args.variants:
        print_variants(args.model, batch, args.steps, args.warmup)
    elif args.loops:
        print_loops(args.model, batch, args.steps, args.warmup, args.rounds)
    elif args.profile:
        print_profile(args.model, batch, args.steps, args.channels_last, args.amp)
    elif not args.data_path:
        parser.error("--data_path is required (except with --variants, --loops or --profile)")
    else:
        print_table(args, batch)


if __name__ == "__main__":
    main()

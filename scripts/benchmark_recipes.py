"""Recipe benchmark, run by hand: airbench94's own code next to our configs/fast.yaml and configs/fast_muon.yaml,
trained to the end on the same data and machine; prints a table and appends every run to a JSON file.

Entries (--only chooses, in this order):
  peer  Keller Jordan's airbench94 from PyPI (airbench==0.1.8): its own train94, run in a subprocess in a folder
        where its CifarLoader finds cifar10/train.pt and test.pt written from our data. On a CPU it is adapted at
        run time, without changing its code: .cuda()/.half() become no-ops (fp32 weights), torch.cuda.Event becomes
        a CPU timer, and its network's forward runs under bf16 autocast where the CPU has native bf16 (AMX or
        AVX512-BF16), in fp32 elsewhere (as our recipes' with_amp=auto does on a CPU). Its process
        keeps freed memory as ours do (glibc's MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_; keep_freed_memory).
  fast  python -m cifar10_dist run --config=configs/fast.yaml
  muon  python -m cifar10_dist run --config=configs/fast_muon.yaml
  muon7 the same cut to 7 epochs (--num_epochs=7 --validate_every=7): a candidate for the 0.7x time goal
Each is run --seeds times (seed --first_seed, then the next ones). Training seconds are each recipe's own count
of its training steps (airbench: its timers around the epochs and the whitening init; ours: summary.json's training_time); "outside"
is the rest of the wall time: start-up, data preparation, whitening, evaluation (split in the JSON).
Every run is appended to --json at once (the peer alone takes about 45 minutes on 2 CPU cores), so a table can
be built from runs made in several invocations; training-time ratios are only taken between runs of the same
invocation (this machine's speed drifts up to 2x between hours).

Usage: python scripts/benchmark_recipes.py --data_path=DIR [--only=peer,fast,muon,muon7] [--seeds=3] [--first_seed=0]
       [--json=benchmark_recipes.json] [--device=cpu|cuda] [--quick] [--table]
--quick trains every entry for a few steps (checks the script); --table only prints the table of the JSON.
--per_step [--batch_size=1024 --steps=5 --rounds=4]: only seconds per bare training step of the peer's network and
ours on the CPU, interleaved in rounds (do the networks themselves differ in speed?).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cifar10_dist import data, launch  # noqa: E402

PEER = "airbench==0.1.8"
# entry: (config, flags on top of it)
OURS = {"fast": ("fast.yaml", []), "muon": ("fast_muon.yaml", []),
        "muon7": ("fast_muon.yaml", ["--num_epochs=7", "--validate_every=7"])}
ENTRIES = ("peer", *OURS)
QUICK_OURS = ["--num_epochs=2", "--epoch_length=2", "--tta=0", "--num_warmup_epochs=0"]
QUICK_PEER_EPOCHS = 0.01  # a few steps of train94
# the peer's process gets the glibc setting our runs make themselves (keep_freed_memory, on by default), so that
# times compare recipes, not allocators (it makes both about 1.1x faster at batch 1024 on this machine)
KEEP_FREED = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(launch.NEVER_TRIM)}


# ---------------------------------------------------------------- the peer


def write_peer_data(data_path: str, folder: Path) -> None:
    """Our CIFAR-10 files as airbench's cifar10/train.pt and test.pt (uint8 NHWC images, labels, classes)."""
    _, train_set, test_set = data.read_dataset("cifar10", Path(data_path))
    (folder / "cifar10").mkdir()
    for name, images in (("train", train_set), ("test", test_set)):
        torch.save({"images": torch.as_tensor(images.images).permute(0, 2, 3, 1).contiguous(),
                    "labels": torch.as_tensor(images.labels), "classes": list(data.CLASSES)},
                   folder / "cifar10" / f"{name}.pt")


class CpuTimer:
    """Stands in for torch.cuda.Event(enable_timing=True) on a CPU: record() takes the time, elapsed_time is in ms."""

    def __init__(self, **_: Any) -> None:
        self.moment = 0.0

    def record(self) -> None:
        self.moment = time.perf_counter()

    def elapsed_time(self, end: CpuTimer) -> float:
        return 1000 * (end.moment - self.moment)


def adapt_to_cpu() -> None:
    """Make airbench's CUDA-only code run on the CPU, changing torch's behaviour in this process only."""
    load = torch.load
    torch.load = lambda *args, **kwargs: load(*args, **{**kwargs, "map_location": "cpu"})
    torch.cuda.Event = CpuTimer
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.half = lambda self: self  # fp32 weights; autocast computes in bf16
    torch.Tensor.half = lambda self, *args, **kwargs: self.float()


def with_bf16_forward(net: torch.nn.Module) -> torch.nn.Module:
    """The network computing its forward under CPU bf16 autocast and returning fp32 logits, as autocast does for
    our recipes, where this CPU has native bf16 (else unchanged, fp32, as with_amp=auto trains ours); everything
    else (the whitening init's covariance and eigendecomposition, the optimizer) stays fp32. Autocast around the
    whole of train94 would compute the patch covariance in bf16: its eigenvalues go negative and the run is NaN
    from the first step."""
    from cifar10_dist import hardware

    if not hardware.native_bf16_cpu():
        return net
    forward = net.forward

    def autocast_forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*args, **kwargs).float()

    net.forward = autocast_forward
    return net


def peer_worker(device: str, seed: int, epochs: float | None) -> None:
    """In the subprocess (cwd holds cifar10/): airbench94's train94, printing its table."""
    import airbench
    from airbench import lib_airbench94

    torch.manual_seed(seed)
    options = {} if epochs is None else {"epochs": epochs}
    if device == "cpu":
        adapt_to_cpu()
        airbench.train94(make_net=lambda: with_bf16_forward(lib_airbench94.make_net94()), **options)
    else:
        airbench.warmup94()
        airbench.train94(**options)


def parse_peer_table(text: str) -> dict[str, Any]:
    """airbench's rows: | run | epoch | train_loss | train_acc | val_acc | tta_val_acc | total_time_seconds |;
    the epoch rows' time counts the whitening init and training, the eval row's adds the TTA evaluation."""
    curve, final = [], None
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[1] in ("epoch", ""):
            continue
        if cells[1] == "eval":
            final = {"accuracy": float(cells[5]), "seconds_with_tta": float(cells[6]), "train_loss": float(cells[2])}
        elif cells[4]:
            curve.append((float(cells[6]), float(cells[4])))
    if final is None or not curve:
        raise ValueError("airbench printed no epoch or final (eval) row")
    return {"accuracy": final["accuracy"], "accuracy_without_tta": curve[-1][1], "train_loss": final["train_loss"],
            "training_seconds": curve[-1][0],
            "tta_seconds": final["seconds_with_tta"] - curve[-1][0], "curve": curve}


def run_peer(data_path: str, device: str, seed: int, quick: bool) -> dict[str, Any]:
    if importlib.util.find_spec("airbench") is None:
        raise SystemExit(f"the peer needs the airbench package: pip install 'cifar10-dist[bench]' ({PEER}, or its "
                         "sdist offline)")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        write_peer_data(data_path, Path(folder))
        command = [sys.executable, str(Path(__file__).resolve()), "--peer_worker", f"--device={device}",
                   f"--peer_seed={seed}", *([f"--peer_epochs={QUICK_PEER_EPOCHS}"] if quick else [])]
        result = subprocess.run(command, cwd=folder, capture_output=True, text=True, env={**os.environ, **KEEP_FREED})
    if result.returncode != 0:
        raise SystemExit(f"airbench94 failed: {result.stderr.strip()[-2000:]}")
    peer = parse_peer_table(result.stdout)
    wall = time.perf_counter() - started
    # airbench evaluates without TTA after every epoch, outside its timers: that is in "other" here
    outside = {"tta_evaluation": peer["tta_seconds"], "other": wall - peer["training_seconds"] - peer["tta_seconds"]}
    return {**peer, "wall_seconds": wall, "outside": outside, "environment": KEEP_FREED}


# ---------------------------------------------------------------- one training step: the peer's network and ours


def _bare_step(net: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> Callable[[], float]:
    trained = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trained, lr=0.01, momentum=0.85, nesterov=True)

    def step() -> float:
        loss = torch.nn.functional.cross_entropy(net(inputs), targets, label_smoothing=0.2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def per_step_table(batch_size: int, steps: int, rounds: int) -> str:
    """Seconds per bare training step of airbench94's network (the package's make_net94) and of ours, on the
    CPU: the same batch, Nesterov SGD and label-smoothed loss, both under with_bf16_forward and in channels_last,
    interleaved in rounds. Tells whether the networks differ in speed, apart from the trainers around them.
    Adapts torch in this process to the peer (adapt_to_cpu): run it on its own."""
    from airbench import lib_airbench94

    from cifar10_dist import models

    adapt_to_cpu()
    torch.manual_seed(0)
    inputs = torch.randn(batch_size, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    targets = torch.randint(0, 10, (batch_size,))
    nets = {"peer: airbench make_net94": lib_airbench94.make_net94(),
            "ours: models.AirbenchNet": models.AirbenchNet().to(memory_format=torch.channels_last)}
    steppers = {name: _bare_step(with_bf16_forward(net), inputs, targets) for name, net in nets.items()}
    seconds: dict[str, list[float]] = {name: [] for name in nets}
    for step in steppers.values():
        step(), step()  # warm-up
    for _ in range(rounds):
        for name, step in steppers.items():
            started = time.perf_counter()
            for _ in range(steps):
                step()
            seconds[name].append((time.perf_counter() - started) / steps)
    peer = statistics.median(seconds["peer: airbench make_net94"])
    lines = [f"batch {batch_size}, {steps} steps x {rounds} interleaved rounds, {machine()}, torch {torch.__version__}",
             f"{'network':<28}{'s/step':>8}  {'range':<13}{'img/s':>7}{'vs peer':>9}"]
    for name, values in seconds.items():
        median = statistics.median(values)
        lines.append(f"{name:<28}{median:>8.3f}  {min(values):.3f}-{max(values):.3f}  {batch_size / median:>7.0f}"
                     f"{median / peer:>9.3f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- ours


def cli_run(flags: list[str], output: Path, device: str) -> tuple[str, Path]:
    """``python -m cifar10_dist run FLAGS`` into output/bench on the device (CUDA_VISIBLE_DEVICES hides the GPUs
    for cpu); its log (stderr) and run folder."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-m", "cifar10_dist", "run", *flags, f"--output_path={output}",
                             "--run_name=bench"], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"benchmark run failed: {result.stderr.strip()[-2000:]}")
    return result.stderr, output / "bench"


def run_ours(entry: str, data_path: str, device: str, seed: int, quick: bool) -> dict[str, Any]:
    """One run of our recipe through the CLI in a temporary folder; its summary and evaluation times."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as output:
        config, overrides = OURS[entry]
        flags = [f"--config={REPO / 'configs' / config}", *overrides, f"--data_path={data_path}", "--download=False",
                 f"--seed={seed}", *(QUICK_OURS if quick else [])]
        _, run_dir = cli_run(flags, Path(output), device)
        summary = json.loads((run_dir / "summary.json").read_text())
        events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    wall = time.perf_counter() - started
    evaluation = sum(event["duration"] for event in events if event["event"] == "evaluation")
    outside = {"evaluation": evaluation, "in_process_other": summary["total_time"] - summary["training_time"] - evaluation,
               "process_start_and_exit": wall - summary["total_time"]}
    return {"accuracy": summary["final"]["test"]["accuracy"], "training_seconds": summary["training_time"],
            "wall_seconds": wall, "outside": outside, "precision": summary.get("precision")}


# ---------------------------------------------------------------- the table


def machine() -> str:
    """The machine in a few words: the GPU, or the CPU with its kernels and native bf16, and torch's threads."""
    from cifar10_dist import hardware

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return f"{hardware.one_line(device)}, {torch.get_num_threads()} threads"


def hardware_record(device: str) -> dict[str, Any]:
    """The CPU (model, kernels, native bf16) and GPUs of this machine, as run folders record them."""
    from cifar10_dist import hardware

    return hardware.describe(torch.device(device))


def append_run(path: Path, record: dict[str, Any]) -> None:
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    runs.append(record)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    temporary.replace(path)


def table(runs: list[dict[str, Any]], quick: bool = False) -> str:
    """Per recipe: accuracy mean and std, training minutes, seconds outside training; then the training-time
    ratios of runs made in the same invocation, and whether each recipe's mean reaches the peer's. Runs made
    with --quick are left out, unless ``quick`` (then only they count)."""
    runs = [r for r in runs if r.get("quick", False) == quick]
    by_recipe = {name: [r for r in runs if r["recipe"] == name] for name in ENTRIES}
    by_seed = {name: list({r["seed"]: r["accuracy"] for r in chosen}.values()) for name, chosen in by_recipe.items()}
    lines = [f"{'recipe':<8}{'runs':>5}{'seeds':>6}{'accuracy':>10}{'std':>8}{'train min':>11}{'outside s':>11}  reaches"]
    peer_mean = _mean(by_seed["peer"])
    for name, chosen in by_recipe.items():
        if not chosen:
            continue
        accuracies = by_seed[name]  # a seed run again (the same accuracy: runs are deterministic) counts once
        std = statistics.stdev(accuracies) if len(accuracies) > 1 else float("nan")
        outside = _mean([sum(r["outside"].values()) for r in chosen])
        reaches = "-" if peer_mean is None or name == "peer" else ("peer" if _mean(accuracies) >= peer_mean else "no")
        lines.append(f"{name:<8}{len(chosen):>5}{len(accuracies):>6}{100 * _mean(accuracies):>9.2f}%{100 * std:>7.2f}%"
                     f"{_mean([r['training_seconds'] for r in chosen]) / 60:>11.1f}{outside:>11.0f}  {reaches}")
    lines.extend(same_invocation_ratios(runs))
    return "\n".join(lines)


def same_invocation_ratios(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for invocation in sorted({r["invocation"] for r in runs}):
        together = {name: _mean([r["training_seconds"] for r in runs if r["invocation"] == invocation
                                 and r["recipe"] == name]) for name in ENTRIES}
        pairs = [(a, b) for a in OURS for b in ("fast", "peer")
                 if a != b and together[a] is not None and together[b] is not None]
        if pairs:
            ratios = ", ".join(f"{a}/{b} {together[a] / together[b]:.2f}" for a, b in pairs)
            lines.append(f"training-time ratios in invocation {invocation}: {ratios}")
    return lines


def commit() -> str:
    """This checkout's commit (with + when it has changes), so runs of different code stay apart."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "") if head.returncode == 0 else "unknown"


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", help="folder holding cifar-10-batches-py")
    parser.add_argument("--only", default=",".join(ENTRIES), help="comma-separated entries: " + ", ".join(ENTRIES))
    parser.add_argument("--seeds", type=int, default=1, help="runs of each entry (seeds first_seed, first_seed+1, ...)")
    parser.add_argument("--first_seed", type=int, default=0, help="the first seed (to add seeds to an earlier JSON)")
    parser.add_argument("--json", dest="json_path", default="benchmark_recipes.json", help="runs are appended here")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="a few steps of every entry (checks the script)")
    parser.add_argument("--table", action="store_true", help="print the table of --json and exit")
    parser.add_argument("--per_step", action="store_true",
                        help="only seconds per bare training step of the peer's network and ours (CPU), interleaved")
    parser.add_argument("--batch_size", type=int, default=1024, help="with --per_step")
    parser.add_argument("--steps", type=int, default=5, help="with --per_step: steps per round")
    parser.add_argument("--rounds", type=int, default=4, help="with --per_step")
    parser.add_argument("--peer_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peer_seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--peer_epochs", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_worker:
        return peer_worker(args.device, args.peer_seed, args.peer_epochs)
    if args.per_step:
        print(per_step_table(args.batch_size, args.steps, args.rounds))
        return None
    path = Path(args.json_path)
    if args.table:
        print(table(json.loads(path.read_text())["runs"]))
        return None
    entries = [entry.strip() for entry in args.only.split(",") if entry.strip()]
    unknown = [entry for entry in entries if entry not in ENTRIES]
    if unknown or not entries or args.seeds < 1 or args.data_path is None:
        parser.error(f"--only={args.only} (entries: {', '.join(ENTRIES)}), --seeds >= 1 and --data_path are needed")
    invocation = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{machine()}, torch {torch.__version__}; runs appended to {path}", flush=True)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for entry in entries:
            run = run_peer if entry == "peer" else lambda *a: run_ours(entry, *a)
            result = run(args.data_path, args.device, seed, args.quick)
            record = {"recipe": entry, "seed": seed, "invocation": invocation, "commit": commit(), "machine": machine(),
                      "hardware": hardware_record(args.device), "torch": torch.__version__, "quick": args.quick,
                      **result}
            append_run(path, record)
            print(f"{entry} seed {seed}: accuracy {result['accuracy']:.4f}, training {result['training_seconds']:.0f} s,"
                  f" outside {sum(result['outside'].values()):.0f} s", flush=True)
    print(table(json.loads(path.read_text())["runs"], quick=args.quick))
    return None


if __name__ == "__main__":
    main()

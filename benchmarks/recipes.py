"""Recipes trained to the end: airbench94's own code (``peer``) next to our recipes on the same data and machine;
prints a table and appends every run to a JSON file. Last runs: Zen 5 EPYC, 2 cores, seeds 0-2
(docs/measurements/recipes_cpu_zen5.json): peer 90.64% +- 0.18, Muon 90.54% +- 0.13 (0.86x the peer's training
time), lean 90.02% +- 0.02 (0.52x); since the whitening bias's gradient is skipped after its epochs, seed 0: Muon
0.83x, lean 0.50x (whitening_frozen_zen5.json). A run of the peer takes about 9 minutes there, one of lean about 4.5.
Earlier, Zen 4 (recipes_cpu.json): fast 90.51% +- 0.09.

    python -m benchmarks.recipes --data_path=DIR [--only=peer,muon,lean] [--seeds=3] [--first_seed=0]
        [--json=benchmark_recipes.json] [--device=cpu|cuda] [--quick] [--table]
    --quick      every entry for a few steps (checks the tool); --table only prints the table of the JSON
    --per_step   [--batch_size=1024 --steps=5 --rounds=4 --per_step_json=FILE]: only seconds per bare training step of
                 the peer's network and ours (also with the whitening bias frozen) on the CPU, interleaved in rounds

Entries: peer (benchmarks.peer), fast (configs/fast.yaml), muon (configs/fast_muon.yaml), muon7, muon6, muon5 (the
same cut to 7, 6, 5 epochs), lean (configs/fast_lean.yaml) and its levers alone on fast_muon.yaml: resize (progressive
resizing), select (data selection); variants of lean: lean_lookahead (Lookahead), lean_ls009 (label smoothing 0.09,
the record's), lean_select10 (selection in all of 10 epochs), lean_record (the Muon lr, momentum and label smoothing
of hiverge's record), lean_silu (its SiLU), lean_jitter (its brightness and contrast jitter). The default runs peer,
muon and lean. Training seconds are each recipe's own count of its training steps (airbench: its timers around the
epochs and the whitening init; ours: summary.json's training_time); "outside" is the rest of the wall time: start-up,
data preparation, evaluation (split in the JSON). Training-time ratios are only taken between runs of the same
invocation (this machine's speed drifts up to 2x between hours).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks import peer, records, runner

CONFIGS = records.REPO / "configs"
# entry: (config, overrides on top of it)
OURS: dict[str, tuple[str, dict[str, Any]]] = {
    "fast": ("fast.yaml", {}),
    "muon": ("fast_muon.yaml", {}),
    "muon7": ("fast_muon.yaml", {"num_epochs": 7, "validate_every": 7}),
    # the same cut further: lean's time budget reached by fewer epochs alone, nothing resized or selected
    "muon6": ("fast_muon.yaml", {"num_epochs": 6, "validate_every": 6}),
    "muon5": ("fast_muon.yaml", {"num_epochs": 5, "validate_every": 5}),
    # each lever of configs/fast_lean.yaml alone on fast_muon.yaml (the ablation in docs/recipes.md), then together
    "resize": ("fast_muon.yaml", {"resize_start": 0.5, "resize_until": 0.75}),
    "select": ("fast_muon.yaml", {"select_hardest_fraction": 0.5, "select_hardest_until": 0.5}),
    "lean": ("fast_lean.yaml", {}),
    # variants of lean tried to close its gap to the peer (none did: docs/recipes.md)
    "lean_lookahead": ("fast_lean.yaml", {"periodic_averaging": True}),
    "lean_ls009": ("fast_lean.yaml", {"label_smoothing": 0.09}),
    "lean_select10": ("fast_lean.yaml", {"select_hardest_until": 1.0, "num_epochs": 10, "validate_every": 10}),
    # hiverge's cifar10_speedrun.py values that map onto our options: Muon lr 0.2 and momentum 0.65, smoothing 0.1
    "lean_record": ("fast_lean.yaml", {"muon_lr": 0.2, "muon_momentum": 0.65, "label_smoothing": 0.1}),
    # the record's network and augmentation changes: SiLU for GELU, brightness and contrast jitter of 0.15
    "lean_silu": ("fast_lean.yaml", {"model_kwargs": {"activation": "silu"}}),
    "lean_jitter": ("fast_lean.yaml", {"color_jitter": 0.15}),
}
ENTRIES = ("peer", *OURS)
PER_STEP_PEER = "peer: airbench make_net94"
QUICK_OURS = {"num_epochs": 2, "epoch_length": 2, "tta": 0, "num_warmup_epochs": 0}


def run_ours(entry: str, data_path: str, device: str, seed: int, quick: bool) -> dict[str, Any]:
    """One run of our recipe (benchmarks.runner) in a temporary folder: accuracy, training and outside seconds."""
    config, overrides = OURS[entry]
    with tempfile.TemporaryDirectory() as output:
        values = {**overrides, "data_path": data_path, "download": False, "seed": seed, **(QUICK_OURS if quick else {})}
        run = runner.train_ours(Path(output), CONFIGS / config, device, **values)
    summary = run.summary
    evaluation = run.evaluation_seconds()
    outside = {
        "evaluation": evaluation,
        "in_process_other": summary.total_time - summary.training_time - evaluation,
        "process_start_and_exit": run.wall_seconds - summary.total_time,
    }
    return {
        "accuracy": run.accuracy,
        "training_seconds": summary.training_time,
        "wall_seconds": run.wall_seconds,
        "outside": outside,
        "precision": summary.precision,
    }


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


def per_step_seconds(batch_size: int, steps: int, rounds: int) -> dict[str, Any]:
    """Seconds per bare training step of airbench94's network (the package's make_net94) and of ours, also in
    its phase after the whitening bias froze (``whitening_bias_frozen``: no gradient for it), on the CPU: the same
    batch, Nesterov SGD and label-smoothed loss, all under with_bf16_forward and in channels_last, interleaved in
    rounds. Adapts torch in this process to the peer (adapt_to_cpu): run it on its own."""
    from airbench import lib_airbench94

    from cifar10_dist import models

    peer.adapt_to_cpu()
    torch.manual_seed(0)
    inputs = torch.randn(batch_size, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    targets = torch.randint(0, 10, (batch_size,))
    frozen = models.AirbenchNet().to(memory_format=torch.channels_last)
    frozen.whitening_bias_frozen = True
    nets = {
        PER_STEP_PEER: lib_airbench94.make_net94(),
        "ours: models.AirbenchNet": models.AirbenchNet().to(memory_format=torch.channels_last),
        "ours, whitening bias frozen": frozen,
    }
    steppers = {name: _bare_step(peer.with_bf16_forward(net), inputs, targets) for name, net in nets.items()}
    seconds: dict[str, list[float]] = {name: [] for name in nets}
    for step in steppers.values():
        step(), step()  # warm-up
    for _ in range(rounds):
        for name, step in steppers.items():
            started = time.perf_counter()
            for _ in range(steps):
                step()
            seconds[name].append((time.perf_counter() - started) / steps)
    return {
        "batch_size": batch_size,
        "steps": steps,
        "rounds": rounds,
        "torch": torch.__version__,
        "rows": [
            {"network": name, "seconds": values, "median": statistics.median(values)}
            for name, values in seconds.items()
        ],
    }


def per_step_table(measured: dict[str, Any], machine: str) -> str:
    reference = next(row["median"] for row in measured["rows"] if row["network"] == PER_STEP_PEER)
    lines = [
        f"batch {measured['batch_size']}, {measured['steps']} steps x {measured['rounds']} interleaved rounds, "
        f"{machine}, torch {measured['torch']}",
        f"{'network':<30}{'s/step':>8}  {'range':<13}{'img/s':>7}{'vs peer':>9}",
    ]
    for row in measured["rows"]:
        values, median = row["seconds"], row["median"]
        lines.append(
            f"{row['network']:<30}{median:>8.3f}  {min(values):.3f}-{max(values):.3f}"
            f"{measured['batch_size'] / median:>7.0f}{median / reference:>9.3f}"
        )
    return "\n".join(lines)


def table(runs: list[dict[str, Any]], quick: bool = False) -> str:
    """Per recipe: accuracy mean and std, training minutes, seconds outside training; then the training-time
    ratios of runs made in the same invocation, and whether each recipe's mean reaches the peer's. Runs made
    with --quick are left out, unless ``quick`` (then only they count)."""
    runs = [r for r in runs if r.get("quick", False) == quick]
    by_recipe = {name: [r for r in runs if r["recipe"] == name] for name in ENTRIES}
    by_seed = {name: list({r["seed"]: r["accuracy"] for r in chosen}.values()) for name, chosen in by_recipe.items()}
    width = max(8, *(len(name) + 1 for name, chosen in by_recipe.items() if chosen))
    lines = [
        f"{'recipe':<{width}}{'runs':>5}{'seeds':>6}{'accuracy':>10}{'std':>8}{'train min':>11}{'outside s':>11}"
        "  reaches"
    ]
    peer_mean = _mean(by_seed["peer"])
    for name, chosen in by_recipe.items():
        if not chosen:
            continue
        accuracies = by_seed[name]  # a seed run again (the same accuracy: runs are deterministic) counts once
        std = f"{100 * statistics.stdev(accuracies):.2f}%" if len(accuracies) > 1 else "-"  # one seed: no spread
        outside = _mean([sum(r["outside"].values()) for r in chosen])
        reaches = "-" if peer_mean is None or name == "peer" else ("peer" if _mean(accuracies) >= peer_mean else "no")
        lines.append(
            f"{name:<{width}}{len(chosen):>5}{len(accuracies):>6}{100 * _mean(accuracies):>9.2f}%{std:>8}"
            f"{_mean([r['training_seconds'] for r in chosen]) / 60:>11.1f}{outside:>11.0f}  {reaches}"
        )
    lines.extend(same_invocation_ratios(runs))
    return "\n".join(lines)


def same_invocation_ratios(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for invocation in sorted({r["invocation"] for r in runs}):
        together = {
            name: _mean([r["training_seconds"] for r in runs if r["invocation"] == invocation and r["recipe"] == name])
            for name in ENTRIES
        }
        pairs = [
            (a, b)
            for a in OURS
            for b in ("fast", "muon", "peer")
            if a != b and not (a == "fast" and b == "muon") and together[a] is not None and together[b] is not None
        ]
        if pairs:
            ratios = ", ".join(f"{a}/{b} {together[a] / together[b]:.2f}" for a, b in pairs)
            lines.append(f"training-time ratios in invocation {invocation}: {ratios}")
    return lines


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def run_entries(args: argparse.Namespace, entries: list[str], path: Path) -> None:
    """Every entry for every seed, each run appended to the JSON file the moment it ends."""
    invocation = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{records.machine(args.device)}, torch {torch.__version__}; runs appended to {path}", flush=True)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for entry in entries:
            if entry == "peer":
                result = peer.run_peer(args.data_path, args.device, seed, args.quick)
            else:
                result = run_ours(entry, args.data_path, args.device, seed, args.quick)
            records.append_run(
                path,
                {
                    "recipe": entry,
                    "seed": seed,
                    "invocation": invocation,
                    "commit": records.commit(),
                    "machine": records.machine(args.device),
                    "hardware": records.hardware_record(args.device),
                    "torch": torch.__version__,
                    "quick": args.quick,
                    **result,
                },
            )
            print(
                f"{entry} seed {seed}: accuracy {result['accuracy']:.4f}, training "
                f"{result['training_seconds']:.0f} s,"
                f" outside {sum(result['outside'].values()):.0f} s",
                flush=True,
            )
    print(table(json.loads(path.read_text())["runs"], quick=args.quick))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", help="folder holding cifar-10-batches-py")
    parser.add_argument("--only", default="peer,muon,lean", help="comma-separated entries: " + ", ".join(ENTRIES))
    parser.add_argument("--seeds", type=int, default=1, help="runs of each entry (seeds first_seed, first_seed+1, ...)")
    parser.add_argument("--first_seed", type=int, default=0, help="the first seed (to add seeds to an earlier JSON)")
    parser.add_argument("--json", dest="json_path", default="benchmark_recipes.json", help="runs are appended here")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="a few steps of every entry (checks the tool)")
    parser.add_argument("--table", action="store_true", help="print the table of --json and exit")
    parser.add_argument(
        "--per_step",
        action="store_true",
        help="only seconds per bare training step of the peer's network and ours (CPU), interleaved",
    )
    parser.add_argument("--batch_size", type=int, default=1024, help="with --per_step")
    parser.add_argument("--steps", type=int, default=5, help="with --per_step: steps per round")
    parser.add_argument("--rounds", type=int, default=4, help="with --per_step")
    parser.add_argument("--per_step_json", default=None, help="with --per_step: the measurement is written here")
    args = parser.parse_args()
    path = Path(args.json_path)
    if args.per_step:
        measured = per_step_seconds(args.batch_size, args.steps, args.rounds)
        print(per_step_table(measured, records.machine("cpu")))
        if args.per_step_json:
            records.write(args.per_step_json, measured)
    elif args.table:
        print(table(json.loads(path.read_text())["runs"]))
    else:
        entries = [entry.strip() for entry in args.only.split(",") if entry.strip()]
        if any(entry not in ENTRIES for entry in entries) or not entries or args.seeds < 1 or args.data_path is None:
            parser.error(f"--only={args.only} (entries: {', '.join(ENTRIES)}), --seeds >= 1 and --data_path are needed")
        run_entries(args, entries, path)


if __name__ == "__main__":
    main()

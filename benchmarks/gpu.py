"""GPU: the fast recipe against airbench94's own code over several seeds, the speed levers of our step each
measured alone, the default ResNet-18 config against its bare step, a profile of fast.yaml, and what the Ignite
engine and our handlers cost per setting; in one invocation on one device. Writes its JSON (--json PATH) after
every run, so a command cut short still returns what it measured. Last run: docs/gpu-report.md.

    python -m benchmarks.gpu --data_path=DIR [--device=cuda] [--seeds=3] [--parts=race,levers,resnet,profile,
        compile,throughput,accuracy] [--recipes=fast,fast_muon] [--quick] [--skip_peer] [--json=PATH]

  race: configs/fast.yaml (validated every epoch, training seconds only, as airbench counts: both warm up outside
     their timers; airbench's own time also holds its whitening init) next to airbench94's train94
     (benchmarks.peer), seed by seed, the peer first; epoch 1's seconds and the median of epochs 2+ of each;
  levers: fast.yaml seed 0 with every automatic lever off (fused_optimizer, augment_per_pass), with each alone,
     and the opt-in ones added to the default: no mid-run checkpoint or loss read (quiet), low_precision_weights;
  resnet: the default config (ResNet-18) for 3 epochs: the median images/s of epochs 2+, against the matched bare
     step (same model, batch, layout, precision, optimizer, clipping) on device-resident tensors, the loss never
     read inside the timed steps; then with its checkpoints written inline, and with none mid-run (quiet);
  profile: fast.yaml with --profile=20: the top operators, and the GPU-busy share of the traced iterations (the
     union of kernel times over the traced wall time);
  compile: fast.yaml + compile, and + compile in reduce-overhead mode (CUDA graphs), recompilations counted from
     torch's log (those the whitening bias's freeze caused apart);
  throughput: a bare loop and our trainer with its handlers on one batch, per model and setting (bf16 included),
     the bare loop reading its losses once, after the timed steps.
  accuracy: fast.yaml over the seeds with the warm-up off, in fp16 (airbench's precision) and in fp32 instead of
     bf16: where the accuracy below the peer's, and its spread over seeds, come from (fp16 skipped on a CPU).
--device=cpu skips the peer, saying so (it rehearses the rest).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import peer as peer_code
from benchmarks import records, runner, steps
from benchmarks.gpu_resnet import QUIET, resnet
from benchmarks.gpu_tables import Record, cells, epoch_seconds, print_race, side_of, summarise

FAST = records.REPO / "configs" / "fast.yaml"
PARTS = ("race", "levers", "resnet", "profile", "compile", "throughput", "accuracy")
MODELS = {"resnet18": 512, "airbench": 1024}
SETTINGS = {
    "fp32": {},
    "fp16 amp": {"amp": True},
    "bf16 amp": {"amp": True, "amp_dtype": "bfloat16"},
    "channels_last": {"channels_last": True},
    "bf16 amp + channels_last": {"amp": True, "amp_dtype": "bfloat16", "channels_last": True},
}
ALL_OFF = {"fused_optimizer": False, "augment_per_pass": False}
LEVERS: dict[str, dict[str, Any]] = {  # fast.yaml + these (seed 0); "default" is the race's seed-0 run
    "all automatic levers off": ALL_OFF,
    "fused_optimizer alone": {**ALL_OFF, "fused_optimizer": True},
    "augment_per_pass alone": {**ALL_OFF, "augment_per_pass": True},
    "default + quiet": QUIET,
    "default + half_weights": {"low_precision_weights": True},
}
COMPILED: dict[str, dict[str, Any]] = {  # the compiled step: minutes of compilation each, so a part of its own
    "default + compile": {"compile": True},
    "default + compile reduce-overhead (CUDA graphs)": {"compile": True, "compile_mode": "reduce-overhead"},
}


def ours(
    data_path: str, device: torch.device, quick: dict[str, Any], recipe: str = "fast", **overrides: Any
) -> dict[str, Any]:
    """A shipped recipe (fast.yaml unless named) with ``overrides``, validated every epoch (with the recipe's TTA,
    as its final test: the curve's points sit above the peer's, which it evaluates without), in a fresh process; a
    failed run is recorded as its error's last lines, not raised."""
    with tempfile.TemporaryDirectory() as output:
        try:
            run = runner.train_ours(
                Path(output),
                records.REPO / "configs" / f"{recipe}.yaml",
                device.type,
                environment={"TORCH_LOGS": "recompiles"},
                **{"data_path": data_path, "validate_every": 1, **quick, **overrides},
            )
        except SystemExit as failure:
            return {"failed": str(failure).strip()[-1500:]}
    curve = run.curve("test")
    first, steady = epoch_seconds(curve)
    return {
        "accuracy": run.accuracy,
        "training_seconds": run.summary.training_time,
        "first_epoch_seconds": first,
        "steady_epoch_seconds": steady,
        "warm_up_seconds": run.summary.warm_up_time,
        "wall_seconds": run.wall_seconds,
        "recompilations": recompilations(run.log),
        "curve": curve,
        "overrides": overrides,
    }


def recompilations(log: str) -> dict[str, int] | None:
    """torch's recompilations in a run's log (TORCH_LOGS=recompiles): all of them, and those caused by the
    whitening bias's freeze (a training graph; the others are evaluation's, outside the training time)."""
    if "Recompiling function" not in log:
        return None
    blocks = log.split("Recompiling function")[1:]
    return {"all": len(blocks), "whitening_bias_frozen": sum("whitening_bias_frozen" in block for block in blocks)}


def peer(data_path: str, device: torch.device, seed: int, skip: bool = False) -> dict[str, Any] | str:
    """airbench94's train94 on our data (benchmarks.peer), or why it did not run."""
    if skip:
        return "skipped: --skip_peer"
    if device.type != "cuda":
        return "skipped: airbench94 runs on CUDA only here (benchmarks.recipes adapts it to a CPU)"
    if importlib.util.find_spec("airbench") is None:
        return f"skipped: the airbench package is not installed ({peer_code.PACKAGE})"
    try:
        result = peer_code.run_peer(data_path, "cuda", seed=seed, quick=False)
    except SystemExit as failure:
        return f"failed: {str(failure).strip().splitlines()[-1]}"
    first, steady = epoch_seconds(result["curve"])
    return {**result, "first_epoch_seconds": first, "steady_epoch_seconds": steady}


def race(
    data_path: str,
    device: torch.device,
    seeds: int,
    quick: dict[str, Any],
    out: Record,
    skip_peer: bool = False,
    recipes: tuple[str, ...] = ("fast",),
    compile_mode: str | None = None,
) -> None:
    """Seed by seed: the peer, then each of our ``recipes`` as shipped ("ours" is fast.yaml, "ours:NAME" the
    others), or compiled in ``compile_mode`` ("reduce-overhead": CUDA graphs)."""
    compiled = {"compile": True, "compile_mode": compile_mode} if compile_mode else {}
    for seed in range(seeds):
        out.add("peer", str(seed), peer(data_path, device, seed, skip_peer))
        for recipe in recipes:
            out.add(side_of(recipe), str(seed), ours(data_path, device, quick, recipe, seed=seed, **compiled))
        print_race(out)
    out.put("race_summary", summarise(out.data))
    out.say(f"race: {json.dumps(out.data['race_summary'])}")


ACCURACY: dict[str, dict[str, Any]] = {  # fast.yaml + these, over the race's seeds: the accuracy gap's suspects
    "warm-up off": {"warm_up_steps": 0},
    "fp16 autocast (airbench's precision)": {"with_amp": True, "amp_dtype": "float16"},
    "fp32 (TF32 convolutions)": {"with_amp": False},
}


def accuracy(data_path: str, device: torch.device, seeds: int, quick: dict[str, Any], out: Record) -> None:
    """fast.yaml with each of ACCURACY's changes, seed by seed: whether the accuracy below the peer's and its
    spread over seeds (GPU only) move with the GPU's warm-up or with bf16's precision."""
    for name, overrides in ACCURACY.items():
        if device.type != "cuda" and overrides.get("amp_dtype") == "float16":
            out.add("accuracy", name, "skipped: fp16 autocast on a CPU is emulated (a rehearsal would take hours)")
            out.say(f"{name:<50}  skipped on the CPU (fp16 is emulated there)")
            continue
        for seed in range(seeds):
            row = ours(data_path, device, quick, seed=seed, **overrides)
            out.add("accuracy", f"{name}, seed {seed}", row)
            out.say(f"{name + ', seed ' + str(seed):<50}" + cells(row))


def levers(
    data_path: str, device: torch.device, quick: dict[str, Any], out: Record, chosen: dict[str, dict[str, Any]] = LEVERS
) -> None:
    """fast.yaml seed 0 with each lever set (LEVERS, or the COMPILED ones), in order; each row as it ends, with
    torch's recompilations (all, and those the whitening bias's freeze caused)."""
    for name, overrides in chosen.items():
        row = ours(data_path, device, quick, seed=0, **overrides)
        out.add("levers", name, row)
        recompiled = f"  recompilations {row['recompilations']}" if row.get("recompilations") else ""
        out.say(f"{'lever: ' + name:<50}" + cells(row) + recompiled)


def profile(data_path: str, device: torch.device, quick: dict[str, Any], out: Record) -> None:
    """fast.yaml with --profile=20: the top operators, where the run's time went, and the GPU-busy share."""
    with tempfile.TemporaryDirectory() as output:
        try:
            run = runner.train_ours(
                Path(output),
                FAST,
                device.type,
                data_path=data_path,
                profile=20,
                **{k: v for k, v in quick.items() if k != "tta"},
            )
        except SystemExit as failure:
            out.put("profile", {"failed": str(failure).strip()[-1500:]})
            return
        folder = run.run_dir / "profile"
        table = (folder / "top_operators.txt").read_text() if (folder / "top_operators.txt").is_file() else ""
        traces = sorted(folder.glob("rank*.pt.trace.json"))
        busy = busy_share(json.loads(traces[0].read_text())) if traces else None
    out.put("profile", {"top_operators": table, "gpu_busy": busy, "where_the_time_went": run.summary.profile})
    out.say(table.rstrip())
    out.say(f"profile: GPU busy {busy}")


def busy_share(trace: dict[str, Any]) -> dict[str, float] | None:
    """From a chrome trace: the union of GPU kernel (and copy) intervals over the span from the first to the
    last traced event, and the kernel count; None without GPU events."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    if not gpu:
        return None
    busy, end = 0.0, float("-inf")
    for start, stop in gpu:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    span = max(float(e["ts"]) + float(e["dur"]) for e in events) - min(float(e["ts"]) for e in events)
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    return {"busy_share": busy / span, "busy_ms": busy / 1000, "span_ms": span / 1000, "kernels": kernels}


def throughput(device: torch.device, count: int, warmup: int, batch_scale: float, out: Record) -> None:
    """A bare loop and our trainer, each model and setting."""
    out.say(f"{'model':<10}{'batch':>6}  {'setting':<30}{'bare/s':>10}{'ours/s':>10}{'ratio':>8}")
    for model, batch_size in MODELS.items():
        size = max(8, int(batch_size * batch_scale))
        batch = (torch.randn(size, 3, 32, 32), torch.randint(0, 10, (size,)))
        for setting, options in SETTINGS.items():
            bare = steps.bare_loop(model, batch, count, warmup, device=device, **options).images_per_second
            engine = steps.engine_loop(model, batch, count, warmup, device=device, **options).images_per_second
            out.add(
                "throughput",
                f"{model} {setting}",
                {"batch": size, "bare_loop": bare, "trainer": engine, "trainer_over_bare": engine / bare},
            )
            out.say(f"{model:<10}{size:>6}  {setting:<30}{bare:>10.0f}{engine:>10.0f}{engine / bare:>8.3f}")


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", required=True, help="folder holding cifar-10-batches-py")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--seeds", type=int, default=3, help="seeds of ours and the peer in the race")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which, in order: {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="a few steps of everything (checks the script)")
    parser.add_argument("--skip_peer", action="store_true", help="the race without airbench94")
    parser.add_argument("--recipes", default="fast", help="our shipped configs in the race, e.g. fast,fast_muon")
    parser.add_argument(
        "--race_compile",
        choices=["default", "reduce-overhead", "max-autotune"],
        help="the race's runs of ours with --compile=True in this compile_mode (reduce-overhead: CUDA graphs)",
    )
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


def main() -> None:
    args = parse_arguments()
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        raise SystemExit(f"--parts: unknown {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: use --device=cpu")
    device = torch.device(args.device)
    quick = {"num_epochs": 2, "num_warmup_epochs": 0.5, "epoch_length": 3, "tta": 0} if args.quick else {}
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {'quick check' if args.quick else 'full'}, parts {parts}", flush=True)
    out = Record(
        args.json_path,
        {
            "device": name,
            "torch": torch.__version__,
            "quick": args.quick,
            "parts": parts,
            "seeds": args.seeds,
            "race_compile": args.race_compile,
            "hardware": records.hardware_record(args.device),
        },
    )
    for part in parts:
        started = time.perf_counter()
        if part == "race":
            race(
                args.data_path,
                device,
                args.seeds,
                quick,
                out,
                args.skip_peer,
                tuple(name.strip() for name in args.recipes.split(",") if name.strip()),
                args.race_compile,
            )
        elif part == "levers":
            levers(args.data_path, device, quick, out)
        elif part == "resnet":
            resnet(args.data_path, device, quick, out)
        elif part == "profile":
            profile(args.data_path, device, quick, out)
        elif part == "compile":
            levers(args.data_path, device, quick, out, COMPILED)
        elif part == "accuracy":
            accuracy(args.data_path, device, args.seeds, quick, out)
        else:
            count, warmup, scale = (2, 1, 1 / 16) if args.quick else (25, 5, 1.0)
            throughput(device, count, warmup, scale, out)
        out.add("part_seconds", part, time.perf_counter() - started)


if __name__ == "__main__":
    main()

"""GPU: what the Ignite engine and our handlers cost on a fast device, and the fast recipe against airbench94's own
code, in one invocation on one device; prints tables and writes JSON with --json PATH. Last run: one H200
(docs/measurements/gpu_h200.json, docs/gpu-report.md), about 3 minutes; ``--device=cpu --quick`` (about 2 minutes
on 2 cores) checks the tool itself. Run by scripts/gpu_check.sh.

    python -m benchmarks.gpu --data_path=DIR [--device=cuda] [--quick] [--skip_peer] [--json=PATH]

  1. ResNet-18 (batch 512) and airbench (batch 1024) in each speed setting: a bare PyTorch loop and our trainer
     with its handlers on the same device-resident tensors, img/s;
  2. one full epoch of a real run on real data: ResNet-18 (data_on_device=auto: on a GPU, on) and configs/fast.yaml;
  3. time to accuracy: configs/fast.yaml trained to the end (validated every epoch, training seconds only, as
     airbench counts: both warm up outside their timers) next to airbench94's train94 (benchmarks.peer), with the
     time each needed to reach the other's accuracy, epoch 1's seconds and the median of epochs 2+ (the steady
     epoch). --device=cpu skips the peer, saying so.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import peer as peer_code
from benchmarks import records, runner, steps

MODELS = {"resnet18": 512, "airbench": 1024}
SETTINGS = {
    "fp32": {},
    "amp": {"amp": True},
    "channels_last": {"channels_last": True},
    "amp + channels_last": {"amp": True, "channels_last": True},
    "compile + amp + channels_last": {"amp": True, "channels_last": True, "compile": True},
}


def throughput(device: torch.device, count: int, warmup: int, batch_scale: float) -> list[dict[str, Any]]:
    """Part 1: bare loop and our trainer, each model and setting."""
    rows = []
    for model, batch_size in MODELS.items():
        size = max(8, int(batch_size * batch_scale))
        batch = (torch.randn(size, 3, 32, 32), torch.randint(0, 10, (size,)))
        for setting, options in SETTINGS.items():
            bare = steps.bare_loop(model, batch, count, warmup, device=device, **options).images_per_second
            engine = steps.engine_loop(model, batch, count, warmup, device=device, **options).images_per_second
            rows.append({"model": model, "batch": size, "setting": setting, "bare_loop": bare, "trainer": engine,
                         "trainer_over_bare": engine / bare})
            print(f"{model:<10}{size:>6}  {setting:<30}{bare:>10.0f}{engine:>10.0f}{engine / bare:>8.3f}", flush=True)
    return rows


def full_epochs(data_path: str, device: torch.device, quick: dict[str, Any]) -> dict[str, float]:
    """Part 2: img/s of a real epoch (the last, when --quick runs several short ones)."""
    speeds = {}
    for name, config, options in (("resnet18", None, {"model": "resnet18", "num_workers": 4}),
                                  ("fast.yaml", records.REPO / "configs" / "fast.yaml", {})):
        with tempfile.TemporaryDirectory() as output:
            run = runner.train_ours(Path(output), config, device.type, **{
                **options, "data_path": data_path, "num_epochs": 1, "num_warmup_epochs": 0.2, "train_eval_size": 0,
                **quick})
        speeds[name] = run.epochs[-1]["images_per_second"]
        print(f"full epoch, {name:<12}{speeds[name]:>10.0f} img/s", flush=True)
    return speeds


def ours_to_the_end(data_path: str, device: torch.device, quick: dict[str, Any]) -> dict[str, Any]:
    """Part 3, ours: configs/fast.yaml validated every epoch (without TTA; the final test with it); the curve is
    (training seconds so far, test accuracy) at each epoch end. Training seconds exclude the warm-up
    (warm_up_steps=auto: 3 steps on a GPU, undone), as the peer's timer excludes its warmup94; the warm-up's
    seconds and the wall time are reported beside them."""
    with tempfile.TemporaryDirectory() as output:
        run = runner.train_ours(Path(output), records.REPO / "configs" / "fast.yaml", device.type,
                                **{"data_path": data_path, "validate_every": 1, **quick})
    curve = run.curve("test")
    first, steady = epoch_seconds(curve)
    return {"accuracy": run.accuracy, "training_seconds": run.summary.training_time, "first_epoch_seconds": first,
            "steady_epoch_seconds": steady, "warm_up_seconds": run.summary.warm_up_time,
            "wall_seconds": run.wall_seconds, "curve": curve}


def peer_to_the_end(data_path: str, device: torch.device) -> dict[str, Any] | str:
    """Part 3, the peer: airbench94's train94 on our data (benchmarks.peer)."""
    if device.type != "cuda":
        return "skipped: airbench94 runs on CUDA only here (benchmarks.recipes adapts it to a CPU)"
    if importlib.util.find_spec("airbench") is None:
        return (f"skipped: the airbench package is not installed (pip install 'cifar10-dist[bench]', or the sdist "
                f"of {peer_code.PACKAGE} offline)")
    try:
        return peer_code.run_peer(data_path, "cuda", seed=0, quick=False)
    except SystemExit as failure:
        return f"failed: {str(failure).strip().splitlines()[-1]}"


def epoch_seconds(curve: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(epoch 1's training seconds, the median of epochs 2+'s) from a curve evaluated after every epoch (training
    seconds so far, accuracy): what is first-epoch cost (autotuning, first launches) and what is the steady step."""
    ends = [seconds for seconds, _ in curve]
    if not ends:
        return None, None
    steady = [later - earlier for earlier, later in zip(ends, ends[1:])]
    return ends[0], statistics.median(steady) if steady else None


def comparison(ours: dict[str, Any], peer: dict[str, Any] | str) -> list[str]:
    lines = [f"{'recipe':<32}{'accuracy':>10}{'train s':>10}{'to peer acc s':>15}{'to our acc s':>14}"
             f"{'epoch 1 s':>11}{'steady s':>10}"]
    entries = {"ours: configs/fast.yaml": ours}
    if isinstance(peer, dict):
        entries["peer: airbench94 (train94)"] = peer
    for name, entry in entries.items():
        to_peer = runner.time_to(entry["curve"], peer["accuracy"]) if isinstance(peer, dict) else None
        to_ours = runner.time_to(entry["curve"], ours["accuracy"])
        first, steady = epoch_seconds(entry["curve"])
        lines.append(f"{name:<32}{entry['accuracy']:>10.4f}{entry['training_seconds']:>10.1f}"
                     f"{_seconds(to_peer):>15}{_seconds(to_ours):>14}{_seconds(first, 2):>11}{_seconds(steady, 3):>10}")
    if isinstance(peer, str):
        lines.append(f"peer: airbench94 ({peer_code.PACKAGE}): {peer}")
    return lines


def _seconds(value: float | None, decimals: int = 1) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", required=True, help="folder holding cifar-10-batches-py")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="a few steps of everything (checks the script)")
    parser.add_argument("--skip_peer", action="store_true")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: use --device=cpu")
    device = torch.device(args.device)
    count, warmup, scale = (2, 1, 1 / 16) if args.quick else (20, 5, 1.0)
    quick = {"num_epochs": 2, "num_warmup_epochs": 0.5, "epoch_length": 3, "tta": 0} if args.quick else {}
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    header = f"{name}, torch {torch.__version__}, {'quick check' if args.quick else 'full'}"
    print(header)
    print(f"{'model':<10}{'batch':>6}  {'setting':<30}{'bare/s':>10}{'ours/s':>10}{'ratio':>8}")
    rows = throughput(device, count, warmup, scale)
    epochs = full_epochs(args.data_path, device, quick)
    ours = ours_to_the_end(args.data_path, device, quick)
    peer = "skipped: --skip_peer" if args.skip_peer else peer_to_the_end(args.data_path, device)
    lines = comparison(ours, peer)
    print("\n".join(lines))
    table = "\n".join([header, *(f"{r['model']} {r['setting']}: bare {r['bare_loop']:.0f} img/s, ours "
                                 f"{r['trainer']:.0f} img/s ({r['trainer_over_bare']:.3f})" for r in rows),
                       *(f"full epoch {k}: {v:.0f} img/s" for k, v in epochs.items()), *lines])
    if args.json_path:
        records.write(args.json_path, {"device": name, "torch": torch.__version__, "quick": args.quick,
                                       "hardware": records.hardware_record(args.device), "commit": records.commit(),
                                       "throughput": rows, "full_epoch": epochs, "ours": ours, "peer": peer,
                                       "table": table})


if __name__ == "__main__":
    main()

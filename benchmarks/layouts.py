"""channels_last against the default layout, per model and precision, on this machine: the evidence behind
``channels_last=auto`` (``system.layouts``). Bare SGD training steps on random 32x32 images (the doctor's probe,
``system.doctor.time_setting``), the two layouts alternating (A B B A ...) so the machine's drift falls on both.

    python -m benchmarks.layouts [--models=resnet18,airbench,simple_cnn] [--rounds=2] [--budget=6] [--json=PATH]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks import records
from cifar10_dist.system import doctor, hardware

BATCHES = {"resnet18": 128, "airbench": 256, "simple_cnn": 256}


def compare(model: str, dtype: torch.dtype | None, rounds: int, budget: float) -> dict:
    """Median step time of each layout over ``rounds`` alternating pairs; channels_last's speed-up."""
    device = torch.device("cpu")
    times: dict[bool, list[float]] = {False: [], True: []}
    for index in range(2 * rounds):
        layout = bool(index % 2) != bool((index // 2) % 2)  # F T T F F T ...
        timing = doctor.time_setting(model, BATCHES[model], device, dtype, layout, budget)
        times[layout].extend(timing.steps)
    contiguous, last = statistics.median(times[False]), statistics.median(times[True])
    row = {
        "model": model,
        "batch": BATCHES[model],
        "precision": "bf16 autocast" if dtype else "fp32",
        "contiguous_img_s": BATCHES[model] / contiguous,
        "channels_last_img_s": BATCHES[model] / last,
        "speedup": contiguous / last,
        "steps": {"contiguous": len(times[False]), "channels_last": len(times[True])},
    }
    print(
        f"{model:<11}{row['precision']:<15}{row['contiguous_img_s']:>10.0f}{row['channels_last_img_s']:>10.0f}"
        f"{row['speedup']:>8.2f}x",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,airbench,simple_cnn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget", type=float, default=6.0, help="seconds per measurement")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    dtypes = [None] + ([torch.bfloat16] if hardware.native_bf16_cpu() else [])
    print(f"{'model':<11}{'precision':<15}{'default':>10}{'ch_last':>10}{'ratio':>9}")
    rows = [compare(model, dtype, args.rounds, args.budget) for model in args.models.split(",") for dtype in dtypes]
    if args.json_path:
        records.write(
            args.json_path,
            {
                "hardware": records.hardware_record("cpu"),
                "rows": rows,
                "rounds": args.rounds,
                "budget_seconds": args.budget,
            },
        )


if __name__ == "__main__":
    main()

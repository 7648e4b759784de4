"""What a training checkpoint costs the training loop: the seconds a save holds the loop, written inline against
written in the background (``checkpoint_in_background``: the loop waits for a copy of the state in host memory,
a thread writes it), and the seconds until the file is on disk, for the default config's model (ResNet-18 and its
Nesterov momentum: 90 MB). Rounds alternate the two ways; medians. Last run: docs/measurements/
checkpoint_writes_cpu_avx2.json (2-core AVX2 EPYC, the run folder on its disk).

    python -m benchmarks.checkpoint_writes [--folder=DIR] [--rounds=5] [--device=cpu|cuda] [--json=PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from ignite.engine import Engine

from benchmarks import records
from cifar10_dist import models
from cifar10_dist.training.loop import checkpointing


def training_state(device: torch.device) -> dict[str, Any]:
    """ResNet-18 and its optimizer after one step (momentum buffers filled), as a run checkpoints them."""
    model = models.build_model("resnet18").to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    model(torch.randn(8, 3, 32, 32, device=device)).sum().backward()
    optimizer.step()
    return {"model": model, "optimizer": optimizer}


def one_save(state: dict[str, Any], folder: Path, in_background: bool, iteration: int) -> dict[str, float]:
    """Seconds the save held the caller, and seconds until the file was on disk."""
    handler = checkpointing.create_training_checkpoint(state, folder, in_background=in_background)
    engine = Engine(lambda engine, batch: None)
    engine.state.iteration = iteration
    started = time.perf_counter()
    handler(engine)
    held = time.perf_counter() - started
    checkpointing.written(handler)
    return {"loop_waits": held, "on_disk": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=None, help="where the files are written (default: a temporary folder)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    state = training_state(torch.device(args.device))
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        rows: dict[str, list[dict[str, float]]] = {"inline": [], "background": []}
        for index in range(args.rounds):
            for way in rows:
                rows[way].append(one_save(state, Path(folder), way == "background", 2 * index + (way == "inline")))
        size = max(path.stat().st_size for path in Path(folder).glob("*.pt"))
    result = {
        way: {key: statistics.median(row[key] for row in runs) for key in ("loop_waits", "on_disk")}
        for way, runs in rows.items()
    }
    result["background_loop_waits_over_inline"] = result["background"]["loop_waits"] / result["inline"]["loop_waits"]
    print(f"checkpoint of {size / 1e6:.1f} MB, {args.rounds} rounds, medians:")
    for way in rows:
        print(
            f"  {way:<11} the loop waits {result[way]['loop_waits'] * 1000:7.1f} ms, "
            f"on disk after {result[way]['on_disk'] * 1000:7.1f} ms"
        )
    if args.json_path:
        records.write(
            args.json_path,
            {"device": args.device, "megabytes": size / 1e6, "rounds": args.rounds, "results": result, "runs": rows},
        )


if __name__ == "__main__":
    main()

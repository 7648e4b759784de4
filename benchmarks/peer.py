"""The peer: Keller Jordan's airbench94 from PyPI (airbench==0.1.8), its own ``train94`` run in a process of its
own, in a folder where its CifarLoader finds cifar10/train.pt and test.pt written from our data; its printed table
read back. On a CPU it is adapted at run time, without changing its code: .cuda()/.half() become no-ops (fp32
weights), torch.cuda.Event becomes a CPU timer, and its network's forward runs under bf16 autocast where the CPU
has native bf16 (AMX or AVX512-BF16), in fp32 elsewhere (as our recipes' with_amp=auto does). Its process keeps
freed memory as ours do (glibc's MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_; reuse_freed_memory).

    python -m benchmarks.peer --device=cpu --seed=0 [--epochs=E] [--batch_size=B]   (the worker side; benchmarks
    call ``run_peer``)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cifar10_dist.data import cifar
from cifar10_dist.system import cpu, hardware

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "airbench==0.1.8"
QUICK = ["--epochs=0.01", "--batch_size=128"]  # a few steps of train94 at a smaller batch (checks the tool)
# the glibc setting our runs make themselves (reuse_freed_memory, on by default), so that times compare recipes,
# not allocators (it makes both about 1.1x faster at batch 1024 on the Zen 4 machine)
KEEP_FREED = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(cpu.NEVER_TRIM)}


def write_peer_data(data_path: str, folder: Path) -> None:
    """Our CIFAR-10 files as airbench's cifar10/train.pt and test.pt (uint8 NHWC images, labels, classes)."""
    _, train_set, test_set = cifar.read_dataset("cifar10", Path(data_path))
    (folder / "cifar10").mkdir()
    for name, images in (("train", train_set), ("test", test_set)):
        torch.save(
            {
                "images": torch.as_tensor(images.images).permute(0, 2, 3, 1).contiguous(),
                "labels": torch.as_tensor(images.labels),
                "classes": list(cifar.CLASSES),
            },
            folder / "cifar10" / f"{name}.pt",
        )


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
    """The network computing its forward under CPU bf16 autocast and returning fp32 logits, where this CPU has
    native bf16 (else unchanged, fp32, as with_amp=auto trains ours); everything else (the whitening init's
    covariance and eigendecomposition, the optimizer) stays fp32. Autocast around the whole of train94 would
    compute the patch covariance in bf16: its eigenvalues go negative and the run is NaN from the first step."""
    if not hardware.native_bf16_cpu():
        return net
    forward = net.forward

    def autocast_forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*args, **kwargs).float()

    net.forward = autocast_forward
    return net


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
    return {
        "accuracy": final["accuracy"],
        "accuracy_without_tta": curve[-1][1],
        "train_loss": final["train_loss"],
        "training_seconds": curve[-1][0],
        "tta_seconds": final["seconds_with_tta"] - curve[-1][0],
        "curve": curve,
    }


def run_peer(data_path: str, device: str, seed: int, quick: bool) -> dict[str, Any]:
    """train94 on our data in its own process: accuracy, training seconds (its own timers), the curve, the wall
    seconds and what lay outside its timers (airbench evaluates without TTA after every epoch, outside them)."""
    if importlib.util.find_spec("airbench") is None:
        raise SystemExit(
            f"the peer needs the airbench package: pip install 'cifar10-dist[bench]' ({PACKAGE}, or its sdist offline)"
        )
    started = time.perf_counter()
    env = {**os.environ, **KEEP_FREED, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory() as folder:
        write_peer_data(data_path, Path(folder))
        command = [
            sys.executable,
            "-m",
            "benchmarks.peer",
            f"--device={device}",
            f"--seed={seed}",
            *(QUICK if quick else []),
        ]
        result = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"airbench94 failed: {result.stderr.strip()[-2000:]}")
    peer = parse_peer_table(result.stdout)
    wall = time.perf_counter() - started
    outside = {"tta_evaluation": peer["tta_seconds"], "other": wall - peer["training_seconds"] - peer["tta_seconds"]}
    return {**peer, "wall_seconds": wall, "outside": outside, "environment": KEEP_FREED}


def main() -> None:
    """In the peer's process (cwd holds cifar10/): airbench94's train94, printing its table."""
    parser = argparse.ArgumentParser(description="airbench94's train94 (the peer's process)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=float, default=None)
    parser.add_argument("--batch_size", type=int, default=None, help="train94's own is 1024")
    args = parser.parse_args()
    import airbench
    from airbench import lib_airbench94

    torch.manual_seed(args.seed)
    options: dict[str, Any] = {} if args.epochs is None else {"epochs": args.epochs}
    if args.device == "cpu":
        adapt_to_cpu()  # before its loader reads cifar10/*.pt
        options["make_net"] = lambda: with_bf16_forward(lib_airbench94.make_net94())
    else:
        airbench.warmup94()
    if args.batch_size is not None:  # its own training loader, as train94 makes it, at another batch size
        options["train_loader"] = lib_airbench94.CifarLoader(
            "cifar10", train=True, batch_size=args.batch_size, aug=lib_airbench94.hyp["aug"], altflip=True
        )
    airbench.train94(**options)


if __name__ == "__main__":
    main()

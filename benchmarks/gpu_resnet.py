"""GPU, the resnet part of ``benchmarks.gpu``: the default config (ResNet-18) for 3 epochs, as a user runs it,
against its matched bare step (same model, batch, layout, precision, optimizer, clipping, on device-resident
tensors, the loss never read inside the timed steps); then with its checkpoints written inline, and with no
mid-run checkpoint or loss read (quiet)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks import runner, steps
from benchmarks.gpu_tables import Record

QUIET = {"checkpoint_every": 100000, "log_every_iters": 100000}  # no mid-run checkpoint, no loss read mid-epoch

RESNET_VARIANTS: dict[str, dict[str, Any]] = {  # the default config + these, after the default itself
    "checkpoints inline": {"checkpoint_in_background": False},
    "quiet": QUIET,
}


def resnet(data_path: str, device: torch.device, quick: dict[str, Any], out: Record) -> None:
    """The default config for 3 epochs (as a user runs it) and the matched bare step; then the default with its
    checkpoints written inline (the lever they were moved off the loop's path for), and with no mid-run
    checkpoint or loss read (what the rest of the gap is)."""
    epochs = {"num_epochs": 3, **({k: v for k, v in quick.items() if k in ("epoch_length", "num_warmup_epochs")})}
    speeds = resnet_speeds(data_path, device, epochs)
    if isinstance(speeds, str):
        out.put("resnet", {"failed": speeds})
        return
    bare = matched_bare_step(device, batch=512 if not quick else 32, steps=40 if not quick else 3)
    record = {
        "epoch_images_per_second": speeds,
        "steady_images_per_second": steady_of(speeds),
        "bare_images_per_second": bare["images_per_second"],
        "bare": bare,
        "ours_over_bare": steady_of(speeds) / bare["images_per_second"],
        "variants": {},
    }
    out.put("resnet", record)
    out.say(
        f"ResNet-18 default config: steady epoch {record['steady_images_per_second']:.0f} img/s, matched bare "
        f"step {bare['images_per_second']:.0f} img/s ({record['ours_over_bare']:.3f})"
    )
    for name, overrides in RESNET_VARIANTS.items():
        speeds = resnet_speeds(data_path, device, {**epochs, **overrides})
        row = (
            {"failed": speeds}
            if isinstance(speeds, str)
            else {
                "epoch_images_per_second": speeds,
                "steady_images_per_second": steady_of(speeds),
                "over_bare": steady_of(speeds) / bare["images_per_second"],
            }
        )
        record["variants"][name] = row
        out.put("resnet", record)
        out.say(
            f"ResNet-18 default config, {name}: "
            + (
                row["failed"][-200:]
                if "failed" in row
                else f"steady epoch {row['steady_images_per_second']:.0f} img/s ({row['over_bare']:.3f} of bare)"
            )
        )


def steady_of(speeds: list[float]) -> float:
    """The median images/s of epochs 2+ (epoch 1's alone when it is the only one)."""
    return statistics.median(speeds[1:] or speeds)


def resnet_speeds(data_path: str, device: torch.device, overrides: dict[str, Any]) -> list[float] | str:
    """Images per second of each epoch of the default config with ``overrides``, or why the run failed."""
    with tempfile.TemporaryDirectory() as output:
        try:
            run = runner.train_ours(Path(output), None, device.type, data_path=data_path, **overrides)
        except SystemExit as failure:
            return str(failure).strip()[-1500:]
    return [row["images_per_second"] for row in sorted(run.epochs, key=lambda row: row["epoch"])]


def matched_bare_step(device: torch.device, batch: int, steps: int, warmup: int = 5) -> dict[str, Any]:
    """The default config's step without the framework: ResNet-18, Nesterov SGD (fused on a GPU, as auto), its
    clipping to norm 1, fp32 (with_amp=False), channels-last on a GPU (as auto), on one device-resident batch of
    normalised images; the timed steps read nothing, then wait for the device once."""
    from cifar10_dist import models

    torch.manual_seed(0)
    cuda = device.type == "cuda"
    model = models.build_model("resnet18").to(device)
    layout = torch.channels_last if cuda else torch.contiguous_format
    model = model.to(memory_format=layout)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.4, momentum=0.9, nesterov=True, weight_decay=1e-4, **({"fused": True} if cuda else {})
    )
    inputs = torch.randn(batch, 3, 32, 32, device=device).contiguous(memory_format=layout)
    targets = torch.randint(0, 10, (batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> torch.Tensor:
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    seconds = timed_steps(step, steps, warmup, device)
    return {"images_per_second": steps * batch / seconds, "batch": batch, "steps": steps, "seconds": seconds}


def timed_steps(step: Callable[[], torch.Tensor], count: int, warmup: int, device: torch.device) -> float:
    """Seconds of ``count`` steps after ``warmup``, the device waited for at both ends, losses read after."""
    for _ in range(warmup):
        step()
    steps.synchronize(device)
    start = time.perf_counter()
    losses = [step() for _ in range(count)]
    steps.synchronize(device)
    seconds = time.perf_counter() - start
    assert all(torch.isfinite(torch.stack(losses)).tolist())
    return seconds

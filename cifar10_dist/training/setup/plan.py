"""A run's plan: every choice the run makes for itself (``auto``, ``find``), settled once before its first step
into one frozen record, ``RunPlan``: the config with each choice written as the value taken, so that config.yaml
and every checkpoint's meta say what ran (a run started from that config.yaml makes the same choices), and the
few facts beside it (device, precision and why, the checkpoint continued). Logged once as a short table; read,
never rebuilt, by everything after it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cifar10_dist.config import Config, class_weights
from cifar10_dist.data.run_data import DataSetup
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.setup import optimizers, process_setup
from cifar10_dist.training.setup.resumption import Resumption

# the keys a run settles, in the order the table shows them (channels_last and learning_rate: by their modules)
SETTLED = ("with_amp", "amp_dtype", "data_on_device", "augment_per_pass", "num_workers", "channels_last",
           "fused_optimizer", "learning_rate", "warm_up_steps", "class_weights", "resume_from")


@dataclass(frozen=True)
class RunPlan:
    config: Config  # settled: no auto, find or resume_from=auto left (amp_dtype stays auto without autocast)
    device: str
    precision: str  # the precision chosen and why, e.g. "bf16 autocast (with_amp=auto: ...)"
    given: dict[str, Any]  # the settled keys as the run was given them (auto, find, ...)
    grad_compression: str = "none"  # what the gradients exchanged are compressed with (training.setup.compression)

    @property
    def resume_from(self) -> str | None:
        """The checkpoint the run continues from (None: a fresh start)."""
        return self.config.resume_from

    def table(self) -> str:
        """The settled keys, a line each: the value taken, and what was given where it differs."""
        rows = [("device", self.device, ""), ("precision", self.precision, ""),
                ("grad_compression", self.grad_compression, "")]
        for key in SETTLED:
            taken, given = getattr(self.config, key), self.given[key]
            rows.append((key, str(taken), "" if taken == given else f"(given: {given})"))
        width = max(len(key) for key, _, _ in rows)
        return "\n".join(f"  {key:<{width}}  {value} {note}".rstrip() for key, value, note in rows)


def settled_choices(config: Config, device: torch.device, precision: Precision, resumption: Resumption,
                    data_setup: DataSetup) -> dict[str, Any]:
    """The values of the keys the data, the device and the precision decide, as taken: for
    ``dataclasses.replace`` (channels_last and learning_rate are settled by ``layouts`` and ``lr_finding``)."""
    weights = class_weights(config.class_weights)
    counts = data_setup.class_counts or []
    taken = weights.for_counts(counts, data_setup.info.classes) if weights is not None and weights.auto else None
    return {"data_on_device": data_setup.data_on_device, "augment_per_pass": data_setup.augment_per_pass,
            "num_workers": data_setup.num_workers, "fused_optimizer": optimizers.fused_on(config.fused_optimizer, device),
            "warm_up_steps": warm_up_steps_for(config.warm_up_steps, device), "resume_from": resumption.checkpoint,
            **({"class_weights": ",".join(str(weight) for weight in taken)} if taken is not None else {}),
            **process_setup.settled_precision(config, precision)}


def made(settled: Config, given: Config, device: torch.device, precision: Precision,
         grad_compression: str = "none") -> RunPlan:
    """The plan of a run whose config was ``given`` and is now ``settled``."""
    return RunPlan(settled, str(device), precision.reason or precision.name,
                   {key: getattr(given, key) for key in SETTLED}, grad_compression)


AUTO_STEPS = 3  # warm_up_steps=auto on a GPU: cuDNN times its algorithms on the first pass of each shape


def warm_up_steps_for(setting: int | str, device: torch.device) -> int:
    """``warm_up_steps``: a number as given; auto: AUTO_STEPS on a CUDA GPU (autotuning, lazy loading), none
    elsewhere (a CPU has no such first-pass costs worth a separate count)."""
    if setting != "auto":
        return int(setting)
    return AUTO_STEPS if device.type == "cuda" else 0

"""The planner: every choice a run makes for itself (``auto``, ``find``) is decided here, from what the machine
and the data are (the device, the precision, the images, their classes), by the rule each key's module declares
(``data.run_data.settle_data_on_device``, ``data.loaders.workers_for``, ``data.batches.settle_augment_per_pass``,
``optimizers.fused_on``, ``process_setup``'s precision, ``layouts``' memory format, ``lr_finding``'s sweep), and
nowhere else: ``run``, ``lr-find`` (``precision_for``, ``plan_data``), ``evaluate`` (``settle_evaluation``)
and ``batch-size`` (``settle_measurement``) ask it, and the code after it reads the settled config only. One
choice is made after it, on what it built: learning_rate=find, the sweep on the model (``run.plan_the_run``
calls ``before_training.lr_finding``, a floor above this one). tests/test_import_floors.py checks that no other
module calls the rules.

A run's choices end in one frozen record, ``RunPlan``: the config with each choice written as the value taken,
so that config.yaml and every checkpoint's meta say what ran (a run started from that config.yaml makes the same
choices), and the few facts beside it (device, precision and why, the checkpoint continued). Logged once as a
short table; read, never rebuilt, by everything after it."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from cifar10_dist.config import Config, class_weights, per_batch_augmentations
from cifar10_dist.config.export_flags import Calibration, candidates_for
from cifar10_dist.data import batches, loaders, run_data
from cifar10_dist.data.datasets import LoadedData
from cifar10_dist.data.run_data import DataSetup, Normalisation
from cifar10_dist.system import ranks
from cifar10_dist.system.precision import Precision, choose_precision
from cifar10_dist.training.setup import layouts, optimizers, process_setup
from cifar10_dist.training.setup import resumption as resumption_of
from cifar10_dist.training.setup.resumption import Resumption

logger = logging.getLogger("cifar10_dist")

# the keys a run settles, in the order the table shows them (channels_last and learning_rate: by their modules)
SETTLED = (
    "with_amp",
    "amp_dtype",
    "data_on_device",
    "augment_per_pass",
    "num_workers",
    "channels_last",
    "fused_optimizer",
    "learning_rate",
    "warm_up_steps",
    "class_weights",
    "resume_from",
)


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
        rows = [
            ("device", self.device, ""),
            ("precision", self.precision, ""),
            ("grad_compression", self.grad_compression, ""),
        ]
        for key in SETTLED:
            taken, given = getattr(self.config, key), self.given[key]
            rows.append((key, str(taken), "" if taken == given else f"(given: {given})"))
        width = max(len(key) for key, _, _ in rows)
        return "\n".join(f"  {key:<{width}}  {value} {note}".rstrip() for key, value, note in rows)


def process_choices(config: Config, device: torch.device) -> tuple[Precision, Resumption]:
    """What is decided before the data: the precision (with_amp=auto: what trains fastest on this device) and
    whether and from where the run continues (resume_from=auto: the run folder's newest checkpoint)."""
    return precision_for(config, device), resumption_of.decide(config)


def precision_for(config: Config, device: torch.device) -> Precision:
    """with_amp and amp_dtype (auto: bf16 or fp16 autocast where the device computes it fast, else fp32)."""
    return process_setup.setup_precision(config, device)


def plan_data(
    config: Config, device: torch.device, precision: Precision, normalisation: Normalisation | None = None
) -> tuple[Config, DataSetup]:
    """A run's data: its images loaded, then how they are fed decided (``data_choices``), then their loaders
    built with those choices; returns the config with them settled, and the data."""
    images = run_data.load_run_images(config, device, precision, normalisation)
    settled = dataclasses.replace(config, **data_choices(config, device, images))
    return settled, run_data.setup_data(settled, device, precision, images)


def data_choices(config: Config, device: torch.device, images: run_data.RunImages) -> dict[str, Any]:
    """data_on_device (the images' size against the device's free memory), num_workers (none with the images on
    the device) and augment_per_pass (the device, where the images are, the augmentations drawn per batch)."""
    on_device = run_data.settle_data_on_device(config.data_on_device, device, images.image_sets)
    workers = loaders.workers_for(config.num_workers, device, images.train_images.images)
    if config.num_workers == "auto" and not on_device:
        ranks.on_rank_zero(
            logger.info,
            "num_workers=auto: %d per node (%s)",
            workers,
            "training on the CPU from memory: batches are read in the training process"
            if workers == 0
            else "reads overlap the step"
            if device.type == "cpu"
            else "each process's cores but the one that drives the device, 2 to 8 per process",
        )
    per_pass = batches.settle_augment_per_pass(
        config.augment_per_pass, device, on_device, per_batch_augmentations(config)
    )
    return {"data_on_device": on_device, "num_workers": 0 if on_device else workers, "augment_per_pass": per_pass}


def settled_choices(
    config: Config, device: torch.device, precision: Precision, resumption: Resumption, data_setup: DataSetup
) -> dict[str, Any]:
    """The values of the keys the device, the precision, the resume and the data's classes decide, as taken: for
    ``dataclasses.replace`` (channels_last and learning_rate follow: ``layouts``, then ``lr_finding``'s sweep on
    the model built with them)."""
    weights = class_weights(config.class_weights)
    counts = data_setup.class_counts or []
    taken = weights.for_counts(counts, data_setup.info.classes) if weights is not None and weights.auto else None
    return {
        "fused_optimizer": optimizers.fused_on(config.fused_optimizer, device),
        "warm_up_steps": warm_up_steps_for(config.warm_up_steps, device),
        "resume_from": resumption.checkpoint,
        **({"class_weights": ",".join(str(weight) for weight in taken)} if taken is not None else {}),
        **process_setup.settled_precision(config, precision),
    }


def settle_layout(config: Config, device: torch.device, data_setup: DataSetup) -> Config:
    """channels_last (auto: by the device and the model built for the data's classes), kept with its reason in the
    run's provenance."""
    return layouts.settle(config, device, len(data_setup.info.classes), data_setup.provenance)


def settle_evaluation(config: Config, device: torch.device, loaded: LoadedData) -> tuple[Config, Precision]:
    """``evaluate``'s choices, by a run's rules: precision, data_on_device and num_workers (from the test images),
    the memory layout."""
    precision = precision_for(config, device)
    on_device = run_data.settle_data_on_device(config.data_on_device, device, [loaded.train, loaded.test])
    workers = 0 if on_device else loaders.workers_for(config.num_workers, device, loaded.test.images)
    settled = dataclasses.replace(config, data_on_device=on_device, num_workers=workers)
    return layouts.settle(settled, device, len(loaded.info.classes)), precision


def settle_measurement(config: Config, device: torch.device, num_classes: int) -> tuple[Config, Precision]:
    """``batch-size``'s choices, once for every batch it times: the precision (by a run's rule, unlogged: the
    command prints its own report) and the memory layout."""
    precision = choose_precision(device, config.with_amp, config.amp_dtype)
    settled = dataclasses.replace(config, **process_setup.settled_precision(config, precision))
    return layouts.settle(settled, device, num_classes), precision


def automatic_choice(device: torch.device) -> Precision:
    """What with_amp=auto picks on ``device`` (doctor reports it)."""
    return choose_precision(device, "auto", "auto")


def calibration_candidates(method: str) -> tuple[Calibration, ...]:
    """``export --quantize=int8``'s calibrations to try: all of them for calibration_method=auto (the best on
    held-out training images is kept), else that method's two."""
    return candidates_for(method)


def run_plan(
    settled: Config, given: Config, device: torch.device, precision: Precision, grad_compression: str = "none"
) -> RunPlan:
    """The plan of a run whose config was ``given`` and is now ``settled``."""
    return RunPlan(
        settled,
        str(device),
        precision.reason or precision.name,
        {key: getattr(given, key) for key in SETTLED},
        grad_compression,
    )


AUTO_STEPS = 3  # warm_up_steps=auto on a GPU: cuDNN times its algorithms on the first pass of each shape


def warm_up_steps_for(setting: int | str, device: torch.device) -> int:
    """``warm_up_steps``: a number as given; auto: AUTO_STEPS on a CUDA GPU (autotuning, lazy loading), none
    elsewhere (a CPU has no such first-pass costs worth a separate count)."""
    if setting != "auto":
        return int(setting)
    return AUTO_STEPS if device.type == "cuda" else 0

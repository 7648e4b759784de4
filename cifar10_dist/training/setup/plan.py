"""The planner: every choice a command makes for itself (``auto``, ``find``) is decided here, at once, before
anything is built. ``settle(config, device, data)`` returns a ``Plan``; ``run``, ``lr-find``, ``evaluate``,
``batch-size`` and ``doctor`` read their decisions from it, and ``export --quantize=int8`` asks
``calibration_candidates``. What each rule decides is declared in its key's module
(``data.run_data.settle_data_on_device``, ``data.loader_workers.workers_for``, ``data.batches.settle_augment_per_pass``,
``optimizers.fused_on``, ``process_setup``'s precision, ``layouts``' memory format, ``resumption.decide``); only
this module calls the rules (tests/test_import_floors.py checks it). The choices that read the config alone are
``config_fitting``'s, the planner's torch-free part, made as the config is resolved and again here (a no-op then).

One value is measured, not decided: learning_rate=find, the sweep on the model built from the plan
(``before_training.lr_finding``); the run writes it into its plan's config before training starts. Nothing reads
the plan after that (a test checks it).

A run's plan is logged once as a short table; its config, each choice written as the value taken, is what
config.yaml and every checkpoint's meta record (a run started from that config.yaml makes the same choices)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from cifar10_dist.config import Config, class_weights, per_batch_augmentations
from cifar10_dist.config.export_flags import Calibration, candidates_for
from cifar10_dist.data import batches, loader_workers, run_data
from cifar10_dist.data.datasets import ImageSet, LoadedData
from cifar10_dist.system import ranks
from cifar10_dist.system.precision import Precision, choose_precision
from cifar10_dist.training.setup import config_fitting, layouts, optimizers, process_setup
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
class DataFacts:
    """What the planner reads about a command's data: ``image_sets``, every split data_on_device would move to the
    device (empty: the command feeds no images, so no data choice is made); ``read_images``, what the loaders read
    (num_workers); the number of classes (the model's outputs, for the memory layout) and the training images per
    class (class_weights=auto); ``trains``: whether the images are trained on (augment_per_pass)."""

    image_sets: tuple[ImageSet | None, ...]
    read_images: ImageSet | None
    classes: int
    class_names: tuple[str, ...] = ()
    class_counts: tuple[int, ...] = ()
    trains: bool = True

    @classmethod
    def of_run(cls, images: run_data.RunImages) -> DataFacts:
        """A run's (and lr-find's) images: every split, the training images the loader reads, their classes."""
        classes = images.loaded.info.classes
        counts = torch.bincount(images.held_out.train.labels.cpu(), minlength=len(classes)).tolist()
        return cls(tuple(images.image_sets), images.train_images, len(classes), tuple(classes), tuple(counts))

    @classmethod
    def of_evaluation(cls, loaded: LoadedData) -> DataFacts:
        """``evaluate``'s data: its loader reads the test images."""
        return cls((loaded.train, loaded.test), loaded.test, len(loaded.info.classes), trains=False)

    @classmethod
    def classes_only(cls, classes: int) -> DataFacts:
        """A command that times the model on made-up batches (``batch-size``): only the model's outputs."""
        return cls((), None, classes, trains=False)


@dataclass(frozen=True)
class Plan:
    """Every choice of a command, decided at once: ``config`` with each one written as the value taken (no auto,
    find or resume_from=auto left but learning_rate=find, which a sweep measures; amp_dtype stays auto without
    autocast), and the facts beside it."""

    config: Config
    given: Config  # the config as the command was given it (auto, find, ...)
    device: torch.device
    precision: Precision  # the autocast type chosen, and why
    resumption: Resumption  # whether the run continues, and from which checkpoint
    memory_format: str  # channels_last's choice and why ("" without data)

    @property
    def resume_from(self) -> str | None:
        """The checkpoint the run continues from (None: a fresh start)."""
        return self.config.resume_from

    def table(self, grad_compression: str = "none") -> str:
        """The settled keys, a line each: the value taken, and what was given where it differs."""
        rows = [
            ("device", str(self.device), ""),
            ("precision", self.precision.reason or self.precision.name, ""),
            ("grad_compression", grad_compression, ""),
        ]
        for key in SETTLED:
            taken, given = getattr(self.config, key), getattr(self.given, key)
            rows.append((key, str(taken), "" if taken == given else f"(given: {given})"))
        width = max(len(key) for key, _, _ in rows)
        return "\n".join(f"  {key:<{width}}  {value} {note}".rstrip() for key, value, note in rows)


def settle(
    config: Config, device: torch.device, data: DataFacts | None = None, *, report: bool = True, resumes: bool = False
) -> Plan:
    """Every choice at once, in the order they need each other: the values fitted to the run, the precision,
    whether and from where the run continues (``resumes``: a run's command, ``run``), how the data is fed, the
    optimizer's kernel, the warm-up steps, the class weights and the memory layout. ``data`` None: the choices
    that need no images (``doctor``); ``report``: log the precision chosen (``batch-size`` and ``doctor`` print
    their own report)."""
    given = config
    config = config_fitting.fitted_to_the_run(config)
    precision = process_setup.setup_precision(config, device) if report else precision_unlogged(config, device)
    resumption = resumption_of.decide(config) if resumes else Resumption(False, None)
    choices: dict[str, Any] = {
        **process_setup.settled_precision(config, precision),
        "fused_optimizer": optimizers.fused_on(config.fused_optimizer, device),
        "warm_up_steps": warm_up_steps_for(config.warm_up_steps, device),
        **({"resume_from": resumption.checkpoint} if resumes else {}),
    }
    memory_format = ""
    if data is not None:
        choices.update(data_choices(config, device, data))
        choices.update(class_weights_taken(config, data))
        channels_last, memory_format = layouts.settle_channels_last(config, device, data.classes)
        choices["channels_last"] = channels_last
    return Plan(dataclasses.replace(config, **choices), given, device, precision, resumption, memory_format)


def precision_unlogged(config: Config, device: torch.device) -> Precision:
    """with_amp and amp_dtype as the config gives them, decided for ``device`` without a log line."""
    return choose_precision(device, config.with_amp, config.amp_dtype)


def data_choices(config: Config, device: torch.device, data: DataFacts) -> dict[str, Any]:
    """data_on_device (the images' size against the device's free memory), num_workers (none with the images on
    the device) and, for training, augment_per_pass (the device, where the images are, the augmentations drawn per
    batch); none where the command feeds no images."""
    if not data.image_sets:
        return {}
    on_device = run_data.settle_data_on_device(config.data_on_device, device, list(data.image_sets))
    workers = loader_workers.workers_for(
        config.num_workers, device, data.read_images.images if data.read_images else None
    )
    if config.num_workers == "auto" and not on_device and data.trains:
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
    choices: dict[str, Any] = {"data_on_device": on_device, "num_workers": 0 if on_device else workers}
    if data.trains:
        choices["augment_per_pass"] = batches.settle_augment_per_pass(
            config.augment_per_pass, device, on_device, per_batch_augmentations(config)
        )
    return choices


def class_weights_taken(config: Config, data: DataFacts) -> dict[str, Any]:
    """class_weights=auto as the weights taken from the training images per class; any other value as given."""
    weights = class_weights(config.class_weights)
    if weights is None or not weights.auto or not data.class_counts:
        return {}
    taken = weights.for_counts(list(data.class_counts), list(data.class_names))
    return {"class_weights": ",".join(str(weight) for weight in taken)}


def automatic_choice(device: torch.device) -> Precision:
    """What with_amp=auto picks on ``device``: the precision of a plan for the defaults with it (doctor reports
    it)."""
    return settle(Config(with_amp="auto"), device, report=False).precision


def calibration_candidates(method: str) -> tuple[Calibration, ...]:
    """``export --quantize=int8``'s calibrations to try: all of them for calibration_method=auto (the best on
    held-out training images is kept), else that method's two."""
    return candidates_for(method)


AUTO_STEPS = 3  # warm_up_steps=auto on a GPU: cuDNN times its algorithms on the first pass of each shape


def warm_up_steps_for(setting: int | str, device: torch.device) -> int:
    """``warm_up_steps``: a number as given; auto: AUTO_STEPS on a CUDA GPU (autotuning, lazy loading), none
    elsewhere (a CPU has no such first-pass costs worth a separate count)."""
    if setting != "auto":
        return int(setting)
    return AUTO_STEPS if device.type == "cuda" else 0

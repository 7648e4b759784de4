"""The config rules that tie several keys together (each key's own rules are declared with its field), and
model references."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

from cifar10_dist import sources
from cifar10_dist.config.fields import FIELDS, Config, check_field
from cifar10_dist.config.launch_keys import NATIVE_BACKENDS
from cifar10_dist.errors import UserError

# package.module:factory or path/to/file.py:factory (the factory may be an attribute path: module:Class.create)
MODEL_REFERENCE = re.compile(r"^(?P<source>[^:]+\.py|[A-Za-z_][\w.]*):(?P<attribute>[A-Za-z_][\w.]*)$")


TIMM_PREFIX = "timm:"  # model=timm:NAME is a model of timm's zoo (``pip install 'cifar10-dist[timm]'``)


def is_model_reference(model: str) -> bool:
    """True for a user model (``module:factory`` or ``file.py:factory``) rather than a built-in or timm name."""
    return ":" in model and not model.startswith(TIMM_PREFIX)


def absolute_model_reference(model: str) -> str:
    """A file reference made absolute (it is recorded in config.yaml and checkpoints and used from any folder)."""
    match = MODEL_REFERENCE.match(model)
    if match is None or not match["source"].endswith(".py"):
        return model
    return f"{os.path.abspath(match['source'])}:{match['attribute']}"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


def validate(config: Config) -> None:
    """Reject impossible values before anything starts; each message names the value and what is accepted.
    Each field's own rules are declared with it (``fields.check_field``); the rules below tie several keys together."""
    c = config
    for name in FIELDS:
        check_field(name, getattr(c, name))
    to_fit = c.fit_to_the_run or {}  # values the planner fits to the run (config_fitting): checked once fitted
    _require(
        c.num_warmup_epochs >= 0 and (c.num_warmup_epochs < c.num_epochs or "num_warmup_epochs" in to_fit),
        f"num_warmup_epochs={c.num_warmup_epochs} must be at least 0 and less than num_epochs={c.num_epochs}",
    )
    _require(c.lr_start >= 0 and c.lr_end >= 0, f"lr_start={c.lr_start} and lr_end={c.lr_end} must be 0 or more")
    _require(
        0 <= c.adam_beta1 < 1 and 0 <= c.adam_beta2 < 1,
        f"adam_beta1={c.adam_beta1} and adam_beta2={c.adam_beta2} must be in [0, 1)",
    )
    sources.check(c.dataset, c.label_mode, c.image_size)
    _require(
        c.seeds == 1 or c.resume_from in (None, "auto"),
        f"seeds={c.seeds} with resume_from='{c.resume_from}': one checkpoint cannot continue several runs; use auto",
    )
    _require(
        c.with_amp != "auto" or c.amp_dtype == "auto",
        f"amp_dtype={c.amp_dtype} with with_amp=auto: auto chooses the type itself; give with_amp=True to choose it",
    )
    _require(
        not (c.compile and c.backend == "xla-tpu"),
        "compile=True is not supported with backend xla-tpu (XLA compiles the graph itself): leave compile off",
    )
    _require(
        c.resume_from != "auto" or c.run_name is not None,
        "resume_from=auto needs run_name: the run folder (output_path/run_name) to continue",
    )
    _require(
        not (c.overwrite and c.resume_from is not None),
        f"overwrite=True and resume_from='{c.resume_from}' contradict each other: continue or start afresh, not both",
    )
    _validate_training_options(c)
    _validate_launch(c)


def _validate_training_options(c: Config) -> None:
    """The model reference, accumulation, freezing, lookahead, early stopping, a trial, calibration, Muon and a
    teacher; then the schedule, augmentations and speed levers."""
    _require(
        not is_model_reference(c.model) or MODEL_REFERENCE.match(c.model) is not None,
        f"model='{c.model}' is not a model reference: write package.module:factory or path/to/file.py:factory",
    )
    _require(
        c.checkpoint_every % c.accumulation_steps == 0 or "checkpoint_every" in (c.fit_to_the_run or {}),
        f"checkpoint_every={c.checkpoint_every} must be a multiple of accumulation_steps={c.accumulation_steps}: "
        "checkpoints are taken after optimizer steps",
    )
    _require(
        c.freeze_epochs < c.num_epochs,
        f"freeze_epochs={c.freeze_epochs} must be less than num_epochs={c.num_epochs}: the whole model trains after",
    )
    _require(
        not (c.periodic_averaging and c.accumulation_steps > 1),
        f"periodic_averaging=True counts iterations as optimizer steps: it cannot be combined with "
        f"accumulation_steps={c.accumulation_steps}",
    )
    _require(
        c.early_stopping_patience is None or c.val_split > 0,
        f"early_stopping_patience={c.early_stopping_patience} needs val_split > 0 (e.g. --val_split=0.1): with "
        "val_split=0 it would stop on test accuracy, and the test set would no longer be unseen",
    )
    _require(c.trial is None or c.val_split > 0, "a tuning trial needs val_split > 0: trials never see the test set")
    _require(
        c.calibrate is None or c.val_split > 0 or sources.source_of(c.dataset).own_val,
        f"calibrate={c.calibrate} fits the temperature on a validation split, never on the test set: give "
        "val_split > 0 (e.g. --val_split=0.1)",
    )
    _require(
        c.muon_lr is None or c.optimizer == "sgd",
        f"muon_lr={c.muon_lr} with optimizer={c.optimizer}: Muon trains the filters next to SGD; use "
        "optimizer=sgd, or leave muon_lr unset",
    )
    _require(
        c.teacher_pretrained is None or c.teacher is not None,
        f"teacher_pretrained={c.teacher_pretrained} names the weights of a teacher: give --teacher=MODEL too",
    )
    _validate_schedule_and_augmentation(c)
    _validate_speed_levers(c)


def _validate_schedule_and_augmentation(c: Config) -> None:
    """learning_rate=find's limits, the step schedule's milestones, the augmentations' magnitudes, class weights
    and SyncBatchNorm."""
    _require(
        c.learning_rate != "find" or c.muon_lr is None,
        f"learning_rate=find with muon_lr={c.muon_lr}: the sweep keeps muon_lr's ratio to learning_rate, and "
        "find gives no learning_rate to take it from; run cifar10-dist lr-find with both numbers (it suggests "
        "both) and train with what it prints",
    )
    _require(
        c.learning_rate != "find" or c.trial is None,
        "learning_rate=find in a tuning trial: give the trials a learning_rate (or search it in the space)",
    )
    milestones, to_fit = milestone_epochs(c.lr_milestones), c.fit_to_the_run or {}
    _require(
        c.lr_schedule == "step" or not milestones,
        f"lr_milestones={c.lr_milestones} is for lr_schedule=step, not {c.lr_schedule}",
    )
    _require(
        c.lr_schedule != "step" or bool(milestones),
        "lr_schedule=step needs lr_milestones: the epochs at which the lr drops, e.g. --lr_milestones=30,60",
    )
    _require(
        all((c.num_warmup_epochs < m or "num_warmup_epochs" in to_fit) and m < c.num_epochs for m in milestones)
        and milestones == sorted(set(milestones)),
        f"lr_milestones={c.lr_milestones} must increase and lie between num_warmup_epochs={c.num_warmup_epochs} "
        f"and num_epochs={c.num_epochs}",
    )
    magnitude, ranges = c.auto_augment_magnitude, {"randaugment": (0, 30), "trivialaugment": (2, 31)}
    _require(
        magnitude is None or c.auto_augment in ranges,
        f"auto_augment_magnitude={magnitude} is for randaugment or trivialaugment, not auto_augment={c.auto_augment}",
    )
    low, high = ranges.get(c.auto_augment, (0, 0))
    _require(
        magnitude is None or low <= magnitude <= high,
        f"auto_augment_magnitude={magnitude} is out of range for {c.auto_augment}: {low}..{high}",
    )
    class_weights(c.class_weights)
    _require(
        c.class_weights is None or c.sampler != "balanced",
        f"class_weights={c.class_weights} with sampler=balanced corrects the same imbalance twice: choose one",
    )
    _require(
        not c.sync_bn or c.backend == "nccl",
        f"sync_bn=True with backend={c.backend}: torch's SyncBatchNorm computes on GPUs only; it needs "
        "backend=nccl (and several processes)",
    )


def per_batch_augmentations(c: Config) -> list[str]:
    """The settings whose augmentation is drawn or cut batch by batch (``augment_per_pass`` cuts pad-crops and
    flips only), as key=value."""
    found = {
        "random_resized_crop": c.random_resized_crop > 0,
        "resize_start": c.resize_start < 1,
        "auto_augment": c.auto_augment != "none",
        "random_erasing": c.random_erasing > 0,
        "color_jitter": c.color_jitter > 0,
        "mixup_alpha": c.mixup_alpha > 0,
        "cutmix_alpha": c.cutmix_alpha > 0,
    }
    return [f"{name}={getattr(c, name)}" for name, on in found.items() if on]


def _validate_speed_levers(c: Config) -> None:
    """augment_per_pass=True and low_precision_weights=True: what each needs."""
    if c.augment_per_pass is True:
        _require(
            c.data_on_device is not False,
            "augment_per_pass=True cuts each pass on the training device: it needs data_on_device=True (or auto)",
        )
        others = per_batch_augmentations(c)
        _require(
            not others,
            f"augment_per_pass=True cuts pad-crops and flips only, and {', '.join(others)} "
            "augments batch by batch: leave augment_per_pass=auto (it is then off) or turn those off",
        )
    _require(
        not c.low_precision_weights or (c.with_amp is not False and c.amp_dtype != "float16"),
        f"low_precision_weights=True keeps the weights in bf16: it needs bf16 training (with_amp=auto or True with "
        f"amp_dtype=bfloat16), not with_amp={c.with_amp}, amp_dtype={c.amp_dtype}",
    )


@dataclass(frozen=True)
class ClassWeights:
    """class_weights parsed: ``auto`` (N / (C x n_c) for the n_c training images of class c) or one weight per class
    (``values``)."""

    auto: bool
    values: tuple[float, ...] = ()
    setting: str = ""  # as given, for messages

    def check(self, classes: Sequence[str]) -> None:
        """One weight per class (a UserError naming both counts)."""
        if not self.auto and len(self.values) != len(classes):
            raise UserError(
                f"class_weights={self.setting} gives {len(self.values)} weights for the {len(classes)} "
                f"classes {', '.join(classes[:6])}{'...' if len(classes) > 6 else ''}: give one per class"
            )

    def for_counts(self, counts: Sequence[int], classes: Sequence[str]) -> list[float]:
        """One weight per class for these training image counts per class (auto: 1 for every class when they are
        balanced; 0 for a class without training images)."""
        self.check(classes)
        if not self.auto:
            return list(self.values)
        total = sum(counts)
        return [round(total / (len(counts) * count), 6) if count else 0.0 for count in counts]


def class_weights(setting: str | None) -> ClassWeights | None:
    """The one parser of class_weights: None when unset; a UserError naming a value that is not a weight."""
    if setting is None:
        return None
    if str(setting) == "auto":
        return ClassWeights(auto=True, setting="auto")
    try:
        values = [float(part) for part in str(setting).split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or not all(value >= 0 and value < float("inf") for value in values) or not any(values):
        raise UserError(
            f"class_weights='{setting}' must be auto or one weight per class (0 or more, not all 0) "
            "separated by commas, e.g. 1,1,5"
        )
    return ClassWeights(auto=False, values=tuple(values), setting=str(setting))


def milestone_epochs(milestones: str | None) -> list[float]:
    """lr_milestones as numbers ([] when None); a UserError naming a value that is not one."""
    if milestones is None:
        return []
    try:
        return [float(part) for part in str(milestones).split(",") if part.strip()]
    except ValueError:
        raise UserError(f"lr_milestones='{milestones}' must be epochs separated by commas, e.g. 30,60") from None


def _validate_launch(c: Config) -> None:
    """Spawning keys need a backend; several nodes need their rank and node 0's address; gradient compression a
    process group with DDP's hooks."""
    _require(
        c.grad_compression == "none" or c.backend in NATIVE_BACKENDS,
        f"grad_compression={c.grad_compression} compresses the gradients processes exchange, through DDP's "
        "communication hooks (backends gloo and nccl): "
        + (
            "this run is one process without a process group; leave grad_compression=none, or launch several "
            "(--backend=gloo --nproc_per_node=N, torchrun, srun). To continue a run that had it in one process, "
            "give --backend=gloo --nproc_per_node=1 (compression does nothing there)"
            if c.backend is None
            else f"backend={c.backend} has none; leave grad_compression=none"
        ),
    )
    if c.backend is None:
        for key in ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port"):
            _require(
                getattr(c, key) is None,
                f"{key}={getattr(c, key)} needs a distributed backend: add --backend=gloo (CPU) or nccl (GPU)",
            )
        _require(c.init_method == "env://", f"init_method='{c.init_method}' needs backend gloo or nccl")
        return
    _validate_init_method(c)
    nnodes = c.nnodes or 1
    if nnodes > 1 or c.node_rank is not None:
        _require(c.nproc_per_node is not None, "nnodes and node_rank are for spawning: give nproc_per_node too")
    if nnodes > 1:
        _require(
            c.node_rank is not None and 0 <= c.node_rank < nnodes,
            f"node_rank={c.node_rank} must be given and in 0..{nnodes - 1} when nnodes={nnodes}",
        )
        _require(
            c.init_method != "env://" or (c.master_addr is not None and c.master_port is not None),
            f"nnodes={nnodes} needs master_addr and master_port (the address and a free port of node 0)",
        )


def _validate_init_method(c: Config) -> None:
    """env:// (MASTER_ADDR/PORT) or file:// (a shared file system); Ignite refuses tcp:// because it hangs."""
    accepted = "env:// or file:///path/on/a/shared/filesystem"
    if c.init_method == "env://":
        return
    _require(c.init_method.startswith("file:///"), f"init_method='{c.init_method}' is not accepted: use {accepted}")
    _require(
        c.backend in NATIVE_BACKENDS,
        f"init_method='{c.init_method}' works with backend gloo or nccl only, not '{c.backend}'",
    )
    _require(
        c.master_addr is None and c.master_port is None,
        f"init_method='{c.init_method}' replaces master_addr/master_port: drop them",
    )


def planned_world_size(config: Config) -> int | None:
    """World size known from the config alone (internal spawning or one process), else None (torchrun decides)."""
    if config.backend is None:
        return 1
    if config.nproc_per_node is not None:
        return config.nproc_per_node * (config.nnodes or 1)
    return None

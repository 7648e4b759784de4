"""The run configuration: one typed dataclass, the single source of defaults, help texts and validation.

Precedence: dataclass defaults < YAML file (``--config``) < keyword overrides (command line or Python).
This module is plain data: it imports nothing heavier than PyYAML, and its checks look at the values only;
checks against the filesystem, the model registry and the launch environment are in ``checks``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Collection, Optional, Union

import yaml

from cifar10_dist.errors import UserError, first_line

BACKENDS = ("gloo", "nccl", "xla-tpu", "horovod")
DATASETS = ("cifar10", "cifar100", "synthetic", "folder")
LABEL_MODES = ("fine", "coarse")
FLIPS = ("random", "alternating", "none")
PAD_MODES = ("zeros", "reflect")
AMP_DTYPES = ("auto", "float16", "bfloat16")
PRUNERS = ("median", "hyperband", "none")
OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("linear", "cosine", "step")
AUTO_AUGMENTS = ("none", "trivialaugment", "randaugment", "autoaugment")
LIST_FIELDS = ("lr_milestones",)  # str fields holding comma-separated numbers (fire gives a tuple for 30,60)


def option(default: Any, help: str, also: tuple[str, ...] = ()) -> Any:
    """A config field with its one-line help text; ``also``: words accepted besides the field's type."""
    return field(default=default, metadata={"help": help, "also": also})


@dataclass(frozen=True)
class PrunerSpec:
    """A study's pruner as plain data: a study keeps its pruner in the process, not in the storage, so a trial's
    processes build the same one from this (``trials.make_pruner``)."""

    name: str = "median"  # one of PRUNERS
    startup_trials: int = 5  # median: trials that are never pruned, the first ones
    warmup_epochs: int = 0  # median: epochs of a trial that are never pruned
    max_epochs: int = 1  # hyperband: the largest resource, the trials' num_epochs


@dataclass(frozen=True)
class TrialSpec:
    """The Optuna trial a run is (``Config.trial``, set by tune): where its study is, its number, the values tried
    and the pruner, so that each of its processes reaches the trial through the storage."""

    study: str
    storage: str
    number: int
    params: dict[str, Any]
    pruner: PrunerSpec = PrunerSpec()

    @classmethod
    def from_mapping(cls, values: Any) -> TrialSpec:
        """A spec from config.yaml's ``trial`` mapping (a trial's run resumed or run again), or one line naming
        what is missing or wrong."""
        if isinstance(values, TrialSpec):
            return values
        keys = {f.name for f in dataclasses.fields(cls)}
        pruner_keys = {f.name for f in dataclasses.fields(PrunerSpec)}
        if (not isinstance(values, dict) or not {"study", "storage", "number", "params"} <= set(values) <= keys
                or not isinstance(values.get("pruner", {}), dict) or not set(values.get("pruner", {})) <= pruner_keys):
            raise UserError(f"trial={values!r} is not a tuning trial: expected study, storage, number, params and "
                            f"pruner ({', '.join(sorted(pruner_keys))}); tune sets this key, leave it out")
        pruner = PrunerSpec(**values.get("pruner", {}))
        return cls(**{**values, "params": dict(values["params"]), "pruner": pruner})


@dataclass(frozen=True)
class Config:
    """Everything a training or evaluation run needs. Defaults follow the Ignite CIFAR-10 tutorial."""

    # data
    dataset: str = option("cifar10", "cifar10 or cifar100 (files in data_path), synthetic (generated in memory), or "
                          "folder (data_path/train/<class>/<images>, optionally test/ and val/: docs/your-data.md)")
    data_path: str = option("cifar10", "folder holding cifar-10-batches-py or cifar-100-python (downloaded there when "
                            "missing)")
    label_mode: str = option("fine", "CIFAR-100 labels: fine (100 classes) or coarse (20 superclasses)")
    download: bool = option(True, "download CIFAR-10 into data_path when it is missing (False: fail at once)")
    image_size: int = option(32, "dataset=folder: images are stored and trained at this size (shorter side scaled, "
                             "centre crop); CIFAR is 32")
    skip_bad_images: bool = option(False, "dataset=folder: train without unreadable image files (else refused, "
                                   "naming them)")
    drop_test_duplicates: bool = option(False, "dataset=folder: remove test/val images that are exact copies of "
                                        "training images (always counted and warned about)")
    cache_dir: Optional[str] = option(None, "dataset=folder: where the decoded images are cached (default: "
                                      "data_path/.cifar10_dist_cache)")
    synthetic_size: int = option(5000, "training images when dataset=synthetic (test set: a fifth of it)")
    num_workers: int = option(2, "DataLoader worker processes per node (split over local processes)")
    train_eval_size: int = option(5000, "size of the fixed, non-augmented train subset used for train metrics")
    val_split: float = option(0.0, "fraction of training images held out for validation and best-model choice; "
                              "test set then used once at the end (0: validate on the test set)")
    val_seed: int = option(0, "seed of the held-out choice (independent of seed and world size)")
    data_on_device: bool = option(False, "keep all images on the training device as uint8 and slice batches there "
                                  "(GPU: no host copies; num_workers unused)")
    # augmentation
    crop_padding: int = option(4, "pixels of padding before the random 32x32 crop (0: no crop)")
    crop_pad_mode: str = option("zeros", "padding for the crop: zeros or reflect")
    flip: str = option("random", "horizontal flip: random (per image), alternating (half the images pre-flipped, "
                       "all flipped every other epoch) or none")
    auto_augment: str = option("none", "a torchvision.transforms.v2 policy per training image: none, trivialaugment, "
                               "randaugment or autoaugment (its CIFAR-10 policy)")
    auto_augment_magnitude: Optional[int] = option(None, "randaugment: magnitude 0..30 (default 9); trivialaugment: "
                                                   "number of magnitude bins 2..31 (default 31)")
    random_erasing: float = option(0.0, "probability of erasing a random rectangle of each training image "
                                   "(torchvision's RandomErasing), 0..1")
    mixup_alpha: float = option(0.0, "MixUp's Beta(alpha, alpha) for training batches (0: off; with cutmix_alpha, "
                                "one of the two per batch)")
    cutmix_alpha: float = option(0.0, "CutMix's Beta(alpha, alpha) for training batches (0: off)")
    # model and optimisation
    model: str = option("resnet18", "torchvision classification model, cifar_resnet18/34/50, airbench, simple_cnn, or "
                        "your own: package.module:factory or path/to/file.py:factory")
    model_kwargs: Optional[dict] = option(None, "keyword arguments of the model's factory, a JSON object "
                                          "(e.g. '{\"width\": 64}')")
    seed: int = option(543, "random seed of model init, shuffling and augmentation (distinct per rank and iteration)")
    seeds: int = option(1, "train this many times, with seed, seed+1, ...; report mean, std, min and max")
    deterministic: bool = option(False, "deterministic algorithms only (torch, cuDNN, cuBLAS); errors where none exists")
    batch_size: int = option(512, "global batch size, split evenly over all processes")
    accumulation_steps: int = option(1, "sum the gradients of N consecutive batches (each loss divided by N) before "
                                     "one optimizer step: effective batch = batch_size x N; the LR schedule, "
                                     "checkpoint_every and logging count batches (iterations)")
    optimizer: str = option("sgd", "sgd or adamw (torch.optim.AdamW: adam_beta1, adam_beta2, adam_eps)")
    learning_rate: float = option(0.4, "peak learning rate reached after the warmup")
    momentum: float = option(0.9, "SGD momentum")
    nesterov: bool = option(True, "use Nesterov momentum")
    weight_decay: float = option(1e-4, "weight decay (SGD's L2 term, AdamW's decoupled decay)")
    norm_weight_decay: Optional[float] = option(None, "weight decay of normalisation layers' weights and biases "
                                                "(None: weight_decay), as torchvision's reference names it")
    bias_weight_decay: Optional[float] = option(None, "weight decay of every bias (None: weight_decay; before "
                                                "norm_weight_decay for norm biases)")
    adam_beta1: float = option(0.9, "adamw: beta1")
    adam_beta2: float = option(0.999, "adamw: beta2")
    adam_eps: float = option(1e-8, "adamw: eps")
    clip_grad_norm: Optional[float] = option(None, "clip the gradient's total norm to this (after unscaling under "
                                             "fp16; the accumulated gradient); the pre-clip norm is logged")
    sync_bn: bool = option(False, "convert BatchNorm to SyncBatchNorm over all processes (nccl: torch's "
                           "SyncBatchNorm computes on GPUs only)")
    label_smoothing: float = option(0.0, "label smoothing of the training loss (evaluation loss is plain)")
    bias_lr_scale: float = option(1.0, "learning-rate factor for normalisation-layer biases (their weight decay is "
                                  "divided by it, so the decay per step stays)")
    whitening_bias_lr_scale: float = option(1.0, "learning-rate factor for the airbench whitening bias (weight decay "
                                            "divided by it)")
    whitening_bias_epochs: float = option(3.0, "epochs the airbench whitening bias trains before it freezes, as "
                                          "airbench does")
    whitening_bias_decay: bool = option(False, "the whitening bias's lr falls linearly from its peak to 0 over "
                                        "whitening_bias_epochs (airbench94_muon) instead of following the schedule")
    muon_lr: Optional[float] = option(None, "train the convolution filters with torch.optim.Muon at this peak lr "
                                      "(torch 2.9+; the rest with SGD), as airbench94_muon does; follows the same "
                                      "schedule")
    muon_momentum: float = option(0.6, "Muon's Nesterov momentum (with muon_lr)")
    muon_ns_steps: int = option(3, "Muon's Newton-Schulz iterations per step (with muon_lr)")
    num_epochs: int = option(5, "number of training epochs")
    num_warmup_epochs: float = option(1.0, "epochs (may be fractional) of linear warmup to learning_rate, then "
                                      "linear decay")
    lr_start: float = option(0.0, "learning rate at iteration 0, as a fraction of learning_rate")
    lr_end: float = option(0.0, "learning rate at the last iteration, as a fraction of learning_rate")
    lr_schedule: str = option("linear", "after the warmup: linear (to lr_end), cosine (torch's CosineAnnealingLR "
                              "to lr_end) or step (x lr_gamma at each of lr_milestones)")
    lr_milestones: Optional[str] = option(None, "step: epochs at which the lr is multiplied by lr_gamma, e.g. 30,60")
    lr_gamma: float = option(0.1, "step: the factor at each milestone")
    ema_decay: Optional[float] = option(None, "keep an exponential moving average of the weights, this decay per "
                                        "optimizer step (e.g. 0.999), warmed up from 0.9 over the LR warm-up; it is "
                                        "evaluated next to the model, chooses the best model and takes the test")
    lookahead: bool = option(False, "airbench's lookahead: from 30% of training, every 5 steps move the weights "
                             "to an EMA of them whose decay grows to 0.77")
    epoch_length: Optional[int] = option(None, "iterations per epoch (default: one pass over the training set)")
    # speed
    with_amp: Union[bool, str] = option(False, "mixed precision: auto (what the hardware runs fast: bf16 on CPUs with "
                                        "AMX or AVX512-BF16, fp32 on other CPUs; bf16 on GPUs of compute capability "
                                        "8.0+, else fp16 + GradScaler; bf16 on XLA), True (fp16 + GradScaler on CUDA, "
                                        "bf16 elsewhere, even where slow) or False (fp32)", also=("auto",))
    amp_dtype: str = option("auto", "with_amp=True's type: auto (fp16 + GradScaler on CUDA, bf16 on CPU and XLA), "
                            "float16 (with a GradScaler) or bfloat16 (on GPUs that have it: no GradScaler)")
    channels_last: bool = option(False, "channels-last memory format for model and inputs")
    keep_freed_memory: bool = option(True, "CPU training on Linux (glibc): freed memory stays in the process for reuse "
                                     "instead of going back to the OS after every step (wide batches train up to "
                                     "1.4x faster; the process keeps its peak memory until it exits)")
    compile: bool = option(False, "torch.compile the model (a minute or more of warm-up; checkpoints stay plain)")
    tf32: bool = option(True, "allow TF32 matmuls and convolutions on Ampere or newer GPUs (ignored elsewhere)")
    cudnn_benchmark: bool = option(True, "let cuDNN time and pick convolution algorithms (GPU; off if deterministic)")
    # evaluation, checkpoints, logging
    validate_every: int = option(3, "validate every N epochs (and always once at the end)")
    early_stopping_patience: Optional[int] = option(None, "stop after this many validations without a val accuracy "
                                                    "gain above early_stopping_min_delta (needs val_split > 0)")
    early_stopping_min_delta: float = option(0.0, "smallest val accuracy gain that counts as an improvement")
    tta: int = option(0, "test-time augmentation of val/test evaluations: 0 none, 1 mirror, 2 mirror and 1-pixel "
                      "shifts (6 views)")
    checkpoint_every: int = option(200, "save a training checkpoint every N iterations (the last 2 are kept)")
    log_every_iters: int = option(15, "log the training loss every N iterations")
    output_path: str = option("output-cifar10/", "parent folder of run folders")
    run_name: Optional[str] = option(None, "run folder name under output_path (default: model_backend-B-N_time)")
    resume_from: Optional[str] = option(None, "training checkpoint to resume from, or auto: the newest in the run folder")
    overwrite: bool = option(False, "start afresh in a run folder that holds a run: the old folder is moved aside to "
                             "NAME.replaced-<time>, never deleted")
    with_clearml: bool = option(False, "track the run with ClearML (pip install cifar10-dist[clearml])")
    clearml_project: str = option("cifar10_dist", "ClearML project name (the task is named after the run folder)")
    clearml_offline: bool = option(False, "ClearML without a server: record the session locally for a later import")
    # launch
    backend: Optional[str] = option(None, "distributed backend: gloo, nccl, xla-tpu, horovod (default: none)")
    nproc_per_node: Optional[int] = option(None, "processes to spawn on this node (not under torchrun)")
    nnodes: Optional[int] = option(None, "number of nodes when spawning (with nproc_per_node)")
    node_rank: Optional[int] = option(None, "rank of this node when spawning over several nodes")
    master_addr: Optional[str] = option(None, "address of node 0 when spawning over several nodes")
    master_port: Optional[int] = option(None, "free TCP port on node 0 when spawning (default: a free one, 1 node)")
    init_method: str = option("env://", "how gloo/nccl processes find each other: env:// or file:///shared/fresh-file")
    dist_timeout: int = option(1800, "seconds a process waits for the others in a gloo/nccl collective before failing")
    # set by tune
    trial: Optional[TrialSpec] = option(None, "set by tune: the Optuna trial this run is (study, storage, number, params); "
                                   "rank 0 reports each val accuracy there and the run may be pruned; no test set")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(Config)}


def load_config(config_file: str | Path | None = None, *, given: Collection[str] | None = None,
                **overrides: Any) -> Config:
    """Build and validate a Config: defaults, then the YAML file, then ``overrides``. ``given``: the keys the user
    set explicitly (default: all of ``overrides``); the others may be adjusted (``_checkpoints_after_steps``)."""
    from_file = read_yaml_mapping(Path(config_file)) if config_file is not None else {}
    values = {**from_file, **overrides}
    for key in values:
        _check_known(key, source=f"in {config_file}" if key not in overrides else "")
    typed = {key: _coerce(key, value) for key, value in values.items()}
    if "model" in typed:
        typed["model"] = absolute_model_reference(typed["model"])
    explicit = set(overrides if given is None else given)
    if "checkpoint_every" not in explicit:
        source = ("the default" if "checkpoint_every" not in values
                  else f"from {config_file}" if config_file is not None else "from the config given")
        _checkpoints_after_steps(typed, source)
    if "num_warmup_epochs" not in explicit and "num_epochs" in explicit:
        _warmup_within_a_shorter_run(typed, from_file, config_file)
    config = Config(**typed)
    validate(config)
    return config


def _checkpoints_after_steps(typed: dict[str, Any], source: str) -> None:
    """A checkpoint_every the user did not set (a config file's or the default) rounded up to a multiple of
    accumulation_steps, with one INFO line; one set explicitly is refused by ``validate`` instead."""
    steps = typed.get("accumulation_steps", FIELDS["accumulation_steps"].default)
    every = typed.get("checkpoint_every", FIELDS["checkpoint_every"].default)
    if steps < 1 or every < 1 or every % steps == 0:
        return  # validate() names a bad value
    typed["checkpoint_every"] = -(-every // steps) * steps
    note(f"checkpoint_every={every} ({source}) rounded up to {typed['checkpoint_every']}, a multiple of "
         f"accumulation_steps={steps}: checkpoints are taken after optimizer steps")


def _warmup_within_a_shorter_run(typed: dict[str, Any], from_file: dict[str, Any], config_file: Any) -> None:
    """A warmup the user did not set (a config file's or the default) that a shorter num_epochs, set explicitly,
    leaves no room after, scaled to the same share of the run, with one INFO line (``--num_epochs=1`` on any
    shipped config is a smoke test); a warmup set explicitly is refused by ``validate`` instead."""
    warmup = typed.get("num_warmup_epochs", FIELDS["num_warmup_epochs"].default)
    epochs = typed["num_epochs"]
    if not isinstance(warmup, float) or not isinstance(epochs, int) or epochs < 1 or warmup < epochs:
        return  # fits, or validate() names a bad value
    planned = _coerce("num_epochs", from_file.get("num_epochs", FIELDS["num_epochs"].default))
    source = f"from {config_file}" if "num_warmup_epochs" in from_file else "the default"
    if planned <= warmup:
        return  # the file's own warmup does not fit its own epochs: validate() refuses it
    typed["num_warmup_epochs"] = round(warmup * epochs / planned, 4)
    note(f"num_warmup_epochs={warmup} ({source}) scaled to {typed['num_warmup_epochs']} for num_epochs={epochs}: "
         f"the same share of the run as {warmup} of {planned} epochs")


def note(message: str) -> None:
    """An INFO line about the config, before any run logs: through the package's logger when the caller set it up,
    else on stderr in the runs' format."""
    package_logger = logging.getLogger("cifar10_dist")
    if package_logger.handlers:
        package_logger.info(message)
    else:
        print(f"{datetime.now():%H:%M:%S} INFO {message}", file=sys.stderr)


def read_yaml_mapping(path: Path, what: str = "config file", example: str = "configs/default.yaml") -> dict[str, Any]:
    """A YAML file holding a mapping ({} when empty); every other case one line naming the file (``what``) and
    what is wanted (a YAML file like ``example``)."""
    if path.is_dir():
        raise UserError(f"{what} '{path}' is a folder: give a YAML file (e.g. {example})")
    if not path.is_file():
        raise UserError(f"{what} '{path}' does not exist: give a path to a YAML file (e.g. {example})")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise UserError(f"{what} '{path}' is not valid YAML: {first_line(error)}") from error
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UserError(f"{what} '{path}' must hold a mapping of key: value, not {type(loaded).__name__}")
    return loaded


def _check_known(key: str, source: str = "") -> None:
    if key in FIELDS:
        return
    where = f" {source}" if source else ""
    close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else "run with --help to list the valid keys"
    raise UserError(f"unknown config key '{key}'{where}: {hint}")


def _field_type(name: str) -> tuple[type, bool]:
    """(base type, accepts None) of a field, from its annotation."""
    annotation = typing.get_type_hints(Config)[name]
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if type(None) in args:
            (base,) = [arg for arg in args if arg is not type(None)]
            return base, True
        return args[0], False  # bool | str: a bool, or one of the field's ``also`` words
    return annotation, False


def _coerce(name: str, value: Any) -> Any:
    """Convert a YAML/command-line value to the field's type, or raise a UserError naming both."""
    base, optional = _field_type(name)
    also = FIELDS[name].metadata["also"]
    if isinstance(value, str) and value.lower() in also:
        return value.lower()
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise UserError(f"{name}=None is not accepted: expected {base.__name__}")
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif base is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)  # fire turns --run_name=7 into the int 7
        if name in LIST_FIELDS and isinstance(value, (list, tuple)):
            return ",".join(str(item) for item in value)  # fire turns --lr_milestones=30,60 into (30, 60)
    elif base is dict:
        return _json_object(name, value)
    elif base is TrialSpec:
        return TrialSpec.from_mapping(value)
    type_name = " or ".join([base.__name__, *also, *(["None"] if optional else [])])
    raise UserError(f"{name}={value!r} has the wrong type: expected {type_name}")


def _json_object(name: str, value: Any) -> dict[str, Any]:
    """A mapping as given (fire and YAML parse one), or a JSON object text, made of JSON values only."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise UserError(f"{name}={value!r} is not valid JSON ({error.msg}): give an object, e.g. '{{\"width\": 64}}'"
                            ) from error
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise UserError(f"{name}={value!r} must be a JSON object with string keys, e.g. '{{\"width\": 64}}'")
    try:
        return json.loads(json.dumps(value))  # plain JSON values only (they go into config.yaml and checkpoints)
    except (TypeError, ValueError) as error:
        raise UserError(f"{name}={value!r} holds a value JSON cannot carry: {error}") from error


# package.module:factory or path/to/file.py:factory (the factory may be an attribute path: module:Class.create)
MODEL_REFERENCE = re.compile(r"^(?P<source>[^:]+\.py|[A-Za-z_][\w.]*):(?P<attribute>[A-Za-z_][\w.]*)$")


def is_model_reference(model: str) -> bool:
    """True for a user model (``module:factory`` or ``file.py:factory``) rather than a built-in name."""
    return ":" in model


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
    """Reject impossible values before anything starts; each message names the value and what is accepted."""
    c = config
    _validate_data(c)
    _require(c.num_workers >= 0, f"num_workers={c.num_workers} must be 0 or more")
    _require(c.train_eval_size >= 0, f"train_eval_size={c.train_eval_size} must be 0 (off) or more")
    _require(c.seeds >= 1, f"seeds={c.seeds} must be at least 1")
    _require(
        c.seeds == 1 or c.resume_from in (None, "auto"),
        f"seeds={c.seeds} with resume_from='{c.resume_from}': one checkpoint cannot continue several runs; use auto",
    )
    _require(0 <= c.val_split < 1, f"val_split={c.val_split} must be in [0, 1), e.g. 0.1")
    _require(c.batch_size >= 1, f"batch_size={c.batch_size} must be at least 1")
    _require(0 <= c.crop_padding <= 16, f"crop_padding={c.crop_padding} must be in 0..16 pixels")
    _require(c.crop_pad_mode in PAD_MODES, f"crop_pad_mode='{c.crop_pad_mode}' is unknown: choose {' or '.join(PAD_MODES)}")
    _require(c.flip in FLIPS, f"flip='{c.flip}' is unknown: choose one of {', '.join(FLIPS)}")
    _require(0 <= c.label_smoothing < 1, f"label_smoothing={c.label_smoothing} must be in [0, 1)")
    _require(c.bias_lr_scale > 0, f"bias_lr_scale={c.bias_lr_scale} must be greater than 0")
    _require(c.whitening_bias_lr_scale > 0, f"whitening_bias_lr_scale={c.whitening_bias_lr_scale} must be greater "
                                            "than 0")
    _require(c.whitening_bias_epochs > 0, f"whitening_bias_epochs={c.whitening_bias_epochs} must be greater than 0")
    _require(c.lr_start >= 0 and c.lr_end >= 0, f"lr_start={c.lr_start} and lr_end={c.lr_end} must be 0 or more")
    _require(c.amp_dtype in AMP_DTYPES, f"amp_dtype='{c.amp_dtype}' is unknown: choose one of {', '.join(AMP_DTYPES)}")
    _require(c.with_amp != "auto" or c.amp_dtype == "auto",
             f"amp_dtype={c.amp_dtype} with with_amp=auto: auto chooses the type itself; give with_amp=True to choose it")
    _require(c.tta in (0, 1, 2), f"tta={c.tta} is not accepted: choose 0 (none), 1 (mirror) or 2 (mirror + shifts)")
    _require(
        not (c.compile and c.backend == "xla-tpu"),
        "compile=True is not supported with backend xla-tpu (XLA compiles the graph itself): leave compile off",
    )
    _require(c.learning_rate > 0, f"learning_rate={c.learning_rate} must be greater than 0")
    _require(0 <= c.momentum < 1, f"momentum={c.momentum} must be in [0, 1)")
    _require(c.weight_decay >= 0, f"weight_decay={c.weight_decay} must be 0 or more")
    _require(c.num_epochs >= 1, f"num_epochs={c.num_epochs} must be at least 1")
    _require(
        0 <= c.num_warmup_epochs < c.num_epochs,
        f"num_warmup_epochs={c.num_warmup_epochs} must be at least 0 and less than num_epochs={c.num_epochs}",
    )
    _require(c.epoch_length is None or c.epoch_length >= 1, f"epoch_length={c.epoch_length} must be at least 1")
    _require(c.validate_every >= 1, f"validate_every={c.validate_every} must be at least 1")
    _require(c.checkpoint_every >= 1, f"checkpoint_every={c.checkpoint_every} must be at least 1")
    _require(c.log_every_iters >= 1, f"log_every_iters={c.log_every_iters} must be at least 1")
    _require(c.run_name is None or _is_plain_name(c.run_name), f"run_name='{c.run_name}' must be a plain folder name")
    _require(
        c.resume_from != "auto" or c.run_name is not None,
        "resume_from=auto needs run_name: the run folder (output_path/run_name) to continue",
    )
    _require(
        not (c.overwrite and c.resume_from is not None),
        f"overwrite=True and resume_from='{c.resume_from}' contradict each other: continue or start afresh, not both",
    )
    _require(c.dist_timeout >= 1, f"dist_timeout={c.dist_timeout} must be at least 1 second")
    _validate_training_options(c)
    _validate_launch(c)


def _validate_training_options(c: Config) -> None:
    """The model reference, gradient accumulation and early stopping."""
    _require(
        not is_model_reference(c.model) or MODEL_REFERENCE.match(c.model) is not None,
        f"model='{c.model}' is not a model reference: write package.module:factory or path/to/file.py:factory",
    )
    _require(c.accumulation_steps >= 1, f"accumulation_steps={c.accumulation_steps} must be at least 1 (1: no "
                                        "accumulation)")
    _require(
        c.checkpoint_every % c.accumulation_steps == 0,
        f"checkpoint_every={c.checkpoint_every} must be a multiple of accumulation_steps={c.accumulation_steps}: "
        "checkpoints are taken after optimizer steps",
    )
    _require(
        not (c.lookahead and c.accumulation_steps > 1),
        f"lookahead=True counts iterations as optimizer steps: it cannot be combined with "
        f"accumulation_steps={c.accumulation_steps}",
    )
    _require(
        c.early_stopping_patience is None or c.early_stopping_patience >= 1,
        f"early_stopping_patience={c.early_stopping_patience} must be at least 1 (or None: off)",
    )
    _require(
        c.early_stopping_patience is None or c.val_split > 0,
        f"early_stopping_patience={c.early_stopping_patience} needs val_split > 0 (e.g. --val_split=0.1): with "
        "val_split=0 it would stop on test accuracy, and the test set would no longer be unseen",
    )
    _require(c.muon_lr is None or c.muon_lr > 0, f"muon_lr={c.muon_lr} must be greater than 0 (or None: SGD only)")
    _require(0 <= c.muon_momentum < 1, f"muon_momentum={c.muon_momentum} must be in [0, 1)")
    _require(1 <= c.muon_ns_steps <= 20, f"muon_ns_steps={c.muon_ns_steps} must be in 1..20")
    _require(c.ema_decay is None or 0 < c.ema_decay < 1, f"ema_decay={c.ema_decay} must be in (0, 1), e.g. 0.999")
    _require(c.trial is None or c.val_split > 0, "a tuning trial needs val_split > 0: trials never see the test set")
    _require(c.early_stopping_min_delta >= 0, f"early_stopping_min_delta={c.early_stopping_min_delta} must be 0 or more")
    _validate_recipe_options(c)


def _validate_data(c: Config) -> None:
    """The dataset keys: known names, label_mode only for CIFAR-100, image_size only for folders."""
    _require(c.dataset in DATASETS, f"dataset='{c.dataset}' is unknown: choose one of {', '.join(DATASETS)}")
    _require(c.label_mode in LABEL_MODES, f"label_mode='{c.label_mode}' is unknown: choose fine or coarse")
    _require(c.label_mode == "fine" or c.dataset == "cifar100",
             f"label_mode='{c.label_mode}' is for dataset=cifar100 (its 20 superclasses), not dataset={c.dataset}")
    _require(c.synthetic_size >= 10, f"synthetic_size={c.synthetic_size} is too small: must be at least 10")
    _require(8 <= c.image_size <= 1024, f"image_size={c.image_size} must be in 8..1024 pixels")
    _require(c.image_size == 32 or c.dataset == "folder",
             f"image_size={c.image_size} is for dataset=folder: CIFAR and synthetic images are 32x32")


def milestone_epochs(milestones: str | None) -> list[float]:
    """lr_milestones as numbers ([] when None); a UserError naming a value that is not one."""
    if milestones is None:
        return []
    try:
        return [float(part) for part in str(milestones).split(",") if part.strip()]
    except ValueError:
        raise UserError(f"lr_milestones='{milestones}' must be epochs separated by commas, e.g. 30,60") from None


def _validate_recipe_options(c: Config) -> None:
    """The optimizer, schedule, augmentation and clipping options: each bad value or combination in one line."""
    _require(c.optimizer in OPTIMIZERS, f"optimizer='{c.optimizer}' is unknown: choose one of {', '.join(OPTIMIZERS)}")
    _require(c.muon_lr is None or c.optimizer == "sgd",
             f"muon_lr={c.muon_lr} with optimizer={c.optimizer}: Muon trains the filters next to SGD; use "
             "optimizer=sgd, or leave muon_lr unset")
    for name in ("norm_weight_decay", "bias_weight_decay"):
        value = getattr(c, name)
        _require(value is None or value >= 0, f"{name}={value} must be 0 or more (or None: weight_decay)")
    _require(0 <= c.adam_beta1 < 1 and 0 <= c.adam_beta2 < 1,
             f"adam_beta1={c.adam_beta1} and adam_beta2={c.adam_beta2} must be in [0, 1)")
    _require(c.adam_eps > 0, f"adam_eps={c.adam_eps} must be greater than 0")
    _require(c.clip_grad_norm is None or c.clip_grad_norm > 0,
             f"clip_grad_norm={c.clip_grad_norm} must be greater than 0 (or None: off)")
    _require(c.lr_schedule in LR_SCHEDULES,
             f"lr_schedule='{c.lr_schedule}' is unknown: choose one of {', '.join(LR_SCHEDULES)}")
    milestones = milestone_epochs(c.lr_milestones)
    _require(c.lr_schedule == "step" or not milestones,
             f"lr_milestones={c.lr_milestones} is for lr_schedule=step, not {c.lr_schedule}")
    _require(c.lr_schedule != "step" or bool(milestones),
             "lr_schedule=step needs lr_milestones: the epochs at which the lr drops, e.g. --lr_milestones=30,60")
    _require(all(c.num_warmup_epochs < m < c.num_epochs for m in milestones) and milestones == sorted(set(milestones)),
             f"lr_milestones={c.lr_milestones} must increase and lie between num_warmup_epochs={c.num_warmup_epochs} "
             f"and num_epochs={c.num_epochs}")
    _require(0 < c.lr_gamma <= 1, f"lr_gamma={c.lr_gamma} must be in (0, 1]")
    _require(c.auto_augment in AUTO_AUGMENTS,
             f"auto_augment='{c.auto_augment}' is unknown: choose one of {', '.join(AUTO_AUGMENTS)}")
    magnitude, ranges = c.auto_augment_magnitude, {"randaugment": (0, 30), "trivialaugment": (2, 31)}
    _require(magnitude is None or c.auto_augment in ranges,
             f"auto_augment_magnitude={magnitude} is for randaugment or trivialaugment, not auto_augment={c.auto_augment}")
    low, high = ranges.get(c.auto_augment, (0, 0))
    _require(magnitude is None or low <= magnitude <= high,
             f"auto_augment_magnitude={magnitude} is out of range for {c.auto_augment}: {low}..{high}")
    _require(0 <= c.random_erasing <= 1, f"random_erasing={c.random_erasing} must be a probability in 0..1")
    for name in ("mixup_alpha", "cutmix_alpha"):
        _require(getattr(c, name) >= 0, f"{name}={getattr(c, name)} must be 0 (off) or more")
    _require(not c.sync_bn or c.backend == "nccl",
             f"sync_bn=True with backend={c.backend}: torch's SyncBatchNorm computes on GPUs only; it needs "
             "backend=nccl (and several processes)")


def _is_plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name


def _validate_launch(c: Config) -> None:
    _require(
        c.backend is None or c.backend in BACKENDS,
        f"backend='{c.backend}' is unknown: choose one of {', '.join(BACKENDS)} (or leave it unset for 1 process)",
    )
    spawn_keys = {"nproc_per_node": c.nproc_per_node, "nnodes": c.nnodes, "node_rank": c.node_rank}
    spawn_keys.update(master_addr=c.master_addr, master_port=c.master_port)
    if c.backend is None:
        for key, value in spawn_keys.items():
            _require(value is None, f"{key}={value} needs a distributed backend: add --backend=gloo (CPU) or nccl (GPU)")
        _require(c.init_method == "env://", f"init_method='{c.init_method}' needs backend gloo or nccl")
        return
    _require(c.nproc_per_node is None or c.nproc_per_node >= 1, f"nproc_per_node={c.nproc_per_node} must be >= 1")
    _require(c.nnodes is None or c.nnodes >= 1, f"nnodes={c.nnodes} must be at least 1")
    _require(
        c.master_port is None or 1 <= c.master_port <= 65535, f"master_port={c.master_port} must be in 1..65535"
    )
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
        c.backend in ("gloo", "nccl"),
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


def describe_options() -> str:
    """One line per config key: name, default and meaning (for --help)."""
    width = max(len(name) + len(repr(f.default)) for name, f in FIELDS.items()) + 4
    lines = []
    for name, f in FIELDS.items():
        flag = f"--{name}={_format_default(f.default)}"
        lines.append(f"  {flag:<{width}} {f.metadata['help']}")
    return "\n".join(lines)


def _format_default(value: Any) -> str:
    return "None" if value is None else str(value)

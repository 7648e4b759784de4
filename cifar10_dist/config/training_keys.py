"""The model, its start, and how it is optimised: the optimizer and its groups, the schedule, the loss, averaging, the
recipe's parts, epochs and batches. Fields of ``Config`` (``config.fields`` composes them; one flat set of keys for
flags, YAML and the API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

from cifar10_dist.config.options import ABOVE_0, AT_LEAST_0, AT_LEAST_1, FRACTION, Bounds, option


@dataclass(frozen=True)
class TrainingKeys:
    """The model, its start, and how it is optimised."""

    model: str = option(
        "resnet18",
        "torchvision classification model, cifar_resnet18/34/50, airbench, simple_cnn, or "
        "your own: package.module:factory or path/to/file.py:factory",
        short="network name, timm:NAME or file.py:factory",
        inherited_by_evaluate=True,
    )
    pretrained: Optional[str] = option(
        None,
        "start from pretrained weights: a torchvision weights name (DEFAULT, "
        "IMAGENET1K_V1, ...) for a torchvision model, true for a timm model (its "
        "pretrained tag), or a file: one of our checkpoints or best-model files, a "
        "state-dict .pt/.pth or a .safetensors file; the head is new for the run's "
        "classes (docs/fine-tuning.md)",
        short="start from pretrained weights",
        also_accepts=("true",),
    )
    freeze_epochs: int = option(
        0,
        "train the head (the model's last Linear) alone for the first N epochs: the rest's "
        "lr is 0 and its BatchNorm statistics are frozen; then everything trains",
        short="epochs that train the head alone",
        bounds=AT_LEAST_0,
    )
    backbone_lr_scale: float = option(
        1.0,
        "learning-rate factor of everything but the head (the model's last "
        "Linear), e.g. 0.1 when fine-tuning pretrained weights",
        short="learning-rate factor of all but the head",
        bounds=ABOVE_0,
    )
    teacher: Optional[str] = option(
        None,
        "distil from this teacher: one of our checkpoints or best-model files (its "
        "model rebuilt), or a model name whose weights teacher_pretrained gives; it must "
        "have the run's classes (docs/ship-it.md)",
        short="distil from this teacher model",
        tunable=False,
    )
    teacher_pretrained: Optional[str] = option(
        None,
        "the teacher's weights when teacher is a model name: a "
        "torchvision "
        "weights name, true for timm, or a file that records its classes",
        short="the teacher's weights",
        also_accepts=("true",),
        tunable=False,
    )
    distill_alpha: float = option(
        0.5,
        "with a teacher: the weight of its softened targets in the loss (the run's own loss has 1 - distill_alpha)",
        short="weight of the teacher's targets",
        bounds=Bounds(0, 1, in_words="in [0, 1]"),
    )
    distill_temperature: float = option(
        4.0,
        "with a teacher: the temperature both distributions are softened with "
        "(the soft loss is multiplied by its square)",
        short="temperature of distillation",
        bounds=ABOVE_0,
    )
    model_kwargs: Optional[dict] = option(
        None,
        "keyword arguments of the model's factory, a JSON object (e.g. '{\"width\": 64}')",
        short="the model factory's arguments (JSON)",
        inherited_by_evaluate=True,
    )
    seed: int = option(
        543,
        "random seed of model init, shuffling and augmentation (distinct per rank and iteration)",
        short="random seed",
    )
    seeds: int = option(
        1,
        "train this many times, with seed, seed+1, ...; report mean, std, min and max",
        short="train this many seeds and summarise",
        bounds=AT_LEAST_1,
        tunable=False,
    )
    deterministic: bool = option(
        False,
        "deterministic algorithms only (torch, cuDNN, cuBLAS); errors where none exists",
        short="deterministic algorithms only",
        may_change_on_resume=True,
    )
    batch_size: int = option(
        512, "global batch size, split evenly over all processes", short="global batch size", bounds=AT_LEAST_1
    )
    accumulation_steps: int = option(
        1,
        "sum the gradients of N consecutive batches (each loss divided by N) before "
        "one optimizer step: effective batch = batch_size x N; the LR schedule, "
        "checkpoint_every and logging count batches (iterations)",
        short="batches summed per optimizer step",
        bounds=Bounds(1, note=" (1: no accumulation)"),
    )
    optimizer: Literal["sgd", "adamw"] = option(
        "sgd", "sgd or adamw (torch.optim.AdamW: adam_beta1, adam_beta2, adam_eps)", short="sgd or adamw"
    )
    learning_rate: Union[float, str] = option(
        0.4,
        "peak learning rate reached after the warmup; find: sweep it first "
        "as lr-find does (its defaults) and train with the suggestion "
        "(docs/before-you-train.md)",
        short="peak learning rate, or find",
        also_accepts=("find",),
        bounds=ABOVE_0,
    )
    momentum: float = option(0.9, "SGD momentum", short="SGD momentum", bounds=FRACTION)
    nesterov: bool = option(True, "use Nesterov momentum", short="Nesterov momentum")
    weight_decay: float = option(
        1e-4, "weight decay (SGD's L2 term, AdamW's decoupled decay)", short="weight decay", bounds=AT_LEAST_0
    )
    norm_weight_decay: Optional[float] = option(
        None,
        "weight decay of normalisation layers' weights and biases "
        "(None: weight_decay), as torchvision's reference names it",
        short="weight decay of normalisation layers",
        bounds=Bounds(0, note=" (or None: weight_decay)"),
    )
    bias_weight_decay: Optional[float] = option(
        None,
        "weight decay of every bias (None: weight_decay; before norm_weight_decay for norm biases)",
        short="weight decay of biases",
        bounds=Bounds(0, note=" (or None: weight_decay)"),
    )
    adam_beta1: float = option(0.9, "adamw: beta1", short="AdamW's beta1")
    adam_beta2: float = option(0.999, "adamw: beta2", short="AdamW's beta2")
    adam_eps: float = option(1e-8, "adamw: eps", short="AdamW's eps", bounds=ABOVE_0)
    clip_grad_norm: Optional[float] = option(
        1.0,
        "clip the gradient's total norm to this (after unscaling under "
        "fp16; the accumulated gradient); the pre-clip norm is logged; the "
        "default 1.0 keeps the ResNet-18 recipe's first epoch from a loss spike",
        short="clip the gradient norm to this",
        bounds=Bounds(0, low_open=True, note=" (or None: off)"),
    )
    sync_bn: bool = option(
        False,
        "convert BatchNorm to SyncBatchNorm over all processes (nccl: torch's SyncBatchNorm computes on GPUs only)",
        short="SyncBatchNorm over all processes",
    )
    label_smoothing: float = option(
        0.0,
        "label smoothing of the training loss (evaluation loss is plain)",
        short="label smoothing of the training loss",
        bounds=FRACTION,
    )
    bias_lr_scale: float = option(
        1.0,
        "learning-rate factor for normalisation-layer biases (their weight decay is "
        "divided by it, so the decay per step stays)",
        short="learning-rate factor of norm biases",
        bounds=ABOVE_0,
    )
    whitening_bias_lr_scale: float = option(
        1.0,
        "learning-rate factor for the airbench whitening bias (weight decay divided by it)",
        short="airbench: whitening bias lr factor",
        bounds=ABOVE_0,
    )
    whitening_bias_epochs: float = option(
        3.0,
        "epochs the airbench whitening bias trains before it freezes, as airbench does",
        short="airbench: epochs the whitening bias trains",
        bounds=ABOVE_0,
    )
    whitening_bias_decay: bool = option(
        False,
        "the whitening bias's lr falls linearly from its peak to 0 over "
        "whitening_bias_epochs (airbench94_muon) instead of following the schedule",
        short="airbench: whitening bias lr falls to 0",
    )
    muon_lr: Optional[float] = option(
        None,
        "train the convolution filters with torch.optim.Muon at this peak lr "
        "(torch 2.9+; the rest with SGD), as airbench94_muon does; follows the same "
        "schedule",
        short="train filters with Muon at this lr",
        bounds=Bounds(0, low_open=True, note=" (or None: SGD only)"),
    )
    muon_momentum: float = option(
        0.6, "Muon's Nesterov momentum (with muon_lr)", short="Muon's momentum", bounds=FRACTION
    )
    muon_ns_steps: int = option(
        3,
        "Muon's Newton-Schulz iterations per step (with muon_lr)",
        short="Muon's Newton-Schulz iterations",
        bounds=Bounds(1, 20),
    )
    num_epochs: int = option(5, "number of training epochs", short="training epochs", bounds=AT_LEAST_1)
    num_warmup_epochs: float = option(
        1.0,
        "epochs (may be fractional) of linear warmup to learning_rate, then linear decay",
        short="epochs of learning-rate warm-up",
    )
    lr_start: float = option(
        0.0,
        "learning rate at iteration 0, as a fraction of learning_rate",
        short="first learning rate (fraction of peak)",
    )
    lr_end: float = option(
        0.0,
        "learning rate at the last iteration, as a fraction of learning_rate",
        short="last learning rate (fraction of peak)",
    )
    lr_schedule: Literal["linear", "cosine", "step"] = option(
        "linear",
        "after the warmup: linear (to lr_end), cosine (torch's CosineAnnealingLR to lr_end) or step "
        "(x lr_gamma at each of lr_milestones)",
        short="after warm-up: linear, cosine or step",
    )
    lr_milestones: Optional[str] = option(
        None,
        "step: epochs at which the lr is multiplied by lr_gamma, e.g. 30,60",
        short="step: epochs where the lr drops",
    )
    lr_gamma: float = option(
        0.1,
        "step: the factor at each milestone",
        short="step: the factor at each milestone",
        bounds=Bounds(0, 1, low_open=True),
    )
    ema_decay: Optional[float] = option(
        None,
        "keep an exponential moving average of the weights, this decay per "
        "optimizer step (e.g. 0.999), warmed up from 0.9 over the LR warm-up; it is "
        "evaluated next to the model, chooses the best model and takes the test",
        short="EMA of the weights with this decay",
        bounds=Bounds(0, 1, low_open=True, high_open=True, note=", e.g. 0.999"),
    )
    periodic_averaging: bool = option(
        False,
        "airbench's lookahead: from 30% of training, every 5 steps move the weights "
        "to an EMA of them whose decay grows to 0.77",
        short="airbench's lookahead",
    )
    epoch_length: Optional[int] = option(
        None,
        "iterations per epoch (default: one pass over the training set)",
        short="iterations per epoch",
        bounds=AT_LEAST_1,
    )
    select_hardest_fraction: float = option(
        1.0,
        "data selection: each step trains on this fraction of each process's batch, "
        "the highest-loss images under a no-grad forward of the model (1: off)",
        short="train on the hardest fraction of a batch",
        bounds=Bounds(0, 1, low_open=True, note=" (1: off)"),
    )
    select_hardest_until: float = option(
        1.0,
        "data selection: the fraction of training it applies to",
        short="data selection: until this fraction",
        bounds=Bounds(0, 1, low_open=True),
    )

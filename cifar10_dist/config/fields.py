"""The run configuration's fields: one typed, frozen dataclass, the single source of defaults, help texts and
each key's own rules (a ``Literal`` annotation for a word's choices, ``Bounds`` for a number's range), checked
by ``check_field``. Adding a key with a range is one field here; rules that tie several keys together are in
``rules``."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from cifar10_dist.config.options import ABOVE_0, AT_LEAST_0, AT_LEAST_1, FRACTION, Bounds, option
from cifar10_dist.config.trial import TrialSpec
from cifar10_dist.errors import UserError

LIST_FIELDS = ("lr_milestones", "class_weights")  # str fields holding comma-separated numbers (fire: a tuple)


@dataclass(frozen=True)
class Config:
    """Everything a training or evaluation run needs. Defaults follow the Ignite CIFAR-10 tutorial."""

    # data
    dataset: str = option("cifar10", "cifar10 or cifar100 (files in data_path), synthetic (generated in memory), or "
                          "folder (data_path/train/<class>/<images>, optionally test/ and val/: docs/your-data.md)",
                          tunable=False, inherited_by_evaluate=True)
    data_path: str = option("cifar10", "folder holding cifar-10-batches-py or cifar-100-python (downloaded there when "
                            "missing)", per_worker=True, inherited_by_evaluate=True)
    label_mode: Literal["fine", "coarse"] = option("fine", "CIFAR-100 labels: fine (100 classes) or coarse (20 "
                                                   "superclasses)", choices_read="fine or coarse",
                                                   inherited_by_evaluate=True)
    download: bool = option(True, "download CIFAR-10 into data_path when it is missing (False: fail at once)",
                            per_worker=True)
    image_size: int = option(32, "dataset=folder: images are stored and trained at this size (shorter side scaled, "
                             "centre crop); CIFAR is 32", bounds=Bounds(8, 1024, reads="in 8..1024 pixels"),
                             inherited_by_evaluate=True)
    skip_bad_images: bool = option(False, "dataset=folder: train without unreadable image files (else refused, "
                                   "naming them)", tunable=False, inherited_by_evaluate=True)
    drop_test_duplicates: bool = option(False, "dataset=folder: remove test/val images that are exact copies of "
                                        "training images (always counted and warned about)",
                                        tunable=False, inherited_by_evaluate=True)
    cache_dir: Optional[str] = option(None, "dataset=folder: where the decoded images are cached (default: "
                                      "data_path/.cifar10_dist_cache); a node-local folder (e.g. $SLURM_TMPDIR) "
                                      "gets a copy of the cache beside the data when there is one, once per node",
                                      per_worker=True, inherited_by_evaluate=True)
    synthetic_size: int = option(5000, "training images when dataset=synthetic (test set: a fifth of it)",
                                 bounds=Bounds(10, reads="at least 10 (it is too small)"),
                                 tunable=False, inherited_by_evaluate=True)
    num_workers: Union[int, str] = option("auto", "DataLoader worker processes per node (split over local processes); "
                                          "auto: 0 on a CPU from images that fit in memory, 2 from disk; on an "
                                          "accelerator each process's cores but one, 2 to 8", also=("auto",),
                                          bounds=AT_LEAST_0, per_worker=True)
    train_eval_size: int = option(5000, "size of the fixed, non-augmented train subset used for train metrics",
                                  bounds=Bounds(0, reads="0 (off) or more"))
    val_split: float = option(0.0, "fraction of training images held out for validation and best-model choice; "
                              "test set then used once at the end (0: validate on the test set)",
                              bounds=Bounds(0, 1, high_open=True, note=", e.g. 0.1"), tunable=False)
    val_seed: int = option(0, "seed of the held-out choice (independent of seed and world size)", tunable=False)
    data_on_device: Union[bool, str] = option("auto", "all images kept on the training device, batches sliced there; "
                                              "auto: on a CUDA GPU if under 25% of its free memory", also=("auto",))
    sampler: Literal["shuffle", "balanced"] = option(
        "shuffle", "training order: shuffle (each image once per epoch) or balanced (each epoch draws as many images, "
        "every class equally likely, with replacement: for imbalanced classes)")
    class_weights: Optional[str] = option(None, "weight each class in the training loss: auto (inverse class "
                                          "frequency of the training split) or one weight per class, e.g. 1,1,5")
    # augmentation
    crop_padding: int = option(4, "pixels of padding before the random 32x32 crop (0: no crop)",
                               bounds=Bounds(0, 16, reads="in 0..16 pixels"))
    random_resized_crop: float = option(0.0, "train on random-resized crops: the smallest area fraction of a crop "
                                        "(e.g. 0.35, or torchvision's 0.08), aspect ratio 3/4..4/3, resized to "
                                        "image_size on the device; replaces the padded crop (0: off)",
                                        bounds=Bounds(0, 1, high_open=True, note=" (0: off)"))
    crop_fraction: float = option(1.0, "evaluation, predict and export see the central crop_fraction of each image "
                                  "resized to image_size (e.g. 0.875, torchvision's 224 of 256); a folder is stored "
                                  "at image_size / crop_fraction", bounds=Bounds(0.5, 1, reads="in [0.5, 1]"))
    resize_start: float = option(1.0, "progressive resizing: epoch 1 trains at this fraction of image_size, growing "
                                 "per epoch (4-pixel steps) to full size by resize_until of training; evaluation at "
                                 "full size (1: off)", bounds=Bounds(0.25, 1, reads="in [0.25, 1]", note=" (1: off)"))
    resize_until: float = option(0.75, "progressive resizing: the fraction of training by which images are full size",
                                 bounds=Bounds(0, 1, low_open=True))
    crop_pad_mode: Literal["zeros", "reflect"] = option("zeros", "padding for the crop: zeros or reflect",
                                                        choices_read="zeros or reflect")
    flip: Literal["random", "alternating", "none"] = option("random", "horizontal flip: random (per image), "
                                                            "alternating (half the images pre-flipped, all flipped "
                                                            "every other epoch) or none")
    auto_augment: Literal["none", "trivialaugment", "randaugment", "autoaugment"] = option(
        "none", "a torchvision.transforms.v2 policy per training image: none, trivialaugment, randaugment or "
        "autoaugment (its CIFAR-10 policy)")
    auto_augment_magnitude: Optional[int] = option(None, "randaugment: magnitude 0..30 (default 9); trivialaugment: "
                                                   "number of magnitude bins 2..31 (default 31)")
    random_erasing: float = option(0.0, "probability of erasing a random rectangle of each training image "
                                   "(torchvision's RandomErasing), 0..1",
                                   bounds=Bounds(0, 1, reads="a probability in 0..1"))
    color_jitter: float = option(0.0, "each training image's brightness shifted and contrast scaled by amounts drawn "
                                 "in +-this on the normalised batch (hiverge's CIFAR record: 0.15)", bounds=FRACTION)
    mixup_alpha: float = option(0.0, "MixUp's Beta(alpha, alpha) for training batches (0: off; with cutmix_alpha, "
                                "one of the two per batch)", bounds=Bounds(0, reads="0 (off) or more"))
    cutmix_alpha: float = option(0.0, "CutMix's Beta(alpha, alpha) for training batches (0: off)",
                                 bounds=Bounds(0, reads="0 (off) or more"))
    # model and optimisation
    model: str = option("resnet18", "torchvision classification model, cifar_resnet18/34/50, airbench, simple_cnn, or "
                        "your own: package.module:factory or path/to/file.py:factory", inherited_by_evaluate=True)
    pretrained: Optional[str] = option(None, "start from pretrained weights: a torchvision weights name (DEFAULT, "
                                       "IMAGENET1K_V1, ...) for a torchvision model, true for a timm model (its "
                                       "pretrained tag), or a file: one of our checkpoints or best-model files, a "
                                       "state-dict .pt/.pth or a .safetensors file; the head is new for the run's "
                                       "classes (docs/fine-tuning.md)", also=("true",))
    freeze_epochs: int = option(0, "train the head (the model's last Linear) alone for the first N epochs: the rest's "
                                "lr is 0 and its BatchNorm statistics are frozen; then everything trains",
                                bounds=AT_LEAST_0)
    backbone_lr_scale: float = option(1.0, "learning-rate factor of everything but the head (the model's last "
                                      "Linear), e.g. 0.1 when fine-tuning pretrained weights", bounds=ABOVE_0)
    teacher: Optional[str] = option(None, "distil from this teacher: one of our checkpoints or best-model files (its "
                                    "model rebuilt), or a model name whose weights teacher_pretrained gives; it must "
                                    "have the run's classes (docs/ship-it.md)", tunable=False)
    teacher_pretrained: Optional[str] = option(None, "the teacher's weights when teacher is a model name: a torchvision "
                                               "weights name, true for timm, or a file that records its classes",
                                               also=("true",), tunable=False)
    distill_alpha: float = option(0.5, "with a teacher: the weight of its softened targets in the loss (the run's "
                                  "own loss has 1 - distill_alpha)", bounds=Bounds(0, 1, reads="in [0, 1]"))
    distill_temperature: float = option(4.0, "with a teacher: the temperature both distributions are softened with "
                                        "(the soft loss is multiplied by its square)", bounds=ABOVE_0)
    model_kwargs: Optional[dict] = option(None, "keyword arguments of the model's factory, a JSON object "
                                          "(e.g. '{\"width\": 64}')", inherited_by_evaluate=True)
    seed: int = option(543, "random seed of model init, shuffling and augmentation (distinct per rank and iteration)")
    seeds: int = option(1, "train this many times, with seed, seed+1, ...; report mean, std, min and max",
                        bounds=AT_LEAST_1, tunable=False)
    deterministic: bool = option(False, "deterministic algorithms only (torch, cuDNN, cuBLAS); errors where none exists")
    batch_size: int = option(512, "global batch size, split evenly over all processes", bounds=AT_LEAST_1)
    accumulation_steps: int = option(1, "sum the gradients of N consecutive batches (each loss divided by N) before "
                                     "one optimizer step: effective batch = batch_size x N; the LR schedule, "
                                     "checkpoint_every and logging count batches (iterations)",
                                     bounds=Bounds(1, note=" (1: no accumulation)"))
    optimizer: Literal["sgd", "adamw"] = option("sgd", "sgd or adamw (torch.optim.AdamW: adam_beta1, adam_beta2, "
                                                       "adam_eps)")
    learning_rate: Union[float, str] = option(0.4, "peak learning rate reached after the warmup; find: sweep it first "
                                              "as lr-find does (its defaults) and train with the suggestion "
                                              "(docs/before-you-train.md)", also=("find",), bounds=ABOVE_0)
    momentum: float = option(0.9, "SGD momentum", bounds=FRACTION)
    nesterov: bool = option(True, "use Nesterov momentum")
    weight_decay: float = option(1e-4, "weight decay (SGD's L2 term, AdamW's decoupled decay)", bounds=AT_LEAST_0)
    norm_weight_decay: Optional[float] = option(None, "weight decay of normalisation layers' weights and biases "
                                                "(None: weight_decay), as torchvision's reference names it",
                                                bounds=Bounds(0, note=" (or None: weight_decay)"))
    bias_weight_decay: Optional[float] = option(None, "weight decay of every bias (None: weight_decay; before "
                                                "norm_weight_decay for norm biases)",
                                                bounds=Bounds(0, note=" (or None: weight_decay)"))
    adam_beta1: float = option(0.9, "adamw: beta1")
    adam_beta2: float = option(0.999, "adamw: beta2")
    adam_eps: float = option(1e-8, "adamw: eps", bounds=ABOVE_0)
    clip_grad_norm: Optional[float] = option(1.0, "clip the gradient's total norm to this (after unscaling under "
                                             "fp16; the accumulated gradient); the pre-clip norm is logged; the "
                                             "default 1.0 keeps the ResNet-18 recipe's first epoch from a loss spike",
                                             bounds=Bounds(0, low_open=True, note=" (or None: off)"))
    sync_bn: bool = option(False, "convert BatchNorm to SyncBatchNorm over all processes (nccl: torch's "
                           "SyncBatchNorm computes on GPUs only)")
    label_smoothing: float = option(0.0, "label smoothing of the training loss (evaluation loss is plain)",
                                    bounds=FRACTION)
    bias_lr_scale: float = option(1.0, "learning-rate factor for normalisation-layer biases (their weight decay is "
                                  "divided by it, so the decay per step stays)", bounds=ABOVE_0)
    whitening_bias_lr_scale: float = option(1.0, "learning-rate factor for the airbench whitening bias (weight decay "
                                            "divided by it)", bounds=ABOVE_0)
    whitening_bias_epochs: float = option(3.0, "epochs the airbench whitening bias trains before it freezes, as "
                                          "airbench does", bounds=ABOVE_0)
    whitening_bias_decay: bool = option(False, "the whitening bias's lr falls linearly from its peak to 0 over "
                                        "whitening_bias_epochs (airbench94_muon) instead of following the schedule")
    muon_lr: Optional[float] = option(None, "train the convolution filters with torch.optim.Muon at this peak lr "
                                      "(torch 2.9+; the rest with SGD), as airbench94_muon does; follows the same "
                                      "schedule", bounds=Bounds(0, low_open=True, note=" (or None: SGD only)"))
    muon_momentum: float = option(0.6, "Muon's Nesterov momentum (with muon_lr)", bounds=FRACTION)
    muon_ns_steps: int = option(3, "Muon's Newton-Schulz iterations per step (with muon_lr)", bounds=Bounds(1, 20))
    num_epochs: int = option(5, "number of training epochs", bounds=AT_LEAST_1)
    num_warmup_epochs: float = option(1.0, "epochs (may be fractional) of linear warmup to learning_rate, then "
                                      "linear decay")
    lr_start: float = option(0.0, "learning rate at iteration 0, as a fraction of learning_rate")
    lr_end: float = option(0.0, "learning rate at the last iteration, as a fraction of learning_rate")
    lr_schedule: Literal["linear", "cosine", "step"] = option(
        "linear", "after the warmup: linear (to lr_end), cosine (torch's CosineAnnealingLR to lr_end) or step "
        "(x lr_gamma at each of lr_milestones)")
    lr_milestones: Optional[str] = option(None, "step: epochs at which the lr is multiplied by lr_gamma, e.g. 30,60")
    lr_gamma: float = option(0.1, "step: the factor at each milestone", bounds=Bounds(0, 1, low_open=True))
    ema_decay: Optional[float] = option(None, "keep an exponential moving average of the weights, this decay per "
                                        "optimizer step (e.g. 0.999), warmed up from 0.9 over the LR warm-up; it is "
                                        "evaluated next to the model, chooses the best model and takes the test",
                                        bounds=Bounds(0, 1, low_open=True, high_open=True, note=", e.g. 0.999"))
    lookahead: bool = option(False, "airbench's lookahead: from 30% of training, every 5 steps move the weights "
                             "to an EMA of them whose decay grows to 0.77")
    epoch_length: Optional[int] = option(None, "iterations per epoch (default: one pass over the training set)",
                                         bounds=AT_LEAST_1)
    select_fraction: float = option(1.0, "data selection: each step trains on this fraction of each process's batch, "
                                    "the highest-loss images under a no-grad forward of the model (1: off)",
                                    bounds=Bounds(0, 1, low_open=True, note=" (1: off)"))
    select_until: float = option(1.0, "data selection: the fraction of training it applies to",
                                 bounds=Bounds(0, 1, low_open=True))
    # speed
    with_amp: Union[bool, str] = option(False, "mixed precision: auto (what the hardware runs fast: bf16 on CPUs with "
                                        "AMX or AVX512-BF16, fp32 on other CPUs; bf16 on GPUs of compute capability "
                                        "8.0+, else fp16 + GradScaler; bf16 on XLA), True (fp16 + GradScaler on CUDA, "
                                        "bf16 elsewhere, even where slow) or False (fp32)", also=("auto",))
    amp_dtype: Literal["auto", "float16", "bfloat16"] = option(
        "auto", "with_amp=True's type: auto (fp16 + GradScaler on CUDA, bf16 on CPU and XLA), float16 (with a "
        "GradScaler) or bfloat16 (on GPUs that have it: no GradScaler)")
    channels_last: Union[bool, str] = option("auto", "channels-last memory format: auto (on for a model with 2D "
                                             "convolutions on a CPU or CUDA GPU, off elsewhere; logged and saved in "
                                             "config.yaml), True or False", also=("auto",))
    keep_freed_memory: bool = option(True, "CPU training on Linux (glibc): freed memory stays in the process for reuse "
                                     "instead of going back to the OS after every step (wide batches train up to "
                                     "1.4x faster; the process keeps its peak memory until it exits)")
    compile: bool = option(False, "torch.compile the model (a minute or more of warm-up; checkpoints stay plain)")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = option(
        "default", "compile=True's mode: default, reduce-overhead (the forward and backward replayed as CUDA graphs), "
        "max-autotune or max-autotune-no-cudagraphs")
    fused_optimizer: Union[bool, str] = option("auto", "SGD/AdamW's update as one fused kernel per step: auto (on a "
                                               "CUDA GPU; also spares fp16's GradScaler a host wait), True or False "
                                               "(torch's foreach kernels)", also=("auto",))
    augment_per_pass: Union[bool, str] = option(
        "auto", "data_on_device: crop, flip and normalise a whole pass at its start, in the training dtype (airbench's "
        "loader), not batch by batch; auto: on a CUDA GPU when pad-crop and flip are the only augmentation",
        also=("auto",))
    half_weights: bool = option(False, "keep the network's weights in bf16 (with_amp's dtype), BatchNorm in fp32, as "
                                "airbench's .half() net, instead of casting fp32 weights at every step")
    tf32: bool = option(True, "allow TF32 matmuls and convolutions on Ampere or newer GPUs (ignored elsewhere)")
    cudnn_benchmark: bool = option(True, "let cuDNN time and pick convolution algorithms (GPU; off if deterministic)")
    warm_up_steps: Union[int, str] = option("auto", "training steps on a batch of the real shapes before the timed "
                                            "ones, then undone bit for bit (autotuning and compilation fall outside "
                                            "the training time); auto: 3 on a CUDA GPU, else 0", also=("auto",),
                                            bounds=AT_LEAST_0, tunable=False)
    # evaluation, checkpoints, logging
    validate_every: int = option(3, "validate every N epochs (and always once at the end)", bounds=AT_LEAST_1)
    early_stopping_patience: Optional[int] = option(None, "stop after this many validations without a val "
                                                    "best_metric gain above early_stopping_min_delta (needs val_split > 0)",
                                                    bounds=Bounds(1, note=" (or None: off)"))
    early_stopping_min_delta: float = option(0.0, "smallest val best_metric gain that counts as an improvement",
                                             bounds=AT_LEAST_0)
    best_metric: Literal["accuracy", "balanced_accuracy", "macro_f1"] = option(
        "accuracy", "what chooses the best model, drives early stopping and ranks tuning trials: accuracy, "
        "balanced_accuracy (the mean of per-class recalls) or macro_f1 (the mean of per-class F1)")
    tta: Literal[0, 1, 2] = option(0, "test-time augmentation of val/test evaluations: 0 none, 1 mirror, 2 mirror and 1-pixel "
                      "shifts (6 views)", choices_read="0 (none), 1 (mirror) or 2 (mirror + shifts)",
                      inherited_by_evaluate=True)
    calibrate: Optional[Literal["temperature"]] = option(
        None, "temperature: after training, fit one temperature on the validation split (never the test set: needs "
        "val_split or a val/ folder) so that softmax(logits / T) are calibrated probabilities; stored with the "
        "model, used by evaluate, predict and export", choices_read="temperature (or leave it unset)",
        tunable=False)
    checkpoint_every: int = option(200, "save a training checkpoint every N iterations (the last 2 are kept)",
                                   bounds=AT_LEAST_1)
    log_every_iters: int = option(15, "log the training loss every N iterations", bounds=AT_LEAST_1)
    output_path: str = option("output-cifar10/", "parent folder of run folders", tunable=False)
    run_name: Optional[str] = option(None, "run folder name under output_path (default: model_backend-B-N_time)",
                                     tunable=False)
    resume_from: Optional[str] = option(None, "training checkpoint to resume from, or auto: the newest in the run folder",
                                        tunable=False)
    resume_on_changed_data: bool = option(False, "resume even when the data is not what the checkpoint was made with "
                                          "(another checksum): the run goes on, no longer the same run; recorded in "
                                          "provenance", tunable=False)
    overwrite: bool = option(False, "start afresh in a run folder that holds a run: the old folder is moved aside to "
                             "NAME.replaced-<time>, never deleted", tunable=False)
    with_clearml: bool = option(False, "track the run with ClearML (pip install cifar10-dist[clearml])",
                                per_worker=True)
    clearml_project: str = option("cifar10_dist", "ClearML project name (the task is named after the run folder)",
                                  per_worker=True)
    clearml_offline: bool = option(False, "ClearML without a server: record the session locally for a later import",
                                   per_worker=True)
    with_mlflow: bool = option(False, "track the run with MLflow (pip install cifar10-dist[mlflow]): config, "
                               "metrics, provenance tags, artifacts; a resume continues the same MLflow run",
                               per_worker=True)
    mlflow_tracking_uri: Optional[str] = option(None, "MLflow store: any URI MLflow accepts (default: "
                                                "MLFLOW_TRACKING_URI, else sqlite:///output_path/mlflow.db)",
                                                per_worker=True)
    mlflow_experiment: str = option("cifar10_dist", "MLflow experiment name (the run is named after the run folder)",
                                    per_worker=True)
    mlflow_log_model: bool = option(False, "with_mlflow: also store the best model file as an MLflow artifact",
                                    per_worker=True)
    with_wandb: bool = option(False, "track the run with Weights & Biases (pip install cifar10-dist[wandb]): config, "
                              "metrics, provenance, the run's files; a resume continues the same W&B run",
                              per_worker=True)
    wandb_project: str = option("cifar10_dist", "W&B project (the run is named after the run folder)", per_worker=True)
    wandb_entity: Optional[str] = option(None, "W&B entity, a user or team (default: W&B's own)", per_worker=True)
    wandb_mode: Optional[Literal["online", "offline", "disabled"]] = option(
        None, "W&B mode: online, offline (kept in the run folder for wandb sync) or disabled (default: online when "
        "WANDB_API_KEY is set, else offline)", choices_read="online, offline or disabled (or leave it unset)",
        per_worker=True)
    wandb_log_model: bool = option(False, "with_wandb: also store the best model file as a W&B artifact",
                                   per_worker=True)
    profile: int = option(0, "profile N training iterations (after 5 of warm-up) with torch.profiler: a trace for "
                          "TensorBoard or Perfetto in RUN/profile/, the top operators and each handler's share of the "
                          "time in the log (0: off)", bounds=Bounds(0, reads="0 (off) or more"), tunable=False)
    # launch
    backend: Optional[Literal["gloo", "nccl", "xla-tpu", "horovod"]] = option(
        None, "distributed backend: gloo, nccl, xla-tpu, horovod (default: none)",
        choices_read="one of gloo, nccl, xla-tpu, horovod (or leave it unset for 1 process)", per_worker=True)
    nproc_per_node: Optional[int] = option(None, "processes to spawn on this node (not under torchrun)",
                                           bounds=Bounds(1, reads=">= 1"), per_worker=True)
    nnodes: Optional[int] = option(None, "number of nodes when spawning (with nproc_per_node)", bounds=AT_LEAST_1,
                                   per_worker=True)
    node_rank: Optional[int] = option(None, "rank of this node when spawning over several nodes", per_worker=True)
    master_addr: Optional[str] = option(None, "address of node 0 when spawning over several nodes", per_worker=True)
    master_port: Optional[int] = option(None, "free TCP port on node 0 when spawning (default: a free one, 1 node)",
                                        bounds=Bounds(1, 65535), per_worker=True)
    init_method: str = option("env://", "how gloo/nccl processes find each other: env:// or file:///shared/fresh-file",
                              per_worker=True)
    dist_timeout: int = option(1800, "seconds a process waits for the others in a gloo/nccl collective before failing",
                               bounds=Bounds(1, reads="at least 1 second"), per_worker=True)
    # set by tune
    trial: Optional[TrialSpec] = option(None, "set by tune: the Optuna trial this run is (study, storage, number, "
                                        "params); rank 0 reports each val accuracy there and the run may be pruned; "
                                        "no test set", internal=True)
    lr_found: Optional[dict] = option(None, "set by learning_rate=find: the sweep's suggestion and where its files "
                                      "wait for the run folder", internal=True)
    mlflow_parent_run: Optional[str] = option(None, "set by tune: the MLflow run of the study, parent of this "
                                              "trial's MLflow run", internal=True, per_worker=True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(Config)}
# the keys by role, from the fields (``option``): never written by hand
UNTUNABLE = tuple(name for name, f in FIELDS.items()
                  if not f.metadata["tunable"] or f.metadata["per_worker"] or f.metadata["internal"])
PER_WORKER = tuple(name for name, f in FIELDS.items() if f.metadata["per_worker"])
INHERITED_BY_EVALUATE = tuple(name for name, f in FIELDS.items() if f.metadata["inherited_by_evaluate"])


@functools.lru_cache(maxsize=None)
def field_types() -> dict[str, Any]:
    """Config's annotations resolved once (``typing.get_type_hints`` costs 2 ms a call)."""
    return typing.get_type_hints(Config)


def choices(name: str) -> tuple[Any, ...]:
    """The values a ``Literal`` field accepts (() for any other field)."""
    annotation = field_types()[name]
    for candidate in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(candidate) is Literal:
            return typing.get_args(candidate)
    return ()


def check_field(name: str, value: Any) -> None:
    """One field's own rules, declared with it: its choices, its bounds."""
    meta = FIELDS[name].metadata
    if value is None or value in meta["also"] or isinstance(value, (bool, dict, TrialSpec)):
        return
    accepted = choices(name)
    if accepted and value not in accepted:
        words = meta["choices_read"] or f"one of {', '.join(map(str, accepted))}"
        shown, verdict = (f"'{value}'", "is unknown") if isinstance(value, str) else (value, "is not accepted")
        raise UserError(f"{name}={shown} {verdict}: choose {words}")
    bounds = meta["bounds"]
    if bounds is not None and not bounds.accepts(value):
        raise UserError(f"{name}={value} must be {bounds.describe(isinstance(value, int))}")
    if name == "run_name" and not _is_plain_name(value):
        raise UserError(f"run_name='{value}' must be a plain folder name")


def _is_plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name

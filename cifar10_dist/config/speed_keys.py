"""How fast a step runs on its hardware: precision, memory format, compilation, fused kernels, whole-pass
augmentation, the warm-up, gradient compression for slow links. Fields of ``Config`` (``config.fields`` composes them;
one flat set of keys for flags, YAML and the API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

from cifar10_dist.config.options import ABOVE_0, AT_LEAST_0, Bounds, option


@dataclass(frozen=True)
class SpeedKeys:
    """How fast a step runs on its hardware."""

    with_amp: Union[bool, str] = option(
        False,
        "mixed precision: auto (what the hardware runs fast: bf16 on CPUs with "
        "AMX or AVX512-BF16, fp32 on other CPUs; bf16 on GPUs of compute capability "
        "8.0+, else fp16 + GradScaler; bf16 on XLA), True (fp16 + GradScaler on CUDA, "
        "bf16 elsewhere, even where slow) or False (fp32)",
        short="mixed precision: auto, True or False",
        also_accepts=("auto",),
        may_change_on_resume=True,
    )
    amp_dtype: Literal["auto", "float16", "bfloat16"] = option(
        "auto",
        "with_amp=True's type: auto (fp16 + GradScaler on CUDA, bf16 on CPU and XLA), float16 (with a "
        "GradScaler) or bfloat16 (on GPUs that have it: no GradScaler)",
        short="with_amp=True's type",
        may_change_on_resume=True,
    )
    channels_last: Union[bool, str] = option(
        "auto",
        "channels-last memory format: auto (on for a model with 2D "
        "convolutions on a CPU or CUDA GPU, off elsewhere; logged and saved in "
        "config.yaml), True or False",
        short="channels-last memory format",
        also_accepts=("auto",),
        may_change_on_resume=True,
    )
    reuse_freed_memory: bool = option(
        True,
        "CPU training on Linux (glibc): freed memory stays in the process for reuse "
        "instead of going back to the OS after every step (wide batches train up to "
        "1.4x faster; the process keeps its peak memory until it exits)",
        short="CPU: keep freed memory for reuse",
        may_change_on_resume=True,
    )
    compile: bool = option(
        False,
        "torch.compile the model (a minute or more of warm-up; checkpoints stay plain)",
        short="torch.compile the model",
        may_change_on_resume=True,
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = option(
        "default",
        "compile=True's mode: default, reduce-overhead (the forward and backward replayed as CUDA graphs), "
        "max-autotune or max-autotune-no-cudagraphs",
        short="compile's mode",
        may_change_on_resume=True,
    )
    fused_optimizer: Union[bool, str] = option(
        "auto",
        "SGD/AdamW's update as one fused kernel per step: auto (on a "
        "CUDA GPU; also spares fp16's GradScaler a host wait), True or False "
        "(torch's foreach kernels)",
        short="fused optimizer kernel",
        also_accepts=("auto",),
        may_change_on_resume=True,
    )
    augment_per_pass: Union[bool, str] = option(
        "auto",
        "data_on_device: crop, flip and normalise a whole pass at its start, in the training dtype (airbench's "
        "loader), not batch by batch; auto: on a CUDA GPU when pad-crop and flip are the only augmentation",
        short="augment a whole pass at once",
        also_accepts=("auto",),
        may_change_on_resume=True,
    )
    low_precision_weights: bool = option(
        False,
        "keep the network's weights in bf16 (with_amp's dtype), BatchNorm in fp32, as "
        "airbench's .half() net, instead of casting fp32 weights at every step",
        short="keep weights in bf16",
    )
    tf32: bool = option(
        True,
        "allow TF32 matmuls and convolutions on Ampere or newer GPUs (ignored elsewhere)",
        short="TF32 matmuls on Ampere+ GPUs",
        may_change_on_resume=True,
    )
    cudnn_benchmark: bool = option(
        True,
        "let cuDNN time and pick convolution algorithms (GPU; off if deterministic)",
        short="let cuDNN pick its algorithms",
        may_change_on_resume=True,
    )
    warm_up_steps: Union[int, str] = option(
        "auto",
        "training steps on a batch of the real shapes before the timed "
        "ones, then undone bit for bit (autotuning and compilation fall outside "
        "the training time); auto: 3 on a CUDA GPU, else 0",
        short="untimed steps before training, undone",
        also_accepts=("auto",),
        bounds=AT_LEAST_0,
        tunable=False,
        may_change_on_resume=True,
    )
    grad_compression: Literal["none", "fp16", "bf16", "powersgd"] = option(
        "none",
        "compress the gradients processes exchange, for slow links between nodes (DDP's communication hooks; "
        "docs/launching.md): none, fp16 or bf16 (half the bytes), powersgd (rank powersgd_rank, error feedback; "
        "a fraction of the bytes)",
        short="none, fp16, bf16 or powersgd",
    )
    powersgd_rank: int = option(
        32,
        "powersgd: the rank of its low-rank approximation (higher: closer to the exact gradient, more bytes); 32 "
        "kept fast.yaml's accuracy over its 10 epochs, where a low rank cost points (docs/measured.md); a long run "
        "over a very slow link may do with less: measure it there",
        short="PowerSGD's rank",
        bounds=Bounds(1, 64, in_words="in 1..64"),
        only_with=("grad_compression", "powersgd"),
    )
    powersgd_start_step: int = option(
        10,
        "powersgd: the steps exchanged uncompressed before it starts (its warm start)",
        short="steps before PowerSGD starts",
        bounds=Bounds(2, in_words="at least 2"),
        only_with=("grad_compression", "powersgd"),
    )
    ddp_bucket_cap_mb: Optional[float] = option(
        None,
        "the size of DDP's gradient buckets in MB: processes exchange gradients a bucket at a time while backward "
        "goes on (None: torch's 25 MB, after a first bucket of 1 MB); grad_compression works a bucket at a time, "
        "so a resume keeps it",
        short="DDP's gradient bucket size, MB",
        bounds=ABOVE_0,
        tunable=False,
    )

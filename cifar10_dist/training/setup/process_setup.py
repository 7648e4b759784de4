"""What each process sets up before anything else: its device, seeds and numerics settings (deterministic
kernels, TF32, cuDNN autotuning, glibc's reuse_freed_memory), the run's precision (with why), and what a second
Ctrl-C does."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import ignite.distributed as idist
import torch
from ignite.utils import manual_seed

from cifar10_dist.config import Config
from cifar10_dist.errors import Interrupted
from cifar10_dist.outputs import log_lines
from cifar10_dist.system import cpu, ranks
from cifar10_dist.system.precision import Precision, choose_precision

logger = logging.getLogger("cifar10_dist")


def second_interrupt_ends_at_once() -> Callable[[], None] | None:
    """In a single process of its own (no launcher above it), a second Ctrl-C stops at once; a worker leaves
    that to its launcher (our spawning parent, torchrun or srun), which ends every worker."""
    if idist.get_world_size() > 1 or idist.backend() is not None:
        return None

    def stop_now() -> None:
        raise Interrupted(
            "interrupted again: stopped at once, without a new checkpoint; continue from the newest "
            "one with --resume_from=auto and the same --run_name"
        )

    return stop_now


def setup_process(config: Config) -> torch.device:
    """Device, seeds and the numerics settings of this process; logs the environment."""
    device = idist.device()
    log_lines.log_environment(config, device)
    manual_seed(config.seed)
    if config.deterministic:
        use_deterministic_algorithms()
    configure_device_speed(config, device)
    return device


def setup_precision(config: Config, device: torch.device) -> Precision:
    """The autocast type of this run (with_amp), logged with why it was chosen, and a warning where an explicit
    choice runs slowly on this hardware."""
    precision = choose_precision(device, config.with_amp, config.amp_dtype)
    ranks.on_rank_zero(logger.info, "precision: %s", precision.reason)
    if precision.warning:
        ranks.on_rank_zero(logger.warning, "%s", precision.warning)
    return precision


def settled_precision(config: Config, precision: Precision) -> dict[str, Any]:
    """with_amp and amp_dtype as the run trains (auto settled: True with the autocast type, or False), for
    config.yaml: what the run used, not what it was told to choose from."""
    if not precision.enabled:
        return {"with_amp": False}
    names = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
    return {"with_amp": True, "amp_dtype": names[precision.dtype] if precision.dtype is not None else "auto"}


def configure_device_speed(config: Config, device: torch.device) -> None:
    """On CPU, glibc keeps freed memory for reuse (reuse_freed_memory); TF32 and cuDNN autotuning on CUDA;
    deterministic mode overrides autotuning."""
    if device.type == "cpu" and config.reuse_freed_memory and cpu.keep_freed_memory():
        logger.info("reuse_freed_memory: freed memory stays in this process for reuse (glibc)")
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = config.tf32
    torch.backends.cudnn.allow_tf32 = config.tf32
    torch.backends.cudnn.benchmark = config.cudnn_benchmark and not config.deterministic


def use_deterministic_algorithms() -> None:
    """Bit-reproducible runs (same seed, world size and hardware): deterministic kernels only."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    logger.info("deterministic algorithms: on (CUBLAS_WORKSPACE_CONFIG=%s)", os.environ.get("CUBLAS_WORKSPACE_CONFIG"))

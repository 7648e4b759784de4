"""The package's log: set up for a run (INFO on rank 0, WARNING elsewhere, on stderr; Ignite's own INFO dumps
kept out), and the lines every run logs at its start (versions, devices, the config that differs from the
defaults) and at each evaluation. Other ranks only log warnings; the log kept in the run folder is ``run_log``'s."""

from __future__ import annotations

import contextlib
import logging
import platform
import sys
from typing import Any, Iterator, Mapping

import ignite
import ignite.distributed as idist
import torch

from cifar10_dist.config import Config, ConfigSource

logger = logging.getLogger("cifar10_dist")

QUIET_IGNITE_LOGGERS = (
    "ignite.distributed.auto.auto_dataloader",
    "ignite.distributed.auto.auto_model",
    "ignite.distributed.launcher.Parallel",
    "ignite.distributed.utils",
)


def quiet_ignite_loggers() -> None:
    """Keep Ignite's per-call INFO dumps (loader kwargs, launcher steps) out of the log; warnings still show.

    Ignite's ``setup_logger`` keeps the level of a logger that already exists, so setting it first suffices.
    """
    for name in QUIET_IGNITE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def package_logging() -> Iterator[None]:
    """INFO on rank 0, WARNING elsewhere, on stderr, for the package's loggers, while the run lasts.

    A ``cifar10_dist`` logger that the caller configured (it has handlers) is left exactly as it is; otherwise
    the handler, level and propagation set here are undone at the end, so an in-process run (notebook, Python
    API) leaves the caller's logging as it found it.
    """
    quiet_ignite_loggers()
    if logger.handlers:
        yield
        return
    rank = idist.get_rank()
    handler = logging.StreamHandler(sys.stderr)
    prefix = f"[rank {rank}] " if idist.get_world_size() > 1 and rank > 0 else ""
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def log_environment(config: Config, device: torch.device) -> None:
    """Versions, device (with its index on a GPU), distributed setting (whenever a backend is up, also with one
    process) and the keys of the resolved config that differ from the defaults."""
    logger.info(
        "python %s, torch %s, pytorch-ignite %s, device %s, %d CPU threads per process",
        platform.python_version(),
        torch.__version__,
        ignite.__version__,
        indexed(device),
        torch.get_num_threads(),
    )
    if idist.backend() is not None:
        logger.info(
            "distributed: backend %s, world size %d, %d processes per node, %d nodes",
            idist.backend(),
            idist.get_world_size(),
            idist.get_nproc_per_node(),
            idist.get_nnodes(),
        )
    source = config.config_source
    logger.info("config file: %s", ConfigSource(**source).describe() if source else "none (the defaults and the flags)")
    logger.info(
        "config (what differs from the defaults; every key is in the run folder's config.yaml): %s",
        ", ".join(f"{key}={value}" for key, value in changed_keys(config.to_dict()).items() if key != "config_source")
        or "the defaults",
    )


def changed_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys whose values are not the built-in defaults (an unknown key counts as changed)."""
    defaults = Config().to_dict()
    return {key: value for key, value in config.items() if key not in defaults or defaults[key] != value}


def indexed(device: torch.device) -> torch.device:
    """cuda -> cuda:N (the current device), so the log says which GPU; other devices as they are."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def log_metrics(
    epoch: int, split: str, metrics: Mapping[str, float], seconds: float, best_metric: str = "accuracy"
) -> None:
    """One line per evaluation: accuracy, top-5 (with more than 5 classes), the best_metric when it is another,
    the loss (the NLL) and the expected calibration error."""
    top5 = f", top-5 {metrics['top5_accuracy']:.4f}" if "top5_accuracy" in metrics else ""
    chosen = f", {best_metric} {metrics[best_metric]:.4f}" if best_metric != "accuracy" else ""
    calibration = f", ECE {metrics['ece']:.4f}" if "ece" in metrics else ""
    logger.info(
        "epoch %d %s: accuracy %.4f%s%s, loss %.4f on %d images%s (%.1f s)",
        epoch,
        split,
        metrics["accuracy"],
        top5,
        chosen,
        metrics["loss"],
        metrics["num_samples"],
        calibration,
        seconds,
    )

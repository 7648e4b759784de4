"""Everything rank 0 reports: log lines, the run folder, TensorBoard. Other ranks only log warnings.

This module is the one seam for rank-0-only work: callers never test the rank themselves.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import ignite
import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from cifar10_dist.errors import UserError

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


def setup_logging() -> None:
    """INFO on rank 0, WARNING elsewhere, one handler on stderr for the package's loggers."""
    quiet_ignite_loggers()
    rank = idist.get_rank()
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    prefix = f"[rank {rank}] " if idist.get_world_size() > 1 and rank > 0 else ""
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False


def is_main_process() -> bool:
    return idist.get_rank() == 0


def log_environment(config: Mapping[str, Any], device: torch.device) -> None:
    """Versions, device, distributed setting and the resolved config."""
    logger.info(
        "python %s, torch %s, pytorch-ignite %s, device %s, %d CPU threads per process",
        platform.python_version(),
        torch.__version__,
        ignite.__version__,
        device,
        torch.get_num_threads(),
    )
    if idist.get_world_size() > 1:
        logger.info(
            "distributed: backend %s, world size %d, %d processes per node, %d nodes",
            idist.backend(),
            idist.get_world_size(),
            idist.get_nproc_per_node(),
            idist.get_nnodes(),
        )
    logger.info("config: %s", ", ".join(f"{key}={value}" for key, value in config.items()))


def default_run_name(model: str, backend: str | None, world_size: int) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{model}_backend-{backend}-{world_size}_{stamp}"


def create_run_dir(output_path: str, run_name: str | None, model: str, backend: str | None) -> Path:
    """Rank 0 chooses and creates the run folder; every rank gets the same path back (or the same error)."""
    outcome = ""
    if is_main_process():
        name = run_name or default_run_name(model, backend, idist.get_world_size())
        try:
            (Path(output_path) / name).mkdir(parents=True, exist_ok=True)
            outcome = "ok:" + name
        except OSError as error:
            outcome = f"error:output_path='{output_path}' is not writable ({error.strerror})"
    if idist.get_world_size() > 1:
        outcome = idist.broadcast(outcome, src=0, safe_mode=True)
    status, _, detail = outcome.partition(":")
    if status == "error":
        raise UserError(detail)
    return Path(output_path) / detail


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    return optimizer.param_groups[0]["lr"]


def attach_progress_logging(
    trainer: Engine, optimizer: torch.optim.Optimizer, log_every: int, batch_size: int, num_epochs: int
) -> None:
    """Loss, learning rate and throughput every ``log_every`` iterations, and the duration of each epoch."""
    timing = {"iteration": 0, "time": time.perf_counter()}

    @trainer.on(Events.EPOCH_STARTED)
    def reset_timer(engine: Engine) -> None:
        timing.update(iteration=engine.state.iteration, time=time.perf_counter())

    @trainer.on(Events.ITERATION_COMPLETED(every=log_every))
    def log_loss(engine: Engine) -> None:
        now = time.perf_counter()
        images = (engine.state.iteration - timing["iteration"]) * batch_size
        speed = images / max(now - timing["time"], 1e-9)
        timing.update(iteration=engine.state.iteration, time=now)
        epoch_length = engine.state.epoch_length or 0
        in_epoch = (engine.state.iteration - 1) % epoch_length + 1 if epoch_length else engine.state.iteration
        logger.info(
            "epoch %d/%d iter %d/%d: loss %.4f, lr %.4g, %.0f img/s",
            engine.state.epoch,
            num_epochs,
            in_epoch,
            epoch_length,
            engine.state.output,
            current_lr(optimizer),
            speed,
        )

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_epoch_time(engine: Engine) -> None:
        seconds = engine.state.times.get("EPOCH_COMPLETED") or 0.0
        images = (engine.state.epoch_length or 0) * batch_size
        logger.info("epoch %d done in %.1f s (%.0f img/s)", engine.state.epoch, seconds, images / max(seconds, 1e-9))


def log_metrics(epoch: int, split: str, metrics: Mapping[str, float], seconds: float) -> None:
    logger.info(
        "epoch %d %s: accuracy %.4f, loss %.4f on %d images (%.1f s)",
        epoch,
        split,
        metrics["accuracy"],
        metrics["loss"],
        metrics["num_samples"],
        seconds,
    )


def log_peak_memory() -> None:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    import resource

    logger.info("peak resident memory %.0f MiB (this process)", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


class TensorBoard:
    """TensorBoard event files in the run folder (rank 0 only; a no-op elsewhere)."""

    def __init__(self, run_dir: Path) -> None:
        self.writer = None
        if is_main_process():
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir))

    def attach_training(self, trainer: Engine, optimizer: torch.optim.Optimizer, every: int) -> None:
        if self.writer is None:
            return

        @trainer.on(Events.ITERATION_COMPLETED(every=every))
        def write_loss(engine: Engine) -> None:
            self.writer.add_scalar("training/batch_loss", engine.state.output, engine.state.iteration)
            self.writer.add_scalar("training/lr", current_lr(optimizer), engine.state.iteration)

    def write_metrics(self, split: str, metrics: Mapping[str, float], epoch: int) -> None:
        if self.writer is None:
            return
        for name in ("accuracy", "loss"):
            self.writer.add_scalar(f"{split}/{name}", metrics[name], epoch)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def write_json(path: Path, content: Mapping[str, Any]) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    temporary = path.with_name(path.name + f".tmp{os.getpid()}")
    temporary.write_text(json.dumps(content, indent=2) + "\n")
    temporary.replace(path)

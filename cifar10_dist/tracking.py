"""Everything rank 0 reports: log lines, the run folder, TensorBoard, metrics.jsonl, ClearML.
Other ranks only log warnings.

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
    """Rank 0: a progress bar per epoch on a terminal, else a line every ``log_every`` iterations (loss,
    learning rate, global images/s, ETA of the run); the duration of each epoch either way."""
    if not is_main_process():
        return
    if sys.stderr.isatty():
        from ignite.handlers import ProgressBar

        ProgressBar(persist=False, bar_format=None).attach(
            trainer, output_transform=lambda loss: {"loss": loss, "lr": current_lr(optimizer)}
        )
    else:
        _attach_progress_lines(trainer, optimizer, log_every, batch_size, num_epochs)

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_epoch_time(engine: Engine) -> None:
        seconds = engine.state.times.get("EPOCH_COMPLETED") or 0.0
        images = (engine.state.epoch_length or 0) * batch_size
        logger.info("epoch %d done in %.1f s (%.0f img/s)", engine.state.epoch, seconds, images / max(seconds, 1e-9))


def _attach_progress_lines(
    trainer: Engine, optimizer: torch.optim.Optimizer, log_every: int, batch_size: int, num_epochs: int
) -> None:
    timing = {"iteration": 0, "time": time.perf_counter()}

    @trainer.on(Events.EPOCH_STARTED)
    def reset_timer(engine: Engine) -> None:
        timing.update(iteration=engine.state.iteration, time=time.perf_counter())

    @trainer.on(Events.ITERATION_COMPLETED(every=log_every))
    def log_loss(engine: Engine) -> None:
        now = time.perf_counter()
        seconds_per_iteration = (now - timing["time"]) / max(engine.state.iteration - timing["iteration"], 1)
        timing.update(iteration=engine.state.iteration, time=now)
        epoch_length = engine.state.epoch_length or 0
        in_epoch = (engine.state.iteration - 1) % epoch_length + 1 if epoch_length else engine.state.iteration
        remaining = num_epochs * epoch_length - engine.state.iteration
        logger.info(
            "epoch %d/%d iter %d/%d: loss %.4f, lr %.4g, %.0f img/s, ETA %s",
            engine.state.epoch,
            num_epochs,
            in_epoch,
            epoch_length,
            engine.state.output,
            current_lr(optimizer),
            batch_size / max(seconds_per_iteration, 1e-9),
            format_duration(remaining * seconds_per_iteration),
        )


def format_duration(seconds: float) -> str:
    """Seconds as H:MM:SS (training time left; evaluation not included)."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


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


class Recorder:
    """Rank 0's record of a run: TensorBoard scalars and metrics.jsonl (a no-op on the other ranks).

    metrics.jsonl gets one line per epoch (``"event": "epoch"``: lr, mean training loss of the epoch on rank 0,
    ``epoch_time`` =
    seconds of training in the epoch, evaluation excluded, images/s) and one per evaluation
    (``"event": "evaluation"``: split, accuracy, loss, num_samples, ``duration``). A resumed run appends;
    a later line for the same epoch (and split) supersedes an earlier one.
    """

    def __init__(self, run_dir: Path) -> None:
        self.writer = None
        self.lines = run_dir / "metrics.jsonl"
        self.running_loss: float | None = None
        if is_main_process():
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir))

    def attach_training(self, trainer: Engine, optimizer: torch.optim.Optimizer, every: int, batch_size: int) -> None:
        if self.writer is None:
            return
        started = {"iteration": 0}
        epoch_losses: list[float] = []

        @trainer.on(Events.EPOCH_STARTED)
        def remember_start(engine: Engine) -> None:
            started["iteration"] = engine.state.iteration
            epoch_losses.clear()

        @trainer.on(Events.ITERATION_COMPLETED)
        def average_loss(engine: Engine) -> None:
            loss = float(engine.state.output)
            epoch_losses.append(loss)
            self.running_loss = loss if self.running_loss is None else 0.98 * self.running_loss + 0.02 * loss

        @trainer.on(Events.ITERATION_COMPLETED(every=every))
        def write_loss(engine: Engine) -> None:
            self.writer.add_scalar("training/loss", self.running_loss, engine.state.iteration)
            self.writer.add_scalar("training/lr", current_lr(optimizer), engine.state.iteration)

        @trainer.on(Events.EPOCH_COMPLETED)
        def write_epoch(engine: Engine) -> None:
            seconds = engine.state.times.get("EPOCH_COMPLETED") or 0.0
            speed = (engine.state.iteration - started["iteration"]) * batch_size / max(seconds, 1e-9)
            self.writer.add_scalar("training/epoch_time", seconds, engine.state.epoch)
            self.writer.add_scalar("training/images_per_second", speed, engine.state.epoch)
            self._append({"event": "epoch", "epoch": engine.state.epoch, "iteration": engine.state.iteration,
                          "lr": current_lr(optimizer), "train_loss": sum(epoch_losses) / max(len(epoch_losses), 1),
                          "epoch_time": seconds,
                          "images_per_second": speed})

    def write_metrics(self, split: str, metrics: Mapping[str, float], epoch: int, iteration: int, seconds: float) -> None:
        if self.writer is None:
            return
        for name in ("accuracy", "loss"):
            self.writer.add_scalar(f"{split}/{name}", metrics[name], epoch)
        self.writer.add_scalar(f"{split}/duration", seconds, epoch)
        self.writer.flush()
        self._append({"event": "evaluation", "split": split, "epoch": epoch, "iteration": iteration,
                      "accuracy": metrics["accuracy"], "loss": metrics["loss"],
                      "num_samples": metrics["num_samples"], "duration": seconds})

    def _append(self, line: Mapping[str, Any]) -> None:
        with self.lines.open("a") as stream:
            stream.write(json.dumps(line) + "\n")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class ClearML:
    """ClearML tracking through Ignite's handlers (rank 0; ``with_clearml``): the task is named after the run
    folder, the resolved config is connected, scalars are reported and checkpoints go through ClearMLSaver.
    ``clearml_offline`` (or ClearML's own CLEARML_OFFLINE_MODE=1) records the session locally."""

    def __init__(self, config: Mapping[str, Any], run_dir: Path) -> None:
        self.logger = None
        self.task = None
        self.enabled = bool(config["with_clearml"])
        if not self.enabled or not is_main_process():
            return
        from clearml import Task
        from ignite.handlers.clearml_logger import ClearMLLogger

        if config["clearml_offline"]:
            Task.set_offline(offline_mode=True)
        self.logger = ClearMLLogger(project_name=config["clearml_project"], task_name=run_dir.name)
        self.task = Task.current_task()  # the task ClearMLLogger just started
        self.task.connect(dict(config), name="config")

    def saver(self, run_dir: Path) -> Any:
        """Checkpoint writer: ClearMLSaver (on every rank; it registers the files with the task on rank 0)."""
        from ignite.handlers.clearml_logger import ClearMLSaver

        return ClearMLSaver(self.logger, dirname=str(run_dir), require_empty=False, atomic=True)

    def attach(self, trainer: Engine, optimizer: torch.optim.Optimizer, evaluators: Mapping[str, Engine], every: int) -> None:
        if self.logger is None:
            return
        from ignite.handlers import global_step_from_engine

        every_n = Events.ITERATION_COMPLETED(every=every)
        self.logger.attach_output_handler(trainer, every_n, tag="training", output_transform=lambda loss: {"batch_loss": loss})
        self.logger.attach_opt_params_handler(trainer, every_n, optimizer=optimizer, param_name="lr")
        for split, evaluator in evaluators.items():
            self.logger.attach_output_handler(evaluator, Events.COMPLETED, tag=split, metric_names=["accuracy", "loss"],
                                              global_step_transform=global_step_from_engine(trainer))

    def offline_folder(self) -> str | None:
        if self.logger is None or not self.task.is_offline():
            return None
        return str(self.task.get_offline_mode_folder())

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()


def write_json(path: Path, content: Mapping[str, Any]) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    temporary = path.with_name(path.name + f".tmp{os.getpid()}")
    temporary.write_text(json.dumps(content, indent=2) + "\n")
    temporary.replace(path)

"""What rank 0 reports while a run goes: log lines, progress on the console, TensorBoard, metrics.jsonl, and the
trackers that are on (``trackers``: ClearML, MLflow, W&B).
Other ranks only log warnings (the rank itself is tested in ``ranks`` alone; the run folder is ``run_folder``).

One name per quantity, the same in TensorBoard, ClearML (title/series), MLflow and metrics.jsonl (event/key):
``training/batch_loss`` and ``training/lr`` every log_every_iters iterations (and ``training/grad_norm``, the
pre-clip gradient norm, with clip_grad_norm); ``training/epoch_loss``,
``training/epoch_time``, ``training/images_per_second`` per epoch (metrics.jsonl: ``"event": "epoch"``);
``<split>/accuracy``, ``<split>/loss``, ``<split>/duration``, ``<split>/balanced_accuracy``, ``<split>/macro_f1``
(and ``<split>/top5_accuracy`` with more than 5 classes) per evaluation (``"event": "evaluation"``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import ignite
import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from cifar10_dist.config import Config, ConfigSource
from cifar10_dist.outputs import files
from cifar10_dist.system.ranks import on_rank_zero

logger = logging.getLogger("cifar10_dist")

QUIET_IGNITE_LOGGERS = (
    "ignite.distributed.auto.auto_dataloader",
    "ignite.distributed.auto.auto_model",
    "ignite.distributed.launcher.Parallel",
    "ignite.distributed.utils",
)


# ---------------------------------------------------------------- logging


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


def log_environment(config: Mapping[str, Any], device: torch.device) -> None:
    """Versions, device (with its index on a GPU), distributed setting (whenever a backend is up, also with one
    process) and the keys of the resolved config that differ from the defaults."""
    logger.info(
        "python %s, torch %s, pytorch-ignite %s, device %s, %d CPU threads per process",
        platform.python_version(), torch.__version__, ignite.__version__, indexed(device), torch.get_num_threads(),
    )
    if idist.backend() is not None:
        logger.info(
            "distributed: backend %s, world size %d, %d processes per node, %d nodes",
            idist.backend(), idist.get_world_size(), idist.get_nproc_per_node(), idist.get_nnodes(),
        )
    source = config.get("config_source")
    logger.info("config file: %s", ConfigSource(**source).describe() if source else "none (the defaults and the flags)")
    logger.info("config (what differs from the defaults; every key is in the run folder's config.yaml): %s",
                ", ".join(f"{key}={value}" for key, value in changed_keys(config).items()
                          if key != "config_source") or "the defaults")


def changed_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys whose values are not the built-in defaults (an unknown key counts as changed)."""
    defaults = Config().to_dict()
    return {key: value for key, value in config.items() if key not in defaults or defaults[key] != value}


def step_output(engine: Engine) -> Any:
    """What the trainer's step returned (training.loop.step.StepOutput: the loss and grad norm, on the device);
    Ignite types ``state.output`` as an int."""
    return engine.state.output


def indexed(device: torch.device) -> torch.device:
    """cuda -> cuda:N (the current device), so the log says which GPU; other devices as they are."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def log_metrics(epoch: int, split: str, metrics: Mapping[str, float], seconds: float,
                best_metric: str = "accuracy") -> None:
    """One line per evaluation: accuracy, top-5 (with more than 5 classes), the best_metric when it is another,
    the loss (the NLL) and the expected calibration error."""
    top5 = f", top-5 {metrics['top5_accuracy']:.4f}" if "top5_accuracy" in metrics else ""
    chosen = f", {best_metric} {metrics[best_metric]:.4f}" if best_metric != "accuracy" else ""
    calibration = f", ECE {metrics['ece']:.4f}" if "ece" in metrics else ""
    logger.info("epoch %d %s: accuracy %.4f%s%s, loss %.4f on %d images%s (%.1f s)", epoch, split,
                metrics["accuracy"], top5, chosen, metrics["loss"], metrics["num_samples"], calibration, seconds)


def private_memory_mib() -> float:
    """This process's private (anonymous) resident memory now, in MiB: what it holds alone, without the pages of
    files it maps (an image cache read on demand, shared by the node's processes); -1 where /proc is missing."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return -1.0
    line = next((line for line in status.splitlines() if line.startswith("RssAnon:")), None)
    return int(line.split()[1]) / 1024 if line else -1.0


def log_peak_memory() -> None:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB), and on a GPU its peak allocated
    and reserved memory."""
    import resource

    logger.info("peak resident memory %.0f MiB (this process)", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        logger.info("peak GPU memory %.0f MiB allocated, %.0f MiB reserved (cuda:%d, this process)",
                    torch.cuda.max_memory_allocated(device) / 2**20, torch.cuda.max_memory_reserved(device) / 2**20,
                    device)


# ---------------------------------------------------------------- progress on the console


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    return optimizer.param_groups[0]["lr"]


def attach_progress_logging(
    trainer: Engine, optimizer: torch.optim.Optimizer, log_every: int, images_per_iteration: int, num_epochs: int
) -> None:
    """Rank 0: a progress bar per epoch on a terminal, else a line every ``log_every`` iterations (loss,
    learning rate, global images/s, ETA of the run); the duration of each epoch either way.
    ``images_per_iteration`` is what all processes together train on per step."""
    on_rank_zero(_attach_progress, trainer, optimizer, log_every, images_per_iteration, num_epochs)


def _attach_progress(trainer: Engine, optimizer: torch.optim.Optimizer, log_every: int, images_per_iteration: int,
                     num_epochs: int) -> None:
    if sys.stderr.isatty():
        from ignite.handlers import ProgressBar

        shown = {"loss": float("nan")}  # read at log iterations only: the bar itself never waits for the device

        @trainer.on(Events.ITERATION_COMPLETED(every=log_every))
        def read_loss(engine: Engine) -> None:
            shown["loss"] = float(step_output(engine).loss)

        ProgressBar(persist=False, bar_format=None).attach(
            trainer, output_transform=lambda _: {"loss": shown["loss"], "lr": current_lr(optimizer)}
        )
    else:
        _attach_progress_lines(trainer, optimizer, log_every, images_per_iteration, num_epochs)

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_epoch_time(engine: Engine) -> None:
        seconds = engine.state.times.get("EPOCH_COMPLETED") or 0.0
        images = (engine.state.epoch_length or 0) * images_per_iteration
        logger.info("epoch %d done in %.1f s (%.0f img/s)", engine.state.epoch, seconds, images / max(seconds, 1e-9))


def _attach_progress_lines(
    trainer: Engine, optimizer: torch.optim.Optimizer, log_every: int, images_per_iteration: int, num_epochs: int
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
            engine.state.epoch, num_epochs, in_epoch, epoch_length, float(step_output(engine).loss), current_lr(optimizer),
            images_per_iteration / max(seconds_per_iteration, 1e-9), format_duration(remaining * seconds_per_iteration),
        )


def format_duration(seconds: float) -> str:
    """Seconds as H:MM:SS (training time left; evaluation not included)."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# ---------------------------------------------------------------- scalars: TensorBoard, metrics.jsonl, trackers


class Recorder:
    """Rank 0's record of a run: TensorBoard, metrics.jsonl and the trackers that are on (ClearML, MLflow: each
    has ``report_scalar`` and ``flush``), from one source, one name per quantity (see the module docstring); a
    no-op on the other ranks.

    metrics.jsonl gets one line per epoch (``"event": "epoch"``: lr, epoch_loss = mean training loss of the
    epoch on rank 0, epoch_time = seconds of training, evaluation excluded, images_per_second) and one per
    evaluation (``"event": "evaluation"``: split, accuracy, loss, num_samples, duration). A resumed run
    appends; a later line for the same epoch (and split) supersedes an earlier one.
    """

    def __init__(self, run_dir: Path, *trackers: Any) -> None:
        self.run_dir = run_dir
        self.trackers = tuple(tracker for tracker in trackers if tracker is not None and tracker.enabled)
        self.writer: Any = None
        self.events_file: Path | None = None  # TensorBoard's file, named once its writer opened it
        self.lines = run_dir / "metrics.jsonl"
        on_rank_zero(self._open)

    def _open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        with self._writing_events():
            self.writer = SummaryWriter(log_dir=str(self.run_dir))
        events = sorted(self.run_dir.glob("events.out.tfevents.*"), key=lambda path: path.stat().st_mtime)
        self.events_file = events[-1] if events else None  # the writer's new file (a resumed run adds one)
        self.excepthook = threading.excepthook
        threading.excepthook = self._quiet_event_writer_failure

    def _quiet_event_writer_failure(self, hook_args: Any) -> None:
        """TensorBoard's writer thread dies printing a traceback when the disk is full; the same error reaches
        the run through the next write (one line, see files.writing), so the thread's copy is not printed."""
        if files.unwritable_cause(hook_args.exc_value) is None:
            self.excepthook(hook_args)

    def attach_training(self, trainer: Engine, optimizer: torch.optim.Optimizer, every: int,
                        images_per_iteration: int) -> None:
        if self.writer is None:
            return
        started = {"iteration": 0}
        epoch_losses: list[torch.Tensor] = []  # on the device, summed at every log: no iteration waits for it

        @trainer.on(Events.EPOCH_STARTED)
        def remember_start(engine: Engine) -> None:
            started["iteration"] = engine.state.iteration
            epoch_losses.clear()

        @trainer.on(Events.ITERATION_COMPLETED)
        def collect_loss(engine: Engine) -> None:
            epoch_losses.append(step_output(engine).loss)

        @trainer.on(Events.ITERATION_COMPLETED(every=every))
        def write_batch(engine: Engine) -> None:
            epoch_losses[:] = [torch.stack(epoch_losses).sum()]
            output = step_output(engine)
            values = {"batch_loss": float(output.loss), "lr": current_lr(optimizer)}
            if output.grad_norm is not None:  # clip_grad_norm: the last step's, pre-clip
                values["grad_norm"] = float(output.grad_norm)
            self._scalars("training", values, engine.state.iteration, flush=False)

        @trainer.on(Events.EPOCH_COMPLETED)
        def write_epoch(engine: Engine) -> None:
            seconds = engine.state.times.get("EPOCH_COMPLETED") or 0.0
            iterations = engine.state.iteration - started["iteration"]
            speed = iterations * images_per_iteration / max(seconds, 1e-9)
            total = float(torch.stack(epoch_losses).sum()) if epoch_losses else 0.0
            values = {"epoch_loss": total / max(iterations, 1), "epoch_time": seconds, "images_per_second": speed}
            self._scalars("training", values, engine.state.epoch)
            self._append({"event": "epoch", "epoch": engine.state.epoch, "iteration": engine.state.iteration,
                          "lr": current_lr(optimizer), **values})

    def write_metrics(self, split: str, metrics: Mapping[str, float], epoch: int, iteration: int, seconds: float) -> None:
        if self.writer is None:
            return
        optional = {name: metrics[name] for name in ("top5_accuracy", "balanced_accuracy", "macro_f1", "ece")
                    if name in metrics}
        self._scalars(split, {"accuracy": metrics["accuracy"], **optional, "loss": metrics["loss"],
                              "duration": seconds}, epoch)
        self._append({"event": "evaluation", "split": split, "epoch": epoch, "iteration": iteration,
                      "accuracy": metrics["accuracy"], **optional, "loss": metrics["loss"],
                      "num_samples": metrics["num_samples"], "duration": seconds})

    def write_event(self, line: Mapping[str, Any]) -> None:
        """One more line of metrics.jsonl (``"event"`` says what it records; rank 0 only)."""
        if self.writer is not None:
            self._append(line)

    def write_image(self, tag: str, pixels: Any, step: int) -> None:
        """An H x W x 3 uint8 picture in TensorBoard's image tab (rank 0)."""
        if self.writer is not None:
            with self._writing_events():
                self.writer.add_image(tag, pixels, step, dataformats="HWC")
                self.writer.flush()

    def write_hparams(self, config: Mapping[str, Any], final: Mapping[str, float], step: int) -> None:
        """The config as hyperparameters and the final metrics, for TensorBoard's HParams tab; the metrics are
        also scalars at ``step`` (the run's last iteration), at the right end of the charts."""
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams

        values = {key: value if isinstance(value, (int, float, str, bool)) else str(value)
                  for key, value in config.items()}
        with self._writing_events():
            for summary in hparams(values, dict(final)):
                self.writer._get_file_writer().add_summary(summary)
            for name, value in final.items():
                self.writer.add_scalar(name, value, step)
                for tracker in self.trackers:
                    tracker.report_scalar(name, value, step)
            self.writer.flush()
        for tracker in self.trackers:
            tracker.flush()

    def _scalars(self, group: str, values: Mapping[str, float], step: int, flush: bool = True) -> None:
        """Write scalars; ``flush`` them to disk at once (epochs, evaluations; batch scalars wait for the next
        flush: a flush costs about 0.4 ms, 28 us per iteration at a log every 15 iterations of a tiny model)."""
        with self._writing_events():
            for name, value in values.items():
                self.writer.add_scalar(f"{group}/{name}", value, step)
                for tracker in self.trackers:
                    tracker.report_scalar(f"{group}/{name}", value, step)
            if flush:
                self.writer.flush()
        if flush:
            for tracker in self.trackers:
                tracker.flush()

    def _writing_events(self) -> contextlib.AbstractContextManager:
        return files.writing(self.events_file or self.run_dir / "events.out.tfevents.*")

    def _append(self, line: Mapping[str, Any]) -> None:
        """Append one line; after a failed write the file is cut back to its earlier length (no partial line)."""
        data = memoryview((json.dumps(line) + "\n").encode())
        with files.writing(self.lines), self.lines.open("ab", buffering=0) as stream:
            length = stream.seek(0, os.SEEK_END)
            try:
                while data:
                    data = data[stream.write(data):]
            except OSError:
                stream.truncate(length)
                raise

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        """Close; when the run is already failing, a second failure to write is not reported over the first."""
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        """Flush and close TensorBoard; raises OutputNotWritable if the last events cannot be written."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            try:
                with self._writing_events():
                    writer.close()
            finally:
                threading.excepthook = self.excepthook

"""Rank 0's record of a run's quantities, one name per quantity, the same in TensorBoard, ClearML (title/series),
MLflow, W&B (the trackers that are on: ``trackers``) and metrics.jsonl (event/key):
``training/batch_loss`` and ``training/lr`` every log_every_iters iterations (and ``training/grad_norm``, the
pre-clip gradient norm, with clip_grad_norm); ``training/epoch_loss``, ``training/epoch_time``,
``training/images_per_second`` per epoch (metrics.jsonl: ``"event": "epoch"``); ``<split>/accuracy``,
``<split>/loss``, ``<split>/duration``, ``<split>/balanced_accuracy``, ``<split>/macro_f1`` (and
``<split>/top5_accuracy`` with more than 5 classes) per evaluation (``"event": "evaluation"``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Mapping

import torch
from ignite.engine import Engine, Events

from cifar10_dist.outputs import files
from cifar10_dist.outputs.progress import EpochClock, current_lr, step_output
from cifar10_dist.system.ranks import on_rank_zero


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
        self.optimizer: Any = None
        self.clock: Any = None
        self.epoch_losses: list[torch.Tensor] = []  # the epoch's, on the device: summed at every log, no wait
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

    def attach_training(self, trainer: Engine, optimizer: torch.optim.Optimizer, every: int, clock: EpochClock) -> None:
        """The training scalars: batch loss and lr (and grad norm) every ``every`` iterations, and per epoch its
        mean loss, time and speed (``clock``'s)."""
        if self.writer is None:
            return
        self.optimizer, self.clock = optimizer, clock
        trainer.add_event_handler(Events.EPOCH_STARTED, lambda _: self.epoch_losses.clear())
        trainer.add_event_handler(
            Events.ITERATION_COMPLETED, lambda engine: self.epoch_losses.append(step_output(engine).loss)
        )
        trainer.add_event_handler(Events.ITERATION_COMPLETED(every=every), self._write_batch)
        trainer.add_event_handler(Events.EPOCH_COMPLETED, self._write_epoch)

    def _write_batch(self, engine: Engine) -> None:
        self.epoch_losses[:] = [torch.stack(self.epoch_losses).sum()]
        output = step_output(engine)
        values = {"batch_loss": float(output.loss), "lr": current_lr(self.optimizer)}
        if output.grad_norm is not None:  # clip_grad_norm: the last step's, pre-clip
            values["grad_norm"] = float(output.grad_norm)
        self._scalars("training", values, engine.state.iteration, flush=False)

    def _write_epoch(self, engine: Engine) -> None:
        timing = self.clock.timing(engine)
        total = float(torch.stack(self.epoch_losses).sum()) if self.epoch_losses else 0.0
        values = {
            "epoch_loss": total / max(timing.iterations, 1),
            "epoch_time": timing.seconds,
            "images_per_second": timing.images_per_second,
        }
        self._scalars("training", values, engine.state.epoch)
        self._append(
            {
                "event": "epoch",
                "epoch": engine.state.epoch,
                "iteration": engine.state.iteration,
                "lr": current_lr(self.optimizer),
                **values,
            }
        )

    def write_metrics(
        self, split: str, metrics: Mapping[str, float], epoch: int, iteration: int, seconds: float
    ) -> None:
        if self.writer is None:
            return
        optional = {
            name: metrics[name] for name in ("top5_accuracy", "balanced_accuracy", "macro_f1", "ece") if name in metrics
        }
        self._scalars(
            split, {"accuracy": metrics["accuracy"], **optional, "loss": metrics["loss"], "duration": seconds}, epoch
        )
        self._append(
            {
                "event": "evaluation",
                "split": split,
                "epoch": epoch,
                "iteration": iteration,
                "accuracy": metrics["accuracy"],
                **optional,
                "loss": metrics["loss"],
                "num_samples": metrics["num_samples"],
                "duration": seconds,
            }
        )

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

        values = {
            key: value if isinstance(value, (int, float, str, bool)) else str(value) for key, value in config.items()
        }
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
                    data = data[stream.write(data) :]
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

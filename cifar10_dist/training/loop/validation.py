"""What the training loop evaluates with and how: the run's engines (``EngineSet``: the trainer, the evaluators of
the train subset, the selection split and the test, and what hangs on them) and ``Validation``, which evaluates
after an epoch, logs and records the metrics and keeps the latest."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from ignite.engine import Engine
from ignite.handlers import EarlyStopping

from cifar10_dist.data import loaders
from cifar10_dist.models.viewing import TemperatureScaled
from cifar10_dist.outputs import log_lines, scalars
from cifar10_dist.recipes.lookahead import Lookahead
from cifar10_dist.training.loop.averaging import WeightAverage
from cifar10_dist.training.loop.evaluators import MistakeCollector
from cifar10_dist.training.loop.warm_up import WarmUp


@dataclass
class EngineSet:
    trainer: Engine
    train_evaluator: Engine  # the fixed train subset, without test-time augmentation
    selection_evaluator: Engine  # val (held out) or test: chooses the best model
    test_evaluator: Engine  # with a held-out split, the one test evaluation; else the selection evaluator
    lookahead: Lookahead | None
    ema: WeightAverage | None = None
    ema_evaluator: Engine | None = None  # the EMA weights on the selection split
    early_stopping: EarlyStopping | None = None
    trial_reporter: Any = None  # a tuning trial: reports to its Optuna trial and may prune (trials.TrialReporter)
    mistakes: MistakeCollector | None = None  # on the evaluation that gives the final test numbers
    calibration: tuple[Engine, TemperatureScaled] | None = None  # calibrate: val logits, the test's T
    warm_up: WarmUp | None = None  # steps before the timed training, undone (``warm_up_steps``)

    @property
    def choosing_evaluator(self) -> Engine:
        """The evaluation that chooses the best model and drives early stopping: the EMA's when there is one."""
        return self.ema_evaluator or self.selection_evaluator

    @property
    def stopped_early(self) -> bool:
        return self.early_stopping is not None and self.early_stopping.counter >= self.early_stopping.patience


@dataclass
class Validation:
    """Evaluates on the train subset (if any) and the selection split (held-out val, else test); logs and
    records the metrics and keeps the latest."""

    engine_set: EngineSet
    split: str  # "val" or "test"
    loaders: loaders.Loaders
    recorder: scalars.Recorder
    best_metric: str = "accuracy"
    latest: dict[str, Any] | None = None
    iteration: int = 0
    calibration: dict[str, Any] | None = None  # calibrate=temperature: T and val's NLL and ECE before and after

    def __call__(self, trainer: Engine) -> None:
        if trainer.state.output is not None and not math.isfinite(float(trainer.state.output.loss)):  # type: ignore[attr-defined]
            return  # training stopped on NaN: nothing worth measuring
        epoch, self.iteration = trainer.state.epoch, trainer.state.iteration
        results: dict[str, Any] = {"epoch": epoch, "train": None}
        if self.loaders.train_eval is not None:
            results["train"] = self.measure(
                "train_subset", self.engine_set.train_evaluator, self.loaders.train_eval, epoch
            )
        loader = self.loaders.val if self.split == "val" else self.loaders.test
        results[self.split] = self.measure(self.split, self.engine_set.selection_evaluator, loader, epoch)
        if self.engine_set.ema_evaluator is not None:
            results[f"{self.split}_ema"] = self.measure(
                f"{self.split}_ema", self.engine_set.ema_evaluator, loader, epoch
            )
        self.latest = results

    def measure(self, split: str, evaluator: Engine, loader: Any, epoch: int) -> dict[str, Any]:
        start = time.perf_counter()
        metrics = dict(evaluator.run(loader).metrics)
        metrics.pop("calibration_bins", None)  # (the run's end draws the final test's)
        seconds = time.perf_counter() - start
        log_lines.log_metrics(epoch, split, metrics, seconds, self.best_metric)
        self.recorder.write_metrics(split, metrics, epoch, self.iteration, seconds)
        return metrics

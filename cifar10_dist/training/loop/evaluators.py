"""Evaluation engines: accuracy, loss (the NLL), the expected calibration error and the number of images (exact
across processes, optionally the confusion matrix), with test-time augmentation; and when a trainer validates."""

from __future__ import annotations

import logging
from typing import Any, Callable

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import EarlyStopping
from ignite.metrics import Accuracy, ConfusionMatrix, Loss, Metric, MetricsLambda, TopKCategoricalAccuracy
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce
from torch import nn

from cifar10_dist.data.batches import Batch, PrepareBatch
from cifar10_dist.models.viewing import tta_logits
from cifar10_dist.outputs.mistake_grid import SHOWN
from cifar10_dist.results import Mistake
from cifar10_dist.system.precision import Precision

logger = logging.getLogger("cifar10_dist")


class NumSamples(Metric):
    """How many samples the evaluation saw, summed over all processes."""

    @reinit__is_reduced
    def reset(self) -> None:
        self._count = torch.tensor(0, device=self._device)

    @reinit__is_reduced
    def update(self, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._count += output[1].shape[0]

    @sync_all_reduce("_count")
    def compute(self) -> int:
        return int(self._count.item())


CALIBRATION_BINS = 15  # equal-width bins of the top-1 probability (Guo et al. 2017)


class CalibrationBins(Metric):
    """Per bin of the top-1 probability ((0, 1/15], ..., (14/15, 1]): images, their summed top-1 probability and
    how many were right, as a (3, bins) tensor summed over all processes (the reliability diagram's data)."""

    def __init__(self, bins: int = CALIBRATION_BINS, device: torch.device | str = "cpu") -> None:
        self.bins = bins
        super().__init__(device=device)

    @reinit__is_reduced
    def reset(self) -> None:
        self._sums = torch.zeros(3, self.bins, device=self._device)

    @reinit__is_reduced
    def update(self, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        logits, targets = output[0].detach(), output[1]
        confidence, predicted = logits.float().softmax(dim=1).max(dim=1)
        index = ((confidence * self.bins).ceil().long().clamp(1, self.bins) - 1).to(self._device)
        for row, values in enumerate((torch.ones_like(confidence), confidence, (predicted == targets).float())):
            self._sums[row].index_add_(0, index, values.to(self._device))

    @sync_all_reduce("_sums")
    def compute(self) -> torch.Tensor:
        return self._sums.clone()


def expected_calibration_error(sums: torch.Tensor) -> float:
    """ECE = sum over bins of (images in bin / images) x |accuracy in bin - mean top-1 probability in bin|."""
    counts, confidence, correct = sums.double()
    total = counts.sum()
    return float((correct - confidence).abs().sum() / total) if total > 0 else 0.0


def reliability(sums: torch.Tensor) -> dict[str, list[float]]:
    """The reliability diagram's rows from CalibrationBins: per bin its images, mean top-1 probability and
    accuracy (0 for an empty bin)."""
    counts, confidence, correct = sums.double().cpu()
    filled = counts.clamp(min=1)
    return {
        "images": counts.tolist(),
        "confidence": (confidence / filled).tolist(),
        "accuracy": (correct / filled).tolist(),
    }


def balanced_accuracy(matrix: torch.Tensor) -> float:
    """The mean of the per-class recalls (rows: true classes), over the classes that have images here."""
    totals = matrix.sum(dim=1)
    present = totals > 0
    return float((matrix.diag()[present] / totals[present]).mean())


def per_class_f1(matrix: torch.Tensor) -> torch.Tensor:
    """F1 of each class, 2 TP / (2 TP + FP + FN); 0 for a class neither present nor predicted."""
    true_positives = matrix.diag()
    denominator = 2 * true_positives + (matrix.sum(dim=0) - true_positives) + (matrix.sum(dim=1) - true_positives)
    return torch.where(denominator > 0, 2 * true_positives / denominator.clamp(min=1), torch.zeros_like(denominator))


def macro_f1(matrix: torch.Tensor) -> float:
    """The mean F1 over the classes present or predicted here (sklearn's f1_score, average='macro')."""
    seen = (matrix.sum(dim=0) + matrix.sum(dim=1)) > 0
    return float(per_class_f1(matrix.double())[seen].mean())


def create_evaluator(
    model: nn.Module,
    loss_fn: nn.Module,
    prepare_batch: PrepareBatch,
    precision: Precision,
    device: torch.device,
    num_classes: int | None = None,
    tta: int = 0,
    top5: bool = False,
    confusion_matrix: bool = False,
) -> Engine:
    """An Engine computing accuracy, loss, ece, calibration_bins and num_samples over a loader, exact across
    processes (with
    ``num_classes``: balanced_accuracy and macro_f1, and the confusion matrix itself with ``confusion_matrix``;
    top-5 accuracy with ``top5``), with test-time augmentation level ``tta``."""

    @torch.no_grad()
    def eval_step(engine: Engine, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        model.eval()
        inputs, targets = prepare_batch(batch, engine.state.iteration)
        with precision.autocast():
            outputs = tta_logits(model, inputs, tta)
        return outputs.float(), targets

    evaluator = Engine(eval_step)
    evaluator.logger = logging.getLogger("cifar10_dist.evaluator")
    evaluator.logger.setLevel(logging.CRITICAL)
    metric_device = torch.device("cpu") if device.type == "xla" else device  # Ignite keeps XLA metrics on CPU
    Accuracy(device=metric_device).attach(evaluator, "accuracy")
    Loss(loss_fn, device=metric_device).attach(evaluator, "loss")
    NumSamples(device=metric_device).attach(evaluator, "num_samples")
    calibration = CalibrationBins(device=metric_device)
    calibration.attach(evaluator, "calibration_bins")  # (not a scalar: Validation.measure takes it out)
    MetricsLambda(expected_calibration_error, calibration).attach(evaluator, "ece")
    if num_classes is not None:
        matrix = ConfusionMatrix(num_classes, device=metric_device)
        if confusion_matrix:
            matrix.attach(evaluator, "confusion_matrix")
        MetricsLambda(balanced_accuracy, matrix).attach(evaluator, "balanced_accuracy")
        MetricsLambda(macro_f1, matrix).attach(evaluator, "macro_f1")
    if top5:
        TopKCategoricalAccuracy(k=5, device=metric_device).attach(evaluator, "top5_accuracy")
    return evaluator


class MistakeCollector:
    """The most confident mistakes of an evaluator's latest run, from every process: each keeps its own ``count``
    on the device as the batches pass (no host sync per batch); ``gathered`` (every rank calls it) merges them.
    An image's index in the evaluated set follows the ShardSampler: rank r's k-th image is r + k x world size."""

    def __init__(self, evaluator: Engine, batch_size: int, count: int = SHOWN) -> None:
        self.evaluator, self.batch_size, self.count = evaluator, batch_size, count  # (its calibration bins too)
        self.kept: list[torch.Tensor] = []  # confidence (-1: right), index, predicted, true: the best ``count``
        evaluator.add_event_handler(Events.EPOCH_STARTED, lambda _: self.kept.clear())
        evaluator.add_event_handler(Events.ITERATION_COMPLETED, self.update)

    def update(self, engine: Engine) -> None:
        logits, targets = engine.state.output  # type: ignore[misc]  # (Ignite types it as an int)
        confidence, predicted = logits.softmax(dim=1).max(dim=1)
        first = (engine.state.iteration - 1) * self.batch_size
        index = idist.get_rank() + idist.get_world_size() * torch.arange(
            first, first + len(targets), device=targets.device
        )
        found = [torch.where(predicted != targets, confidence.float(), -1.0), index, predicted, targets]
        if self.kept:
            found = [torch.cat([kept, new]) for kept, new in zip(self.kept, found)]
        top = found[0].topk(min(self.count, len(found[0]))).indices
        self.kept = [values[top] for values in found]

    def gathered(self, classes: list[str]) -> list[Mistake]:
        """The ``count`` most confident mistakes over all processes, most confident first (a collective)."""
        rows = (
            torch.stack([values.float() for values in self.kept], dim=1)
            if self.kept  # indices exact to 2^24
            else torch.zeros(0, 4, device=idist.device())
        )
        padding = torch.full((self.count - len(rows), 4), -1.0, device=rows.device)
        everyone: Any = idist.all_gather(torch.cat([rows, padding]))
        everyone = everyone.cpu()
        wrong = everyone[everyone[:, 0] >= 0]
        wrong = wrong[wrong[:, 0].argsort(descending=True, stable=True)][: self.count]
        return [
            Mistake(int(index), classes[int(true)], classes[int(predicted)], round(float(confidence), 4))
            for confidence, index, predicted, true in wrong.tolist()
        ]


def attach_validation(trainer: Engine, every_epochs: int, validate: Callable[[Engine], Any]) -> None:
    """Call ``validate(trainer)`` every N epochs and once at the end, never twice for the same epoch."""
    last_validated = {"epoch": -1}

    def maybe_validate(engine: Engine) -> None:
        if last_validated["epoch"] == engine.state.epoch:
            return
        last_validated["epoch"] = engine.state.epoch
        validate(engine)

    trainer.add_event_handler(Events.EPOCH_COMPLETED(every=every_epochs) | Events.COMPLETED, maybe_validate)


def early_stopping(
    patience: int | None, min_delta: float, metric: str, trainer: Engine, selection: Engine
) -> EarlyStopping | None:
    """Ignite's EarlyStopping on the val ``metric`` after each validation (every rank sees the same all-reduced
    value, so all agree); its counter is checkpointed, so a resumed early-stopped run does not train on."""
    if patience is None:
        return None
    stopper = EarlyStopping(patience, lambda engine: engine.state.metrics[metric], trainer, threshold=min_delta)
    stopper.logger.setLevel(logging.WARNING)  # the run logs the stop itself

    def log_stop(engine: Engine) -> None:
        at_the_end = engine.state.iteration >= (engine.state.max_epochs or 0) * (engine.state.epoch_length or 0)
        if stopper.counter >= stopper.patience and not at_the_end:
            logger.info(
                "early stopping at epoch %d: val %s did not rise above %.4f + %g for %d validations",
                engine.state.epoch,
                metric,
                stopper.best_score,
                stopper.threshold,
                stopper.patience,
            )

    selection.add_event_handler(Events.COMPLETED, stopper)
    trainer.add_event_handler(Events.TERMINATE, log_stop)  # EarlyStopping or a tuning pruner (stops raise)
    return stopper

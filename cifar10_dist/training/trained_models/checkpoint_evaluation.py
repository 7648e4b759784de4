"""Evaluating a saved model in every process of a launch: ``EvaluationWorker`` (``runs.evaluate`` launches
it)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from torch import nn

from cifar10_dist.config import Config
from cifar10_dist.data import batches, cifar, run_data
from cifar10_dist.data.datasets import DatasetInfo, LoadedData
from cifar10_dist.errors import UserError
from cifar10_dist.models import restoring
from cifar10_dist.outputs import checkpoint_files, evaluation_files, log_lines, provenance
from cifar10_dist.results import EvaluationResult
from cifar10_dist.system import ranks, stopping
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop.evaluators import MistakeCollector, create_evaluator, per_class_f1, reliability
from cifar10_dist.training.setup import model_setup, plan
from cifar10_dist.training.trained_models import temperature

logger = logging.getLogger("cifar10_dist")


class EvaluationWorker:
    """Per-process evaluation of one checkpoint on the test set (a picklable callable for spawning), in one pass:
    the metrics, the confusion matrix and the most confident mistakes (``MistakeCollector``, as a run's final
    test evaluation gathers them); with ``output_dir``, rank 0 writes them there (``outputs.evaluation_files``)."""

    def __init__(self, checkpoint: str, raw_weights: bool = False, output_dir: str | None = None) -> None:
        self.checkpoint, self.raw_weights, self.output_dir = checkpoint, raw_weights, output_dir

    def __call__(self, config: Config) -> dict[str, Any]:
        with log_lines.package_logging(), stopping.StopRequest() as stop:
            device = idist.device()
            loaded = run_data.load_datasets(config)
            the_plan = plan.settle(config, device, plan.DataFacts.of_evaluation(loaded))
            config, precision = the_plan.config, the_plan.precision
            batch_loaders = run_data.evaluation_loaders(config, device, loaded)
            model, info = self.load_model(config, loaded, device, precision)
            evaluator = create_evaluator(
                model,
                nn.CrossEntropyLoss(),
                batches.eval_batch_preparer(device, config.channels_last, info),
                precision,
                device,
                num_classes=len(info.classes),
                tta=config.tta,
                top5=len(info.classes) > 5,
                confusion_matrix=True,
            )
            stopping.attach_stop_without_checkpoint(evaluator, stop, "evaluate")
            collector = MistakeCollector(evaluator, batch_loaders.test.batch_size)
            with contextlib.closing(batch_loaders):  # its workers end here, not in a garbage collection
                metrics = evaluator.run(batch_loaders.test).metrics
            matrix = metrics["confusion_matrix"].long()
            result = EvaluationResult(
                accuracy=metrics["accuracy"],
                loss=metrics["loss"],
                num_samples=metrics["num_samples"],
                top5_accuracy=metrics.get("top5_accuracy"),
                balanced_accuracy=metrics["balanced_accuracy"],
                macro_f1=metrics["macro_f1"],
                per_class_accuracy=(matrix.diag() / matrix.sum(dim=1).clamp(min=1)).tolist(),
                per_class_precision=(matrix.diag() / matrix.sum(dim=0).clamp(min=1)).tolist(),
                per_class_f1=per_class_f1(matrix.double()).tolist(),
                confusion_matrix=matrix.tolist(),
                classes=list(info.classes),
                mistakes=collector.gathered(list(info.classes)),
                ece=metrics["ece"],
                reliability=reliability(metrics["calibration_bins"]),
            )
            if self.output_dir is not None:
                ranks.on_rank_zero(
                    evaluation_files.write, Path(self.output_dir), Path(self.checkpoint), result, loaded.test.images
                )
            return result.to_dict()  # travels to the launcher as JSON, read back by EvaluationResult.from_dict

    def load_model(
        self, config: Config, loaded: LoadedData, device: torch.device, precision: Precision
    ) -> tuple[nn.Module, DatasetInfo]:
        """The checkpoint's weights in a fresh model, wrapped for the backend, and what it was trained with
        (classes, normalisation); warns (rank 0) when the checkpoint was made with another package version or
        other data, and refuses data with other classes."""
        checkpoint = checkpoint_files.load_checkpoint(self.checkpoint)
        info = cifar.checkpoint_info(checkpoint)
        if info.classes != loaded.info.classes:
            raise UserError(
                f"checkpoint '{self.checkpoint}' was trained on the classes {', '.join(info.classes[:6])}"
                f"{'...' if len(info.classes) > 6 else ''}, this data has "
                f"{', '.join(loaded.info.classes[:6])}{'...' if len(loaded.info.classes) > 6 else ''}: "
                "evaluate it on data with its classes"
            )
        model = restoring.restore_model(
            checkpoint, self.checkpoint, len(info.classes), config.model, config.model_kwargs, self.raw_weights
        )
        present = run_data.describe_run(config.dataset, loaded, device, precision)
        for difference in provenance.differences(provenance.of_checkpoint(checkpoint), present):
            ranks.on_rank_zero(
                logger.warning, "checkpoint %s: %s; the numbers may not be comparable", self.checkpoint, difference
            )
        layout = batches.memory_format(config.channels_last)
        model = model_setup.wrapped_for_backend(model.to(memory_format=layout), config)
        return temperature.with_temperature(model, checkpoint), info  # calibrate=temperature: its probabilities

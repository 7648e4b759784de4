"""What trains and evaluates, built from the settled config (``run.build_training`` calls both): the optimisation
(the optimizer, its LR schedule, the loss, a teacher, batch selection and the step that uses them) and the engines
(the trainer with its schedule, recipe, freezing, sampler and lookahead handlers; the evaluators for training
accuracy, selection, test and calibration; EMA, early stopping, mistakes and a tuning trial's reports)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from torch import nn

from cifar10_dist import models, recipes
from cifar10_dist.config import Config, milestone_epochs
from cifar10_dist.data import batches, loaders, run_data
from cifar10_dist.recipes.lookahead import Lookahead
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop import selection, trials, warm_up
from cifar10_dist.training.loop.averaging import WeightAverage
from cifar10_dist.training.loop.evaluators import MistakeCollector, create_evaluator, early_stopping
from cifar10_dist.training.loop.freezing import BackboneFreeze
from cifar10_dist.training.loop.step import Accumulation, TrainStep, create_trainer
from cifar10_dist.training.loop.validation import EngineSet
from cifar10_dist.training.setup import loss, model_setup, optimizers, schedules
from cifar10_dist.training.trained_models import distillation, temperature

TOP5_FROM = 5  # top-5 accuracy is reported when there are more classes than this


@dataclass
class Optimization:
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any  # PiecewiseLinear or ParamGroupScheduler
    step: TrainStep  # forward, backward, accumulation, clipping and the optimizer step (its GradScaler under fp16)


def setup_optimization(
    config: Config,
    network: model_setup.Network,
    data_setup: run_data.DataSetup,
    device: torch.device,
    precision: Precision,
) -> Optimization:
    """The optimizer (``idist.auto_optim``), its LR schedule, and the step with the loss, a teacher and selection."""
    optimizer, group_schedules = optimizers.build_optimizer(network.model, config, data_setup.total_iterations)
    optimizer = idist.auto_optim(optimizer)
    per_epoch = data_setup.iterations_per_epoch
    warmup = round(config.num_warmup_epochs * per_epoch)
    drops = tuple(round(epoch * per_epoch) - warmup for epoch in milestone_epochs(config.lr_milestones))
    lr_scheduler = schedules.create_lr_scheduler(
        optimizer,
        float(config.learning_rate),
        warmup_iterations=warmup,
        total_iterations=data_setup.total_iterations,
        start=config.lr_start,
        end=config.lr_end,
        group_schedules=group_schedules,
        shape=schedules.Shape(config.lr_schedule, drops, config.lr_gamma),
    )
    loss_fn = loss.training_loss(
        config, data_setup.class_counts or [], data_setup.info.classes, device, data_setup.provenance
    )
    teacher = distillation.setup_teacher(config, data_setup.info, device, precision, data_setup.provenance)
    chooser = selection.from_config(
        config.select_hardest_fraction,
        config.select_hardest_until,
        network.forward,
        precision,
        data_setup.total_iterations,
        loaders.batch_size_of(data_setup.loaders.train),
    )
    step = TrainStep(
        network.forward,
        optimizer,
        distillation.distilled(loss_fn, config) if teacher else loss_fn,
        precision,
        Accumulation(config.accumulation_steps, network.model),
        config.clip_grad_norm,
        teacher,
        chooser,
    )
    return Optimization(optimizer, lr_scheduler, step)


def setup_engines(
    config: Config,
    device: torch.device,
    network: model_setup.Network,
    optimization: Optimization,
    data_setup: run_data.DataSetup,
) -> EngineSet:
    """The trainer and the evaluators, with what hangs on them (warm-up, calibration, EMA, early stopping, the
    mistakes collected, a trial's reports)."""
    prepare = batches.train_batch_preparer(
        device,
        batches.TrainAugmentation.of(config),
        data_setup.iterations_per_epoch,
        data_setup.info,
        data_setup.cropped_in_loader,
        bool(config.augment_per_pass),
    )
    trainer = create_trainer(optimization.step, prepare)
    lookahead = attach_trainer_handlers(trainer, config, network, optimization, data_setup)
    evaluators = Evaluators(config, device, network, optimization, data_setup)
    choosing = evaluators.new(config.tta)
    scaled = temperature.scaled_test_model(config.calibrate, data_setup.split, network.forward)  # T set at the end
    test = (
        evaluators.new(config.tta, scaled if scaled is not None else network.forward)
        if data_setup.split == "val"
        else choosing
    )
    engine_set = EngineSet(trainer, evaluators.new(0), choosing, test, lookahead)
    engine_set.warm_up = warm_up.WarmUp(
        optimization.step, prepare, data_setup.loaders.train, int(config.warm_up_steps), device, network.compression
    )
    engine_set.calibration = (evaluators.new(config.tta), scaled) if scaled is not None else None
    attach_selection_handlers(engine_set, config, network, evaluators, data_setup)
    return engine_set


def attach_trainer_handlers(
    trainer: Engine,
    config: Config,
    network: model_setup.Network,
    optimization: Optimization,
    data_setup: run_data.DataSetup,
) -> Lookahead | None:
    """The LR schedule, the recipe's own handlers, a fine-tuning backbone's freeze, the sampler positioned each
    epoch and lookahead (returned: checkpoints hold it)."""
    trainer.add_event_handler(Events.ITERATION_STARTED, optimization.lr_scheduler)
    recipes.parts_of(network.model).attach(trainer, optimization.optimizer, config, data_setup.total_iterations)
    if config.freeze_epochs:
        BackboneFreeze(network.model, optimization.step, config.freeze_epochs * data_setup.iterations_per_epoch).attach(
            trainer
        )
    batches.position_sampler_each_pass(trainer, data_setup.loaders.train, config.epoch_length is None)
    lookahead = (
        Lookahead(models.unwrap(network.model), data_setup.total_iterations) if config.periodic_averaging else None
    )
    if lookahead is not None:
        lookahead.attach(trainer)
    return lookahead


class Evaluators:
    """Makes the run's evaluators alike: the same batch preparation, loss, precision and metrics, on a model and a
    number of test-time views of its own."""

    def __init__(
        self,
        config: Config,
        device: torch.device,
        network: model_setup.Network,
        optimization: Optimization,
        data_setup: run_data.DataSetup,
    ) -> None:
        self.config, self.device, self.forward = config, device, network.forward
        self.precision, self.info = optimization.step.precision, data_setup.info

    def new(self, tta: int, model: nn.Module | None = None) -> Engine:
        prepare = batches.eval_batch_preparer(self.device, self.config.channels_last, self.info)
        return create_evaluator(
            self.forward if model is None else model,
            nn.CrossEntropyLoss().to(self.device),
            prepare,
            self.precision,
            self.device,
            num_classes=len(self.info.classes),
            tta=tta,
            top5=len(self.info.classes) > TOP5_FROM,
        )


def attach_selection_handlers(
    engine_set: EngineSet,
    config: Config,
    network: model_setup.Network,
    evaluators: Evaluators,
    data_setup: run_data.DataSetup,
) -> None:
    """EMA and its evaluator, early stopping, the final test's mistakes and a tuning trial's reports."""
    trainer = engine_set.trainer
    if config.ema_decay is not None:
        warmup = round(config.num_warmup_epochs * data_setup.iterations_per_epoch) // config.accumulation_steps
        engine_set.ema = WeightAverage(network.model, trainer, config.ema_decay, warmup, config.accumulation_steps)
        engine_set.ema_evaluator = evaluators.new(config.tta, engine_set.ema.model)
    engine_set.early_stopping = early_stopping(
        config.early_stopping_patience,
        config.early_stopping_min_delta,
        config.best_metric,
        trainer,
        engine_set.choosing_evaluator,
    )
    final_test = engine_set.test_evaluator if data_setup.split == "val" else engine_set.choosing_evaluator
    engine_set.mistakes = MistakeCollector(final_test, data_setup.loaders.test.batch_size)
    if config.trial is not None:
        engine_set.trial_reporter = trials.TrialReporter(config.trial, trainer, config.best_metric)
        engine_set.choosing_evaluator.add_event_handler(Events.COMPLETED, engine_set.trial_reporter)

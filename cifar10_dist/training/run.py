"""What runs inside each training process: ``training`` (one of world_size processes), above the four rooms it
uses (``setup``, ``loop``, ``before_training``, ``trained_models``), which import only downward.

Read ``training`` top-down: each line builds one thing (the process, precision, data, model, optimisation,
engines, run folder, checkpoints, trackers) with a ``setup_*`` function that returns a typed object, then it
runs and reports. ``runs`` launches it in every process; evaluating a checkpoint is ``checkpoint_evaluation``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ignite.distributed as idist
import torch
from ignite.engine import Engine
from torch import nn

from cifar10_dist import checkpoint_layout, models
from cifar10_dist.config import Config
from cifar10_dist.data import run_data
from cifar10_dist.models import restoring
from cifar10_dist.outputs import (
    checkpoint_files,
    log_lines,
    memory_use,
    progress,
    provenance,
    run_folder,
    scalars,
    trackers,
)
from cifar10_dist.outputs.run_log import RunLog
from cifar10_dist.results import RunResult, TrialResult
from cifar10_dist.system import ranks, stopping
from cifar10_dist.system.precision import Precision
from cifar10_dist.training import engines
from cifar10_dist.training.before_training import lr_finding, profiling
from cifar10_dist.training.loop import checkpointing, run_end, world_size_changes
from cifar10_dist.training.loop.evaluators import attach_validation
from cifar10_dist.training.loop.validation import EngineSet, Validation
from cifar10_dist.training.setup import compression, model_setup, plan, process_setup
from cifar10_dist.training.setup.resumption import Resumption
from cifar10_dist.training.trained_models import temperature

logger = logging.getLogger("cifar10_dist")

# ---------------------------------------------------------------- the training process


def training(config: Config) -> dict[str, Any]:
    """Train in this process (one of world_size); returns the final metrics and the run folder (a RunResult)."""
    started = time.perf_counter()
    second_interrupt = process_setup.second_interrupt_ends_at_once()
    with (
        log_lines.package_logging(),
        RunLog() as run_log,
        stopping.StopRequest(on_second_interrupt=second_interrupt) as stop,
    ):
        built = build_training(config, stop)
        result = train_in_run_folder(built, run_log, started)
        memory_use.log_peak_memory()
        return result.to_dict()


@dataclass(frozen=True)
class TrainingParts:
    """What the training process builds before it claims its run folder: the settled config (read from here on,
    never rebuilt) and every part that trains, with what the plan decided about resuming and the lr sweep."""

    config: Config
    device: torch.device
    precision: Precision
    data: run_data.DataSetup
    network: model_setup.Network
    optimization: engines.Optimization
    engines: EngineSet
    stop: stopping.StopRequest
    resumption: Resumption
    resume_from: str | None  # the plan's checkpoint, checked against the data once the run folder is claimed
    sweep: Any  # learning_rate=find's sweep (its files go to the run folder), or None


def build_training(config: Config, stop: stopping.StopRequest) -> TrainingParts:
    """The process and the images, then the plan (every choice at once), then what it decides: the data's
    loaders, the model, the learning rate a find sweeps for, the optimisation and the engines."""
    device = process_setup.setup_process(config)
    weights = model_setup.setup_pretrained(config)
    images = run_data.load_run_images(config, weights.normalisation if weights else None)
    the_plan = plan.settle(config, device, plan.DataFacts.of_run(images), resumes=True)
    data = run_data.setup_data(the_plan.config, device, the_plan.precision, images)
    note_the_start(data.provenance, the_plan, weights)
    network = model_setup.setup_model(the_plan.config, data, weights, the_plan.precision, the_plan.resumption)
    settled, sweep = lr_finding.settle_learning_rate(
        the_plan.config, network, data, device, the_plan.precision, the_plan.resumption, stop
    )
    network.compression = compression.attach(network.model, settled)  # (after the sweep, which runs uncompressed)
    data.provenance.grad_compression = compression.described(network.compression, settled)
    ranks.on_rank_zero(
        logger.info,
        "plan (what this run chose for itself; config.yaml records it):\n%s",
        dataclasses.replace(the_plan, config=settled).table(data.provenance.grad_compression),
    )
    optimization = engines.setup_optimization(settled, network, data, device, the_plan.precision)
    engine_set = engines.setup_engines(settled, device, network, optimization, data)
    return TrainingParts(
        settled,
        device,
        the_plan.precision,
        data,
        network,
        optimization,
        engine_set,
        stop,
        the_plan.resumption,
        the_plan.resume_from,
        sweep,
    )


def note_the_start(record: provenance.Provenance, the_plan: plan.Plan, weights: Any) -> None:
    """What the run started from, in its provenance: the pretrained file (hashed once, on rank 0), the config
    file, the checkpoint it continues and the memory format the plan chose."""
    if weights is not None:
        record.pretrained = ranks.from_rank_zero(weights.describe)
    record.config_file, record.resumed_from = the_plan.given.config_source, the_plan.resumption.checkpoint
    record.memory_format = the_plan.memory_format


def train_in_run_folder(built: TrainingParts, run_log: RunLog, started: float) -> RunResult | TrialResult:
    """Claim the run folder, open the trackers, write the run's start, checkpoints and record, resume where asked,
    train to the end and report it; the loaders, folder, trackers and record are closed whatever happens."""
    config, data = built.config, built.data
    with contextlib.ExitStack() as scope:
        scope.enter_context(contextlib.closing(data.loaders))
        resume_from = checkpointing.checked_resume_path(built.resume_from, config, data.provenance)  # (a refusal
        # before the folder is claimed: it writes nothing, not even the lock)
        run_dir = scope.enter_context(
            run_folder.claimed_run_dir(
                config.output_path,
                config.run_name,
                config.model,
                config.backend,
                resuming=built.resumption.asked,
                overwrite=config.overwrite,
            )
        )
        checkpointing.continue_order(resume_from, data)
        opened = scope.enter_context(trackers.open_trackers(config, run_dir, data.provenance))
        run_log.write_to(run_dir)
        if built.sweep is not None:
            ranks.on_rank_zero(lr_finding.write_files, run_dir, built.sweep)
        run_folder.write_run_start(run_dir, config.replayable(), data.provenance, data.held_out_indices)
        to_save = setup_checkpoints(built, run_dir, opened.saver(run_dir))
        recorder = scope.enter_context(setup_recorder(built, run_dir, opened))
        validation = Validation(built.engines, data.split, data.loaders, recorder, config.best_metric)
        attach_validation(built.engines.trainer, config.validate_every, validation)
        resumed = checkpointing.resume_if_asked(to_save, resume_from, config)
        world_size_changes.note_world_size_change(resumed, config, data, recorder)
        logger.info("run folder: %s", run_dir)
        findings = run_end.RunFindings()
        result = run_to_the_end(built, run_dir, validation, findings)
        run_end.report_run_end(
            config,
            run_dir,
            result,
            findings,
            data=data,
            opened=opened,
            recorder=recorder,
            mistakes=built.engines.mistakes,
            seconds=time.perf_counter() - started,
        )
    return result


# ---------------------------------------------------------------- checkpoints and trackers


def setup_checkpoints(built: TrainingParts, run_dir: Path, saver: Any) -> dict[str, Any]:
    """Periodic training checkpoints (never of NaN weights), the agreed stop on signals and NaN, and the best
    models on the selection split, written by ``saver`` (a tracker's that uploads them) or as plain files; returns
    the objects a checkpoint holds (for resuming)."""
    config, data_setup, network, optimization, engine_set = (
        built.config,
        built.data,
        built.network,
        built.optimization,
        built.engines,
    )
    meta = checkpoint_layout.RunMetadata(config.replayable(), data_setup.provenance.to_dict(), idist.get_world_size())
    to_save = checkpoint_layout.training_contents(
        engine_set.trainer,
        network.model,
        optimization.optimizer,
        optimization.lr_scheduler,
        optimization.step.scaler,
        engine_set.lookahead,
        engine_set.early_stopping,
        engine_set.ema,
        network.compression,
    )
    best_model = engine_set.ema.model if engine_set.ema is not None else network.model
    checkpoint = checkpointing.create_training_checkpoint(
        checkpoint_layout.with_meta(to_save, meta), run_dir, saver, config.checkpoint_in_background
    )
    save_training_checkpoint = stopping.finite_weights_only(checkpoint, network.model)
    stopping.attach_stop_checks(
        engine_set.trainer,
        built.stop,
        checkpointing.saved_and_written(save_training_checkpoint, checkpoint),
        run_dir,
        step_every=config.accumulation_steps,
        reads_at=reading_iterations(config, data_setup),
    )
    checkpointing.attach_training_checkpoints(
        engine_set.trainer, save_training_checkpoint, config.checkpoint_every, checkpoint
    )
    best_contents = checkpoint_layout.best_model_contents(best_model, meta, engine_set.trainer)
    checkpointing.attach_best_model_checkpoints(
        engine_set.choosing_evaluator,
        engine_set.trainer,
        best_contents,
        run_dir,
        data_setup.split,
        saver,
        config.best_metric,
    )
    return to_save


def reading_iterations(config: Config, data_setup: run_data.DataSetup) -> Callable[[int], bool]:
    """The iterations at which the training loss is read from the device anyway (logs, checkpoints, epoch ends,
    the last): the NaN check reads there too, so that no other iteration waits for the device."""
    log, checkpoint, epoch = config.log_every_iters, config.checkpoint_every, data_setup.iterations_per_epoch
    last = data_setup.total_iterations

    def reads_at(iteration: int) -> bool:
        return not (iteration % log and iteration % checkpoint and iteration % epoch) or iteration == last

    return reads_at


def setup_recorder(built: TrainingParts, run_dir: Path, opened: trackers.OpenTrackers) -> scalars.Recorder:
    """TensorBoard, metrics.jsonl and the trackers that are on through one Recorder, and progress on the
    console, both reading one EpochClock."""
    config, trainer, optimizer = built.config, built.engines.trainer, built.optimization.optimizer
    recorder = scalars.Recorder(run_dir, *opened.guarded)
    clock = progress.EpochClock(built.data.images_per_iteration).attach(trainer)
    recorder.attach_training(trainer, optimizer, config.log_every_iters, clock)
    progress.attach_progress_logging(trainer, optimizer, config.log_every_iters, clock, config.num_epochs)
    return recorder


# ---------------------------------------------------------------- running and reporting


def training_finished(trainer: Engine, config: Config, data_setup: run_data.DataSetup) -> bool:
    """Whether the trainer stands at the end of training, as Ignite counts it: in its own epochs, a checkpoint's
    length kept on resume (at another world size the loader's pass may be longer or shorter)."""
    return trainer.state.iteration >= checkpointing.end_of_training(config, trainer.state.epoch_length, data_setup)


def run_to_the_end(
    built: TrainingParts, run_dir: Path, validation: Validation, findings: run_end.RunFindings
) -> RunResult | TrialResult:
    """Train what is left (or only evaluate a finished checkpoint), then the one test evaluation of a held-out run;
    the profile and the calibration go to ``findings``."""
    config, network, engine_set, data_setup = built.config, built.network, built.engines, built.data
    trainer = engine_set.trainer
    if training_finished(trainer, config, data_setup) or engine_set.stopped_early:
        logger.info(
            "the checkpoint is from the end of training%s: evaluating only",
            " (stopped early)" if engine_set.stopped_early else "",
        )
        validation(trainer)  # Ignite would restart a finished run from iteration 0
    else:
        warmed = engine_set.warm_up.run() if engine_set.warm_up is not None else None
        if warmed is not None:
            validation.recorder.write_event(
                {
                    "event": "warm_up",
                    "iteration": trainer.state.iteration,
                    "steps": engine_set.warm_up.steps if engine_set.warm_up else 0,
                    "seconds": warmed,
                }
            )
        profiler = profiling.attach(config.profile, run_dir, trainer)
        trainer.run(data_setup.loaders.train, max_epochs=config.num_epochs, epoch_length=config.epoch_length)
        if profiler is not None:
            findings.profile = profiler.report()
    stopped_early = engine_set.stopped_early and not training_finished(trainer, config, data_setup)
    if data_setup.split == "val" and validation.latest is not None and config.trial is None:  # trials: no test
        validation.latest["test"] = evaluate_best_on_test(network.model, run_dir, validation)
        findings.calibration = validation.calibration
    latest = dict(validation.latest or {})
    if latest.get(f"{data_setup.split}_ema"):  # the EMA's numbers on the split that chose it
        latest[data_setup.split] = {**latest[f"{data_setup.split}_ema"], "model": "ema"}
    values = {
        "run_dir": str(run_dir),
        "epochs": trainer.state.epoch,
        "iterations": trainer.state.iteration,
        "stopped_early": trainer.state.epoch if stopped_early else None,
        **{split: latest[split] for split in ("test", "val", "train") if latest.get(split)},
    }
    if engine_set.trial_reporter is not None:
        return TrialResult.from_dict({**values, "pruned_at": engine_set.trial_reporter.pruned_at})
    return RunResult.from_dict(values)


def evaluate_best_on_test(model: nn.Module, run_dir: Path, validation: Validation) -> dict[str, Any]:
    """The one test-set evaluation of a run with a held-out split: the model chosen on val (rank 0 reads the
    best-model file and sends the weights to the others, so no shared filesystem is needed)."""
    network = models.unwrap(model)

    def load_best() -> str:
        best = checkpoint_files.best_model_file(run_dir)
        if best is None:
            return "final"
        weights = checkpoint_layout.model_weights(checkpoint_files.load_checkpoint(best))
        restoring.load_model_weights(network, weights, str(best))
        return best.name

    name = ranks.from_rank_zero(load_best)
    if idist.get_world_size() > 1:
        for tensor in network.state_dict().values():
            tensor.copy_(idist.broadcast(tensor, src=0))
    logger.info("test set, used once: %s", "the final model (no best model saved)" if name == "final" else name)
    if validation.engine_set.calibration is not None:  # T fitted on val, the test evaluated with it
        evaluator, scaled = validation.engine_set.calibration
        validation.calibration = temperature.calibrate(evaluator, validation.loaders.val, run_dir, name)
        scaled.temperature.fill_(validation.calibration["temperature"])  # type: ignore[operator]  # (a buffer)
    epoch = validation.latest["epoch"] if validation.latest else 0
    metrics = validation.measure("test", validation.engine_set.test_evaluator, validation.loaders.test, epoch)
    calibrated = {"temperature": validation.calibration["temperature"]} if validation.calibration else {}
    return {**metrics, "model": name, **calibrated}

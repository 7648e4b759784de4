"""Finding the learning rate before training: ``lr-find`` (``LrFindWorker``) and ``learning_rate=find``
(``settle_learning_rate``). Ignite's ``FastaiLRFinder`` sweeps learning_rate on a log scale over the run's own
training step (its model and pretrained start, data, augmentation, optimizer with its param groups, precision),
in every process of a launch: each iteration's loss is the mean over all ranks, so every rank sees the same curve
and makes the same suggestion. The model's and optimizer's states are restored afterwards.

learning_rate is the peak of the run's warmup and schedule; each param group is swept at its ratio to it
(bias_lr_scale, backbone_lr_scale, whitening_bias_lr_scale, muon_lr / learning_rate), so the suggestion is a
learning_rate to give the run as it is. A backbone frozen for freeze_epochs is swept unfrozen at its
backbone_lr_scale: the sweep measures the whole network, as it trains after the thaw.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import warnings
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import FastaiLRFinder

from cifar10_dist import checkpoint_layout
from cifar10_dist.config import SUGGESTION_RULES, Config, LrSweep
from cifar10_dist.data import batches, run_data
from cifar10_dist.errors import UserError
from cifar10_dist.outputs import checkpoint_files, files, log_lines, plots
from cifar10_dist.results import LrFindResult
from cifar10_dist.system import ranks, stopping
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop.step import Accumulation, TrainStep, create_trainer
from cifar10_dist.training.setup import loss, model_setup, optimizers, plan, process_setup
from cifar10_dist.training.setup.resumption import Resumption

logger = logging.getLogger("cifar10_dist")

NOMINAL_LR = 1.0  # the learning_rate the optimizer is built with for the sweep (its groups keep their ratios)
LOG_EVERY = 10  # iterations between progress lines
EDGE = 2.0  # a steepest fall this close below the lowest loss is at the edge of divergence (warned about)


def sweep(
    trainer: Engine,
    to_restore: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    loader: Any,
    ratios: list[float],
    settings: LrSweep,
) -> tuple[list[float], list[float], str]:
    """Run ``trainer`` on ``loader`` under FastaiLRFinder (each param group from start_lr to end_lr times its
    ratio); ``to_restore`` (model, optimizer) is as before afterwards. Returns the learning_rate each iteration
    trained with (group 0's over its ratio), the smoothed loss after it, and why the sweep stopped: diverged,
    not finite, or num_iter."""
    finder = FastaiLRFinder()
    starts = [settings.start_lr * ratio for ratio in ratios]
    ends = [settings.end_lr * ratio for ratio in ratios]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Run completed without loss diverging")
        with finder.attach(
            trainer,
            to_restore,
            output_transform=lambda output: output.loss,
            num_iter=settings.num_iter,
            start_lr=starts,
            end_lr=ends,
            step_mode="exp",
            smooth_f=settings.smoothing,
            diverge_th=settings.diverge_threshold,
        ) as finding:
            finding.add_event_handler(Events.STARTED, _watch, finder, settings.num_iter)  # after the finder's
            for group, start in zip(optimizer.param_groups, starts):  # the first iteration's (the finder steps after)
                group["lr"] = start
            used: list[float] = []  # each iteration's own (the finder records the next one's)
            finding.add_event_handler(
                Events.ITERATION_STARTED, lambda _: used.append(optimizer.param_groups[0]["lr"] / ratios[0])
            )
            finding.run(loader, max_epochs=math.ceil((settings.num_iter + 1) / len(loader)))
    world_size = idist.get_world_size()  # the finder sums the ranks' losses (idist.all_reduce): their mean here
    losses = [value / world_size for value in finder.get_results()["loss"]]
    return used[: len(losses)], losses, _why_stopped(losses, settings)


def _watch(trainer: Engine, finder: FastaiLRFinder, num_iter: int) -> None:
    """Each iteration, after the finder has logged it: stop at a loss that is not finite (the finder's own
    divergence test does not catch NaN) and after num_iter iterations, log progress on rank 0."""

    def look(engine: Engine) -> None:
        losses = finder.get_results()["loss"]
        if not math.isfinite(losses[-1]) or engine.state.iteration >= num_iter:  # (the finder's own stop: 1 later)
            engine.terminate()
        if engine.state.iteration % LOG_EVERY == 0:
            ranks.on_rank_zero(
                logger.info,
                "lr-find: iteration %d/%d, smoothed loss %.4f",
                engine.state.iteration,
                num_iter,
                losses[-1] / idist.get_world_size(),
            )

    trainer.add_event_handler(Events.ITERATION_COMPLETED, look)


def _why_stopped(losses: list[float], settings: LrSweep) -> str:
    finite = [value for value in losses if math.isfinite(value)]
    if len(finite) < len(losses):
        return "not finite"
    if finite and finite[-1] > settings.diverge_threshold * min(finite):
        return "diverged"
    return "num_iter"


def suggestions(learning_rates: list[float], losses: list[float]) -> dict[str, float]:
    """What each rule suggests from the finite part of the curve: steepest (Ignite's ``lr_suggestion``, the
    steepest fall of the smoothed loss before its minimum) and minimum (a tenth of the lowest point's)."""
    kept = [index for index, value in enumerate(losses) if math.isfinite(value)]
    learning_rates, losses = [learning_rates[i] for i in kept], [losses[i] for i in kept]
    if not losses:
        return {}
    found = {"minimum": learning_rates[min(range(len(losses)), key=losses.__getitem__)] / 10}
    finder = FastaiLRFinder()
    finder._history = {"lr": learning_rates, "loss": losses}  # lr_suggestion reads the history it recorded
    try:
        found["steepest"] = float(finder.lr_suggestion())
    except RuntimeError:  # fewer than 3 points before the minimum: the loss never fell
        pass
    return found


def edge_warning(candidates: dict[str, float], rule: str) -> str | None:
    """Why the steepest rule's suggestion is risky, when it lies within EDGE of where the loss was lowest (the
    loss fell fastest just before it turned up); None otherwise."""
    lowest = candidates["minimum"] * 10
    if rule != "steepest" or lowest >= EDGE * candidates["steepest"]:
        return None
    return (
        f"the loss fell fastest at {candidates['steepest']:.3g}, within {EDGE:g}x of where it was lowest "
        f"({lowest:.3g}): the suggestion is at the edge of divergence; --rule=minimum suggests "
        f"{candidates['minimum']:.3g}"
    )


def find(
    config: Config,
    model: torch.nn.Module,
    forward: torch.nn.Module,
    data_setup: run_data.DataSetup,
    device: torch.device,
    precision: Precision,
    settings: LrSweep,
    stop: stopping.StopRequest | None = None,
) -> LrFindResult:
    """The sweep with this run's model, data, optimizer groups and precision; the model as before afterwards.
    With ``stop``, a Ctrl-C or preemption signal to any process ends the sweep in every process (one line)."""
    started = time.perf_counter()
    trainer, optimizer, ratios = _sweep_trainer(config, model, forward, data_setup, device, precision, stop)
    learning_rates, losses, stopped = sweep(
        trainer, {"model": model, "optimizer": optimizer}, optimizer, data_setup.loaders.train, ratios, settings
    )
    candidates = suggestions(learning_rates, losses)
    _refuse_without_suggestion(learning_rates, losses, stopped, candidates, settings)
    suggestion, warning = candidates[settings.rule], edge_warning(candidates, settings.rule)
    muon_lr = None if config.muon_lr is None else config.muon_lr * suggestion / _numeric(config)
    return LrFindResult(
        suggestion=suggestion,
        rule=settings.rule,
        candidates=candidates,
        learning_rates=learning_rates,
        losses=losses,
        stopped=stopped,
        start_lr=settings.start_lr,
        end_lr=settings.end_lr,
        num_iter=settings.num_iter,
        diverge_threshold=settings.diverge_threshold,
        group_ratios=ratios,
        muon_lr=muon_lr,
        warning=warning,
        seconds=time.perf_counter() - started,
    )


def _sweep_trainer(
    config: Config,
    model: torch.nn.Module,
    forward: torch.nn.Module,
    data_setup: run_data.DataSetup,
    device: torch.device,
    precision: Precision,
    stop: stopping.StopRequest | None,
) -> tuple[Engine, torch.optim.Optimizer, list[float]]:
    """The run's own step (optimizer groups, loss, precision, accumulation, clipping) at the nominal learning rate,
    in a trainer with the run's batch preparation; returns it, its optimizer and each group's lr ratio."""
    swept_config = dataclasses.replace(
        config, learning_rate=NOMINAL_LR, muon_lr=None if config.muon_lr is None else config.muon_lr / _numeric(config)
    )
    optimizer, group_schedules = optimizers.build_optimizer(model, swept_config, data_setup.total_iterations)
    ratios = [schedule.lr_scale for schedule in group_schedules]
    loss_fn = loss.training_loss(config, data_setup.class_counts or [], data_setup.info.classes, device)
    step = TrainStep(
        forward, optimizer, loss_fn, precision, Accumulation(config.accumulation_steps, model), config.clip_grad_norm
    )
    augment = batches.TrainAugmentation.of(config)
    trainer = create_trainer(
        step,
        batches.train_batch_preparer(
            device,
            augment,
            data_setup.iterations_per_epoch,
            data_setup.info,
            data_setup.cropped_in_loader,
            bool(config.augment_per_pass),
        ),
    )
    batches.position_sampler_each_pass(trainer, data_setup.loaders.train, epoch_is_one_pass=True)  # (its own epochs)
    if stop is not None:
        stopping.attach_stop_without_checkpoint(trainer, stop, "lr-find")
    return trainer, optimizer, ratios


def _refuse_without_suggestion(
    learning_rates: list[float], losses: list[float], stopped: str, candidates: dict[str, float], settings: LrSweep
) -> None:
    """A sweep whose first loss was not finite, or whose loss never fell, ends in one line saying what to do."""
    if losses and not math.isfinite(losses[0]):
        raise UserError(
            f"lr-find: the loss was {losses[0]} at the first iteration, at learning_rate "
            f"{settings.start_lr:g}, before any learning rate could matter: the model or the data gives "
            "no finite loss (check the model's output on a batch, the data's values, with_amp), and no "
            "learning rate will fix that"
        )
    if settings.rule not in candidates:
        raise UserError(
            f"lr-find: the loss did not fall between learning_rate {settings.start_lr:g} and "
            f"{learning_rates[-1] if learning_rates else settings.end_lr:.3g} ({stopped} after "
            f"{len(losses)} iterations), so rule={settings.rule} has nothing to suggest: start lower "
            "(--start_lr), sweep longer (--num_iter) or look at the model's loss"
        )


def _numeric(config: Config) -> float:
    """The configured learning_rate that muon_lr is a ratio of (``rules`` refuses find with muon_lr)."""
    return NOMINAL_LR if config.learning_rate == "find" else float(config.learning_rate)


def describe(result: LrFindResult) -> str:
    """The one line that says what was suggested and how."""
    muon = f", muon_lr {result.muon_lr:.3g} (its configured ratio)" if result.muon_lr is not None else ""
    return (
        f"suggested learning_rate {result.suggestion:.3g}{muon}: {SUGGESTION_RULES[result.rule]}; swept "
        f"{result.start_lr:g}..{result.end_lr:g} over {len(result.losses)} iterations ({result.stopped})"
    )


def write_files(folder: Path, result: LrFindResult) -> LrFindResult:
    """Rank 0: lr_find.json and lr_find.png in ``folder``; the result with its folder."""
    placed = dataclasses.replace(result, folder=str(folder))
    files.write_json(folder / "lr_find.json", placed.to_dict())
    files.write_file(
        folder / "lr_find.png",
        lambda path: plots.render_lr_sweep(placed.learning_rates, placed.losses, placed.suggestion, placed.rule, path),
    )
    return placed


def record_of(result: LrFindResult) -> dict[str, Any]:
    """What a run with learning_rate=find keeps of the sweep (config lr_found, provenance, summary.json)."""
    return {key: value for key, value in result.to_dict().items() if key not in ("learning_rates", "losses")}


def settle_learning_rate(
    config: Config,
    network: Any,
    data_setup: run_data.DataSetup,
    device: torch.device,
    precision: Precision,
    resumption: Resumption,
    stop: stopping.StopRequest | None = None,
) -> tuple[Config, LrFindResult | None]:
    """learning_rate=find: the config with the sweep's suggestion (and the sweep, for its files), or with the
    learning rate its checkpoint trained with when it resumes (config's lr_found: summary.json shows it); any other
    config as it is. ``network``: the run's (``model_setup.Network``: model and forward)."""
    if config.learning_rate != "find":
        return config, None
    result = None
    if resumption.continues:
        found = ranks.from_rank_zero(_recorded_learning_rate, resumption.checkpoint)
        ranks.on_rank_zero(
            logger.info, "learning_rate=find: %.4g, as the run being resumed found it", found["suggestion"]
        )
    else:
        result = find(config, network.model, network.forward, data_setup, device, precision, LrSweep(), stop)
        ranks.on_rank_zero(logger.info, "learning_rate=find: %s", describe(result))
        if result.warning:
            ranks.on_rank_zero(logger.warning, "learning_rate=find: %s", result.warning)
        found = record_of(result)
    return dataclasses.replace(config, learning_rate=found["suggestion"], lr_found=found), result


def _recorded_learning_rate(path: str) -> dict[str, Any]:
    recorded = checkpoint_layout.recorded_config(checkpoint_files.load_checkpoint(path, mmap=True))
    found = recorded.lr_found if recorded is not None else None
    if not isinstance(found, dict) or "suggestion" not in found:
        rate = recorded.learning_rate if recorded is not None else None
        found = {"suggestion": rate, "rule": "given", "note": "the checkpoint's own"}
    return found


class LrFindWorker:
    """``lr-find`` in every process of a launch (picklable for spawning): the sweep, and on rank 0 its files in
    ``folder``; returns the LrFindResult as a dict."""

    def __init__(self, settings: LrSweep, folder: str) -> None:
        self.settings, self.folder = settings, folder

    def __call__(self, config: Config) -> dict[str, Any]:
        with log_lines.package_logging(), stopping.StopRequest() as stop:
            device = process_setup.setup_process(config)
            weights = model_setup.setup_pretrained(config)
            images = run_data.load_run_images(config, weights.normalisation if weights else None)
            the_plan = plan.settle(config, device, plan.DataFacts.of_run(images))
            config, precision = the_plan.config, the_plan.precision
            data_setup = run_data.setup_data(config, device, precision, images)
            network = model_setup.setup_model(config, data_setup, weights, precision)
            with contextlib.closing(data_setup.loaders):
                result = find(
                    config, network.model, network.forward, data_setup, device, precision, self.settings, stop
                )
            placed = ranks.on_rank_zero(write_files, Path(self.folder), result)
            ranks.on_rank_zero(logger.info, "lr-find: %s", describe(result))
            return (placed or result).to_dict()

"""The run itself: ``train`` and ``evaluate`` (Python API), and the per-process functions they launch.

Read ``training`` top-down: it builds data, model, optimizer, engines and handlers, one call each, then runs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.utils import manual_seed
from torch import nn

from cifar10_dist import checkpointing, data, engines, faults, launch, models, provenance, reports, tracking
from cifar10_dist.config import Config, load_config, save_config
from cifar10_dist.errors import UserError

logger = logging.getLogger("cifar10_dist")

SYNTHETIC_SEED = 20240601  # the synthetic dataset is the same whatever the training seed


# ---------------------------------------------------------------- Python API


def train(config: str | Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Train with the given YAML config file and overrides; return final metrics and the run folder.

    Returns ``{"run_dir": str, "test": {"accuracy", "loss", "num_samples"}, "train": {...} or None,
    "iterations": int, "epochs": int}`` (from rank 0; other torchrun ranks get ``{}``).
    """
    resolved = load_config(config, **overrides)
    models.check_model_name(resolved.model)
    if resolved.resume_from not in (None, "auto") and not Path(resolved.resume_from).is_file():
        raise UserError(f"resume_from='{resolved.resume_from}' does not exist: give a training_checkpoint_*.pt file")
    if resolved.seeds > 1:
        return train_seeds(resolved)
    return launch.run(training, resolved)


def train_seeds(config: Config) -> dict[str, Any]:
    """Train ``config.seeds`` times (seed, seed+1, ...) one after another; summarise the final metrics.

    Returns ``{"runs": [{"seed", "run_dir", "test", ...}], "summary": {"test_accuracy": {"mean", "std", "min",
    "max"}, ...}, "summary_file": str}``; the same is written to output_path/seeds_<run_name or time>.json.
    """
    runs = []
    for seed in range(config.seed, config.seed + config.seeds):
        run_name = f"{config.run_name}-seed{seed}" if config.run_name else None
        result = launch.run(training, dataclasses.replace(config, seed=seed, seeds=1, run_name=run_name))
        runs.append({"seed": seed, **result})
    if not all(run.get("run_dir") for run in runs):
        return {}  # a non-zero rank under torchrun: rank 0 reports
    summary = reports.summarize_seeds(runs)
    name = config.run_name or datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(config.output_path) / f"seeds_{name}.json"
    tracking.write_json(path, {"config": config.to_dict(), "runs": runs, "summary": summary})
    return {"runs": runs, "summary": summary, "summary_file": str(path)}


INHERITED_BY_EVALUATE = ("model", "dataset", "data_path", "synthetic_size", "tta")


def evaluate(checkpoint: str | Path, config: str | Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Test-set accuracy, loss and num_samples of a saved model (training checkpoint or best-model file).

    The model and data keys recorded in the checkpoint are used unless given in ``overrides``.
    """
    recorded = checkpointing.checkpoint_config(checkpointing.load_checkpoint(checkpoint))
    inherited = {key: recorded[key] for key in INHERITED_BY_EVALUATE if key in recorded}
    resolved = load_config(config, **{**inherited, **overrides})
    models.check_model_name(resolved.model)
    return launch.run(_EvaluationWorker(str(checkpoint)), resolved)


# ---------------------------------------------------------------- building blocks


def load_datasets(config: Config) -> tuple[data.ImageSet, data.ImageSet]:
    """(train, test) images: synthetic, or CIFAR-10 from data_path (downloaded by one process per node)."""
    if config.dataset == "synthetic":
        return data.make_synthetic(config.synthetic_size, max(config.synthetic_size // 5, 1), SYNTHETIC_SEED)
    with idist.one_rank_first(local=True):
        folder = data.ensure_cifar10(Path(config.data_path), download=config.download)
    train_set, test_set = data.read_cifar10(folder)
    if tracking.is_main_process():  # hashing 180 MB only matters where it is logged
        official = "match" if data.matches_official_release(folder) else "differ from"
        logger.info("CIFAR-10 from %s: %d train, %d test images (files %s the official release)",
                    folder, len(train_set), len(test_set), official)
    return train_set, test_set


def describe_run(config: Config, train: data.ImageSet, test: data.ImageSet, device: torch.device) -> dict[str, Any]:
    """Provenance of this run (every process calls it; rank 0 hashes the data and logs the summary)."""
    checksum = provenance.dataset_sha256(train, test) if tracking.is_main_process() else None
    record = provenance.collect(config.dataset, checksum, device)
    logger.info("provenance: %s", provenance.describe(record))
    return record


WHITENING_IMAGES = 5000  # training images whose 2x2 patches set the whitening filters of the airbench model
FROZEN_AFTER = 0.3  # fraction of training after which the airbench whitening bias stops training


def create_model(config: Config, train_set: data.ImageSet) -> nn.Module:
    """The model, whitening-initialised from training images if it has a whitening layer, in the configured
    memory format, wrapped for the backend (DDP, ...)."""
    model = models.build_model(config.model)
    if isinstance(model, models.AirbenchNet):
        model.init_whitening(data.normalize(train_set.images[:WHITENING_IMAGES].cpu()))
    logger.info("model %s: %.2fM parameters", config.model, models.count_parameters(model) / 1e6)
    return idist.auto_model(model.to(memory_format=memory_format(config.channels_last)))


def parameter_groups(model: nn.Module, config: Config, total_iterations: int) -> list[dict[str, Any]]:
    """One group, or: normalisation biases (lr x bias_lr_scale, weight decay / bias_lr_scale), the airbench
    whitening bias (trained for the first FROZEN_AFTER of the iterations), and everything else."""
    network = models.unwrap(model)
    norm_types = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
    norm_biases = {id(m.bias) for m in network.modules() if isinstance(m, norm_types) and m.bias is not None}
    frozen_later = {id(network.whiten.bias)} if isinstance(network, models.AirbenchNet) else set()
    if config.bias_lr_scale == 1.0 and not frozen_later:
        return [{"params": list(model.parameters())}]
    lr, decay, scale = config.learning_rate, config.weight_decay, config.bias_lr_scale
    trained = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trained if id(p) not in norm_biases | frozen_later], "lr": lr, "weight_decay": decay},
        {"params": [p for p in trained if id(p) in norm_biases], "lr": lr * scale, "weight_decay": decay / scale,
         "lr_scale": scale},
        {"params": [p for p in trained if id(p) in frozen_later], "lr": lr, "weight_decay": decay,
         "train_until": round(FROZEN_AFTER * total_iterations)},
    ]
    return [group for group in groups if group["params"]]


def create_optimizer(model: nn.Module, config: Config, total_iterations: int) -> torch.optim.Optimizer:
    optimizer = torch.optim.SGD(
        parameter_groups(model, config, total_iterations),
        lr=config.learning_rate,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        nesterov=config.nesterov and config.momentum > 0,
    )
    return idist.auto_optim(optimizer)


def memory_format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def configure_device_speed(config: Config, device: torch.device) -> None:
    """TF32 and cuDNN autotuning on CUDA (no effect elsewhere); deterministic mode overrides autotuning."""
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = config.tf32
    torch.backends.cudnn.allow_tf32 = config.tf32
    torch.backends.cudnn.benchmark = config.cudnn_benchmark and not config.deterministic


def use_deterministic_algorithms() -> None:
    """Bit-reproducible runs (same seed, world size and hardware): deterministic kernels only."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    logger.info("deterministic algorithms: on (CUBLAS_WORKSPACE_CONFIG=%s)", os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


def iteration_seed(seed: int, rank: int, iteration: int) -> int:
    """A distinct, reproducible seed for each (run seed, rank, iteration): a resumed run draws the same numbers."""
    return ((seed * 1_000_003 + rank) * 1_000_000_007 + iteration) % 2**63


def train_batch_preparer(device: torch.device, config: Config, iterations_per_epoch: int) -> engines.PrepareBatch:
    """Moves a uint8 batch to the device, augments and normalises it there.

    The global RNG is reseeded each iteration, so augmentation and any dropout depend only on
    (seed, rank, iteration), not on what ran before: the basis of exact resume. With alternating flip the
    training set is pre-flipped (``data.pre_flip``) and whole batches are mirrored in every second epoch.
    """
    rank = idist.get_rank()
    layout = memory_format(config.channels_last)

    def flip_mode(iteration: int) -> str:
        if config.flip != "alternating":
            return config.flip
        return "all" if ((iteration - 1) // iterations_per_epoch) % 2 else "none"

    def prepare(batch: engines.Batch, iteration: int) -> engines.Batch:
        images, labels = batch
        images = images.to(device, non_blocking=True)
        generator = torch.manual_seed(iteration_seed(config.seed, rank, iteration))
        images = data.augment(images, generator, config.crop_padding, config.crop_pad_mode, flip_mode(iteration))
        inputs = data.normalize(images).contiguous(memory_format=layout)
        return inputs, labels.to(device, non_blocking=True)

    return prepare


def eval_batch_preparer(device: torch.device, channels_last: bool = False) -> engines.PrepareBatch:
    layout = memory_format(channels_last)

    def prepare(batch: engines.Batch, iteration: int) -> engines.Batch:
        images, labels = batch
        inputs = data.normalize(images.to(device, non_blocking=True)).contiguous(memory_format=layout)
        return inputs, labels.to(device, non_blocking=True)

    return prepare


def position_sampler_each_epoch(trainer: Engine, loader: torch.utils.data.DataLoader, exact_resume: bool) -> None:
    """A new shuffle each epoch (same on every rank); after a mid-epoch resume, skip the batches already seen.

    Skipping is exact when an epoch is one pass over the loader (epoch_length unset).
    """
    sampler = loader.sampler
    batch_size = loader.batch_size

    @trainer.on(Events.EPOCH_STARTED)
    def set_epoch(engine: Engine) -> None:
        sampler.set_epoch(engine.state.epoch - 1)
        done_in_epoch = engine.state.iteration % (engine.state.epoch_length or 1)
        if exact_resume and done_in_epoch:
            sampler.start_next_pass_at(done_in_epoch * batch_size)


def resume_path(config: Config, run_dir: Path) -> str | None:
    """The checkpoint to resume from: resume_from, or with resume_from=auto the newest valid one in run_dir."""
    if config.resume_from != "auto":
        return config.resume_from
    found = ""
    if tracking.is_main_process():
        newest = checkpointing.newest_valid_checkpoint(run_dir)
        found = str(newest) if newest else ""
        logger.info("resume_from=auto: %s", f"continuing from {newest}" if newest else "no checkpoint, starting fresh")
    if idist.get_world_size() > 1:
        found = idist.broadcast(found, src=0, safe_mode=True)
    return found or None


@dataclass
class Validation:
    """Evaluates on the train subset (if any) and the selection split (held-out val, else test); logs and
    records the metrics and keeps the latest."""

    train_evaluator: Engine
    selection_evaluator: Engine
    split: str  # "val" or "test"
    loaders: data.Loaders
    recorder: tracking.Recorder
    latest: dict[str, Any] | None = None
    iteration: int = 0

    def __call__(self, trainer: Engine) -> None:
        if not math.isfinite(trainer.state.output or 0.0):
            return  # training stopped on NaN: nothing worth measuring
        epoch, self.iteration = trainer.state.epoch, trainer.state.iteration
        results: dict[str, Any] = {"epoch": epoch, "train": None}
        if self.loaders.train_eval is not None:
            results["train"] = self.measure("train_subset", self.train_evaluator, self.loaders.train_eval, epoch)
        loader = self.loaders.val if self.split == "val" else self.loaders.test
        results[self.split] = self.measure(self.split, self.selection_evaluator, loader, epoch)
        self.latest = results

    def measure(self, split: str, evaluator: Engine, loader: Any, epoch: int) -> dict[str, float]:
        start = time.perf_counter()
        metrics = dict(evaluator.run(loader).metrics)
        seconds = time.perf_counter() - start
        tracking.log_metrics(epoch, split, metrics, seconds)
        self.recorder.write_metrics(split, metrics, epoch, self.iteration, seconds)
        return metrics


def evaluate_best_on_test(model: nn.Module, run_dir: Path, validation: Validation, evaluator: Engine) -> dict:
    """The one test-set evaluation of a run with a held-out split: the model chosen on val (rank 0 reads the
    best-model file and sends the weights to the others, so no shared filesystem is needed)."""
    best = checkpointing.best_model_file(run_dir) if tracking.is_main_process() else None
    name = best.name if best is not None else "final"
    network = models.unwrap(model)
    if best is not None:
        weights = checkpointing.model_weights(checkpointing.load_checkpoint(best))
        checkpointing.load_model_weights(network, weights, str(best))
    if idist.get_world_size() > 1:
        name = idist.broadcast(name, src=0, safe_mode=True)
        for tensor in network.state_dict().values():
            tensor.copy_(idist.broadcast(tensor, src=0))
    logger.info("test set, used once: %s", "the final model (no best model saved)" if name == "final" else name)
    epoch = validation.latest["epoch"] if validation.latest else 0
    return {**validation.measure("test", evaluator, validation.loaders.test, epoch), "model": name}


# ---------------------------------------------------------------- per-process functions


def training(config: Config) -> dict[str, Any]:
    """Train in this process (one of world_size); returns the final metrics and the run folder."""
    started = time.perf_counter()
    tracking.setup_logging()
    stop_request = faults.StopRequest()
    stop_request.install()
    device = idist.device()
    tracking.log_environment(config.to_dict(), device)
    manual_seed(config.seed)
    if config.deterministic:
        use_deterministic_algorithms()
    configure_device_speed(config, device)

    train_set, test_set = load_datasets(config)
    record = describe_run(config, train_set, test_set, device)
    held_out = data.hold_out(train_set, config.val_split, config.val_seed)
    split = "val" if held_out.val is not None else "test"
    train_images = data.pre_flip(held_out.train, config.seed) if config.flip == "alternating" else held_out.train
    loaders = data.make_loaders(
        train_images,
        test_set,
        val=held_out.val,
        batch_size=config.batch_size,
        num_workers=config.num_workers,
        train_eval_size=config.train_eval_size,
        seed=config.seed,
        device=device if config.data_on_device else None,
    )
    iterations_per_epoch = config.epoch_length or len(loaders.train)
    total_iterations = config.num_epochs * iterations_per_epoch
    model = create_model(config, held_out.train)
    forward_model = torch.compile(model) if config.compile else model  # checkpoints save the plain model
    optimizer = create_optimizer(model, config, total_iterations)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing).to(device)
    eval_loss_fn = nn.CrossEntropyLoss().to(device)
    precision = engines.choose_precision(device, config.with_amp)
    scaler = engines.make_grad_scaler(precision)
    lr_scheduler = engines.create_lr_scheduler(
        optimizer,
        config.learning_rate,
        warmup_iterations=round(config.num_warmup_epochs * iterations_per_epoch),
        total_iterations=total_iterations,
        start=config.lr_start,
        end=config.lr_end,
    )
    trainer = engines.create_trainer(
        forward_model, optimizer, loss_fn, train_batch_preparer(device, config, iterations_per_epoch), precision,
        scaler,
    )
    trainer.add_event_handler(Events.ITERATION_STARTED, lr_scheduler)
    position_sampler_each_epoch(trainer, loaders.train, exact_resume=config.epoch_length is None)
    lookahead = engines.Lookahead(models.unwrap(model), total_iterations) if config.lookahead else None
    if lookahead is not None:
        lookahead.attach(trainer)

    def new_evaluator(tta: int) -> Engine:
        prepare = eval_batch_preparer(device, config.channels_last)
        return engines.create_evaluator(forward_model, eval_loss_fn, prepare, precision, device, tta=tta)

    train_evaluator, selection_evaluator = new_evaluator(0), new_evaluator(config.tta)
    test_evaluator = new_evaluator(config.tta) if split == "val" else selection_evaluator  # with val: the one test

    run_dir = tracking.create_run_dir(config.output_path, config.run_name, config.model, config.backend)
    if tracking.is_main_process():
        save_config(config, run_dir / "config.yaml")
        tracking.write_json(run_dir / "provenance.json", record)
        if held_out.val is not None:
            tracking.write_json(run_dir / "held_out_indices.json", held_out.indices.tolist())
    meta = checkpointing.RunMetadata(config.to_dict(), record)
    to_save = {"trainer": trainer, "model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler}
    if scaler is not None:
        to_save["scaler"] = scaler
    if lookahead is not None:
        to_save["lookahead"] = lookahead
    clearml = tracking.ClearML(config.to_dict(), run_dir)
    saver = clearml.saver(run_dir) if clearml.enabled else None
    training_checkpoint = faults.finite_weights_only(
        checkpointing.create_training_checkpoint({**to_save, "meta": meta}, run_dir, saver), model
    )
    faults.attach_stop_checks(trainer, stop_request, save_checkpoint=training_checkpoint)
    checkpointing.attach_training_checkpoints(trainer, training_checkpoint, config.checkpoint_every)
    checkpointing.attach_best_model_checkpoints(
        selection_evaluator, trainer, {"model": model, "meta": meta}, run_dir, split, saver
    )
    recorder = tracking.Recorder(run_dir)
    recorder.attach_training(trainer, optimizer, config.log_every_iters, config.batch_size)
    # without a held-out split, "test" is the selection evaluator itself
    evaluators = {"train_subset": train_evaluator, split: selection_evaluator, "test": test_evaluator}
    clearml.attach(trainer, optimizer, evaluators, config.log_every_iters)
    tracking.attach_progress_logging(trainer, optimizer, config.log_every_iters, config.batch_size, config.num_epochs)
    validation = Validation(train_evaluator, selection_evaluator, split, loaders, recorder)
    engines.attach_validation(trainer, config.validate_every, validation)

    checkpoint_path = resume_path(config, run_dir)
    if checkpoint_path is not None:
        checkpointing.resume(to_save, checkpoint_path)
    logger.info("run folder: %s", run_dir)
    try:
        if trainer.state.iteration >= total_iterations:
            logger.info("the checkpoint is from the end of training: evaluating only")
            validation(trainer)  # Ignite would restart a finished run from iteration 0
        else:
            trainer.run(loaders.train, max_epochs=config.num_epochs, epoch_length=config.epoch_length)
        if split == "val" and validation.latest is not None:
            validation.latest["test"] = evaluate_best_on_test(model, run_dir, validation, test_evaluator)
    finally:
        recorder.close()
    tracking.log_peak_memory()

    result = {
        "run_dir": str(run_dir),
        "epochs": trainer.state.epoch,
        "iterations": trainer.state.iteration,
        "test": validation.latest["test"] if validation.latest else None,
        "val": validation.latest.get("val") if validation.latest else None,
        "train": validation.latest["train"] if validation.latest else None,
    }
    if tracking.is_main_process():
        tracking.write_json(run_dir / "metrics.json", result)
        summary = reports.summarize(run_dir, result, record, time.perf_counter() - started)
        summary["clearml_offline_folder"] = clearml.offline_folder()
        tracking.write_json(run_dir / "summary.json", summary)
        reports.render_curves(run_dir, run_dir / "curves.png")
    clearml.close()
    return result


class _EvaluationWorker:
    """Per-process evaluation of one checkpoint on the test set (a picklable callable for spawning)."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint

    def __call__(self, config: Config) -> dict[str, Any]:
        tracking.setup_logging()
        device = idist.device()
        train_set, test_set = load_datasets(config)
        loaders = data.make_loaders(
            train_set, test_set, batch_size=config.batch_size, num_workers=config.num_workers,
            train_eval_size=0, seed=config.seed, device=device if config.data_on_device else None,
        )
        model = models.build_model(config.model)
        checkpoint = checkpointing.load_checkpoint(self.checkpoint)
        checkpointing.load_model_weights(model, checkpointing.model_weights(checkpoint), self.checkpoint)
        present = describe_run(config, train_set, test_set, device)
        for difference in provenance.differences(checkpointing.checkpoint_provenance(checkpoint), present):
            if tracking.is_main_process():
                logger.warning("checkpoint %s: %s; the numbers may not be comparable", self.checkpoint, difference)
        model = idist.auto_model(model.to(memory_format=memory_format(config.channels_last)))
        precision = engines.choose_precision(device, config.with_amp)
        evaluator = engines.create_evaluator(
            model, nn.CrossEntropyLoss(), eval_batch_preparer(device, config.channels_last), precision, device,
            num_classes=models.NUM_CLASSES, tta=config.tta,
        )
        metrics = evaluator.run(loaders.test).metrics
        matrix = metrics["confusion_matrix"].long()
        per_class = (matrix.diag() / matrix.sum(dim=1).clamp(min=1)).tolist()
        return {"accuracy": metrics["accuracy"], "loss": metrics["loss"], "num_samples": metrics["num_samples"],
                "per_class_accuracy": per_class, "confusion_matrix": matrix.tolist()}

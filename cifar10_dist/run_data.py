"""A run's images: loaded (synthetic, or CIFAR-10/100 downloaded by one process per node), held out, put in
loaders, counted into iterations, and described in the run's provenance."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch

from cifar10_dist import data, engines, loaders, provenance, ranks
from cifar10_dist.config import Config

logger = logging.getLogger("cifar10_dist")


SYNTHETIC_SEED = 20240601  # the synthetic dataset is the same whatever the training seed


@dataclass
class DataSetup:
    """The images, their loaders and the numbers derived from them, the same on every rank."""

    train: data.ImageSet  # the training images left after holding out
    loaders: loaders.Loaders
    split: str  # where the best model is chosen: "val" (held-out images) or "test"
    held_out_indices: list[int] | None
    provenance: dict[str, Any]
    iterations_per_epoch: int
    total_iterations: int
    images_per_iteration: int  # what all processes together train on per step


def setup_data(config: Config, device: torch.device, precision: engines.Precision) -> DataSetup:
    train_set, test_set = load_datasets(config)
    record = describe_run(config, train_set, test_set, device, precision)
    held_out = loaders.hold_out(train_set, config.val_split, config.val_seed)
    train_images = loaders.pre_flip(held_out.train, config.seed) if config.flip == "alternating" else held_out.train
    batch_loaders = loaders.make_loaders(
        train_images, test_set, val=held_out.val, batch_size=config.batch_size, num_workers=config.num_workers,
        train_eval_size=config.train_eval_size, seed=config.seed, device=device if config.data_on_device else None,
    )
    iterations_per_epoch = config.epoch_length or len(batch_loaders.train)
    images_per_iteration = batch_loaders.train.batch_size * idist.get_world_size()
    if images_per_iteration != config.batch_size:
        ranks.on_rank_zero(logger.warning, "batch_size=%d does not divide by %d processes: each takes %d images, "
                           "%d per step", config.batch_size, idist.get_world_size(), batch_loaders.train.batch_size,
                           images_per_iteration)
    return DataSetup(
        train=held_out.train, loaders=batch_loaders, split="val" if held_out.val is not None else "test",
        held_out_indices=held_out.indices.tolist() if held_out.val is not None else None, provenance=record,
        iterations_per_epoch=iterations_per_epoch, total_iterations=config.num_epochs * iterations_per_epoch,
        images_per_iteration=images_per_iteration,
    )


def load_datasets(config: Config) -> tuple[data.ImageSet, data.ImageSet]:
    """(train, test) images: synthetic, or CIFAR-10/100 from data_path (downloaded by one process per node)."""
    if config.dataset == "synthetic":
        return data.make_synthetic(config.synthetic_size, max(config.synthetic_size // 5, 1), SYNTHETIC_SEED)
    with idist.one_rank_first(local=True):
        folder = data.ensure_dataset(Path(config.data_path), data.LAYOUTS[config.dataset], download=config.download)
    train_set, test_set = data.read_folder(config.dataset, folder, config.label_mode)
    ranks.on_rank_zero(log_dataset, folder, data.LAYOUTS[config.dataset], train_set, test_set)
    return train_set, test_set


def log_dataset(folder: Path, layout: data.Layout, train_set: data.ImageSet, test_set: data.ImageSet) -> None:
    official = "match" if data.matches_official_release(folder, layout) else "differ from"  # hashes the files
    logger.info("%s from %s: %d train, %d test images (files %s the official release)",
                layout.name, folder, len(train_set), len(test_set), official)


def describe_run(config: Config, train: data.ImageSet, test: data.ImageSet, device: torch.device,
                 precision: engines.Precision) -> dict[str, Any]:
    """Provenance of this run (every process calls it; rank 0 hashes the data and logs the summary)."""
    checksum = ranks.on_rank_zero(provenance.dataset_sha256, train, test)
    record = provenance.collect(config.dataset, checksum, device, precision.name)
    logger.info("provenance: %s", provenance.describe(record))
    return record

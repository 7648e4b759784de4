"""A run's images: loaded (synthetic, CIFAR-10/100 downloaded by one process per node, or an image folder decoded
into its cache by one process per node), held out, put in loaders, counted into iterations, and described in the
run's provenance."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch

from cifar10_dist import data, engines, folder_data, loaders, provenance, ranks
from cifar10_dist.config import Config

logger = logging.getLogger("cifar10_dist")


SYNTHETIC_SEED = 20240601  # the synthetic dataset is the same whatever the training seed


@dataclass
class DataSetup:
    """The images, their loaders and the numbers derived from them, the same on every rank."""

    train: data.ImageSet  # the training images left after holding out
    info: data.DatasetInfo  # classes, normalisation, image size
    loaders: loaders.Loaders
    split: str  # where the best model is chosen: "val" (held-out images) or "test"
    held_out_indices: list[int] | None
    provenance: dict[str, Any]
    iterations_per_epoch: int
    total_iterations: int
    images_per_iteration: int  # what all processes together train on per step


def setup_data(config: Config, device: torch.device, precision: engines.Precision) -> DataSetup:
    loaded = load_datasets(config)
    train_set, test_set = loaded.train, loaded.test
    record = describe_run(config, loaded, device, precision)
    if loaded.val is not None:  # a val/ folder replaces val_split
        held_out = loaders.HeldOut(train_set, loaded.val, torch.empty(0, dtype=torch.long))
    else:
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
        train=held_out.train, info=loaded.info, loaders=batch_loaders, split="val" if held_out.val is not None else "test",
        held_out_indices=held_out.indices.tolist() if held_out.val is not None and loaded.val is None else None,
        provenance=record,
        iterations_per_epoch=iterations_per_epoch, total_iterations=config.num_epochs * iterations_per_epoch,
        images_per_iteration=images_per_iteration,
    )


def load_datasets(config: Config) -> data.LoadedData:
    """The images: synthetic, CIFAR-10/100 from data_path (downloaded by one process per node), or an image
    folder (its cache built by one process per node; the others read it)."""
    info = data.cifar_info(config.dataset, config.label_mode)
    if config.dataset == "synthetic":
        return data.LoadedData(*data.make_synthetic(config.synthetic_size, max(config.synthetic_size // 5, 1),
                                               SYNTHETIC_SEED), info)
    if config.dataset == "folder":
        return load_folder(config)
    with idist.one_rank_first(local=True):
        folder = data.ensure_dataset(Path(config.data_path), data.LAYOUTS[config.dataset], download=config.download)
    train_set, test_set = data.read_folder(config.dataset, folder, config.label_mode)
    ranks.on_rank_zero(log_dataset, folder, data.LAYOUTS[config.dataset], train_set, test_set)
    return data.LoadedData(train_set, test_set, info)


def load_folder(config: Config) -> data.LoadedData:
    """An image folder through its cache (local rank 0 builds it, the others wait and read it), its warnings
    logged once."""
    with idist.one_rank_first(local=True):
        loaded = folder_data.load(Path(config.data_path), config.image_size, config.skip_bad_images,
                                  config.drop_test_duplicates, Path(config.cache_dir) if config.cache_dir else None)
    sizes = ", ".join(f"{name} {len(images)}" for name, images in (("train", loaded.train), ("val", loaded.val),
                                                                  ("test", loaded.test)) if images is not None)
    ranks.on_rank_zero(logger.info, "image folder %s: %d classes, %s images at %dx%d (cache %s, %s)",
                       config.data_path, len(loaded.info.classes), sizes, config.image_size, config.image_size,
                       loaded.cache, "built now" if loaded.built else "reused")
    for warning in loaded.warnings:
        ranks.on_rank_zero(logger.warning, "%s", warning)
    return loaded


def log_dataset(folder: Path, layout: data.Layout, train_set: data.ImageSet, test_set: data.ImageSet) -> None:
    official = "match" if data.matches_official_release(folder, layout) else "differ from"  # hashes the files
    logger.info("%s from %s: %d train, %d test images (files %s the official release)",
                layout.name, folder, len(train_set), len(test_set), official)


def describe_run(config: Config, loaded: data.LoadedData, device: torch.device, precision: engines.Precision
                 ) -> dict[str, Any]:
    """Provenance of this run (every process calls it; rank 0 hashes the data and logs the summary): with the
    dataset's classes, normalisation and image size, and a folder's check findings."""
    checksum = ranks.on_rank_zero(provenance.dataset_sha256, loaded.train, loaded.test)
    record = provenance.collect(config.dataset, checksum, device, precision.name)
    record["dataset"].update(info=loaded.info.to_dict(), **({"checks": loaded.checks} if loaded.checks else {}))
    logger.info("provenance: %s", provenance.describe(record))
    return record

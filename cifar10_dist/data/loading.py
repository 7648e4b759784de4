"""A run's images: loaded from its dataset source (``sources``: CIFAR-10/100 downloaded by one process per node,
an image folder decoded into its cache by one process per node, synthetic data, or a source of one's own), held
out, put in loaders, counted into iterations, and described in the run's provenance."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch

from cifar10_dist import sources
from cifar10_dist.config import Config, class_weights_for
from cifar10_dist.data import loaders
from cifar10_dist.data.records import DatasetInfo, ImageSet, LoadedData, MappedImages
from cifar10_dist.errors import OutputNotWritable
from cifar10_dist.models import pretrained
from cifar10_dist.outputs import files, provenance
from cifar10_dist.system import ranks
from cifar10_dist.system.precision import Precision

logger = logging.getLogger("cifar10_dist")


@dataclass
class DataSetup:
    """The images, their loaders and the numbers derived from them, the same on every rank."""

    train: ImageSet  # the training images left after holding out
    info: DatasetInfo  # classes, normalisation, image size
    loaders: loaders.Loaders
    split: str  # where the best model is chosen: "val" (held-out images) or "test"
    held_out_indices: list[int] | None
    provenance: dict[str, Any]
    iterations_per_epoch: int
    total_iterations: int
    images_per_iteration: int  # what all processes together train on per step
    pretrained: pretrained.Weights | None = None  # the weights the model starts from, resolved once
    class_weights: list[float] | None = None  # the training loss's weight per class (class_weights)


def setup_data(config: Config, device: torch.device, precision: Precision) -> DataSetup:
    loaded = load_datasets(config)
    weights = pretrained.resolve(config.model, config.pretrained) if config.pretrained is not None else None
    if weights is not None and weights.mean is not None:  # images as the weights learned them
        loaded.info = dataclasses.replace(loaded.info, mean=weights.mean, std=weights.std)
        ranks.on_rank_zero(logger.info, "normalisation: the pretrained weights' own, mean %s, std %s (not the "
                           "data's)", _rounded(weights.mean), _rounded(weights.std))
    train_set, test_set = loaded.train, loaded.test
    record = describe_run(config, loaded, device, precision)
    if weights is not None:  # the file hashed once, on rank 0
        record["pretrained"] = ranks.from_rank_zero(weights.describe)
    if loaded.val is not None:  # a val/ folder replaces val_split
        held_out = loaders.HeldOut(train_set, loaded.val, torch.empty(0, dtype=torch.long))
    else:
        held_out = loaders.hold_out(train_set, config.val_split, config.val_seed)
    train_images = loaders.pre_flip(held_out.train, config.seed) if config.flip == "alternating" else held_out.train
    batch_loaders = loaders.make_loaders(
        train_images, test_set, val=held_out.val, batch_size=config.batch_size, num_workers=config.num_workers,
        train_eval_size=config.train_eval_size, seed=config.seed, device=device if config.data_on_device else None,
        balanced=config.sampler == "balanced",
    )
    class_weights = loss_class_weights(config.class_weights, held_out.train.labels, loaded.info.classes)
    if class_weights is not None:
        record["class_weights"] = class_weights
        ranks.on_rank_zero(logger.info, "class weights in the training loss: %s",
                           ", ".join(f"{name} {weight:.3g}" for name, weight in zip(loaded.info.classes, class_weights)))
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
        images_per_iteration=images_per_iteration, pretrained=weights, class_weights=class_weights,
    )


def loss_class_weights(setting: str | None, labels: torch.Tensor, classes: list[str]) -> list[float] | None:
    """class_weights as one weight per class: ``auto`` is N / (C x n_c) for the n_c training images of class c
    (1 for every class when balanced; 0 for a class without training images), else the given list, which must
    have one weight per class."""
    if setting is None:
        return None
    explicit = class_weights_for(setting, classes)
    if explicit is not None:
        return explicit
    counts = torch.bincount(labels.cpu(), minlength=len(classes)).double()
    weights = torch.where(counts > 0, counts.sum() / (len(classes) * counts.clamp(min=1)), torch.zeros_like(counts))
    return [round(float(weight), 6) for weight in weights]


def _rounded(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{value:.4f}" for value in values) + ")"


def load_datasets(config: Config) -> LoadedData:
    """The images of the run's dataset source (``sources``): downloaded, or a folder's cache built, by one process
    per node first where that is needed."""
    loaded = sources.source_of(config.dataset).implementation().load(config)
    loaded.info = dataclasses.replace(loaded.info, crop_fraction=config.crop_fraction,
                                      stored=int(loaded.train.images.shape[-1]))  # what evaluation's view is cut from
    return loaded


def describe_run(config: Config, loaded: LoadedData, device: torch.device, precision: Precision
                 ) -> dict[str, Any]:
    """Provenance of this run (every process calls it; rank 0 hashes the data and logs the summary): with the
    dataset's classes, normalisation and image size, and a folder's check findings."""
    checksum = ranks.on_rank_zero(data_sha256, loaded)
    record = provenance.collect(config.dataset, checksum, device, precision.name)
    images = {"train": len(loaded.train), **({"val": len(loaded.val)} if loaded.val is not None else {}),
              "test": len(loaded.test)}
    record["dataset"].update(info=loaded.info.to_dict(), images=images,
                             **({"checks": loaded.checks} if loaded.checks else {}))
    logger.info("provenance: %s", provenance.describe(record))
    return record


def data_sha256(loaded: LoadedData) -> str:
    """The data's checksum (``provenance.dataset_sha256`` of the train and test images and labels). For a
    folder's images read on demand it is kept in the cache folder (``checksums/``, one file per choice of
    rows and flips), so a later run on the same images does not read the whole cache again."""
    parts = (loaded.train.images, loaded.train.labels, loaded.test.images, loaded.test.labels)
    memo = _checksum_memo(parts)
    if memo is not None and memo.is_file():
        return memo.read_text().strip()
    checksum = provenance.dataset_sha256(*parts)
    if memo is not None:
        try:
            memo.parent.mkdir(exist_ok=True)
            files.write_file(memo, checksum + "\n")
        except (OSError, OutputNotWritable):  # a read-only cache: hashed again next time
            pass
    return checksum


def _checksum_memo(parts: tuple[Any, ...]) -> Path | None:
    """Where the checksum of these parts is kept: named by the rows, flips and labels chosen from one cache
    (which never changes once built: its name is its folder's fingerprint); None for images in memory."""
    mapped = [part for part in parts if isinstance(part, MappedImages)]
    if len(mapped) != 2 or mapped[0].path != mapped[1].path:
        return None
    key = hashlib.sha256()
    for part in parts:
        if isinstance(part, MappedImages):
            key.update(part.rows.tobytes() + (b"-" if part.flipped is None else part.flipped.tobytes()))
        else:
            key.update(part.numpy().tobytes())
        key.update(b"|")
    return mapped[0].path.parent / "checksums" / f"{key.hexdigest()[:32]}.sha256"

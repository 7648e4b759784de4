"""A run's images: loaded from its dataset source (``sources``: CIFAR-10/100 downloaded by one process per node,
an image folder decoded into its cache by one process per node, synthetic data, or a source of one's own), held
out, put in loaders, counted into iterations, and described in the run's provenance."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ignite.distributed as idist
import torch

from cifar10_dist.config import Config
from cifar10_dist.data import batches, datasets, loader_workers, loaders
from cifar10_dist.data.datasets import DatasetInfo, ImageSet, LoadedData, MappedImages
from cifar10_dist.errors import OutputNotWritable
from cifar10_dist.outputs import files, provenance
from cifar10_dist.system import ranks
from cifar10_dist.system.precision import Precision

if TYPE_CHECKING:  # every registered source's module is a DataSource: mypy checks each against the protocol
    from cifar10_dist.data import cifar, folder_source, synthetic

    _SOURCE_MODULES: tuple[datasets.DataSource, ...] = (cifar, folder_source, synthetic)

logger = logging.getLogger("cifar10_dist")

Normalisation = tuple[tuple[float, ...], tuple[float, ...]]  # mean, std per channel


@dataclass
class DataSetup:
    """The images, their loaders and the numbers derived from them, the same on every rank."""

    train: ImageSet  # the training images left after holding out
    info: DatasetInfo  # classes, normalisation, image size
    loaders: loaders.Loaders
    split: str  # where the best model is chosen: "val" (held-out images) or "test"
    held_out_indices: list[int] | None
    provenance: provenance.Provenance  # what produced the run: its modules note their choices in it
    iterations_per_epoch: int
    total_iterations: int
    images_per_iteration: int  # what all processes together train on per step
    cropped_in_loader: bool = False  # the train loader's workers cut the random-resized crops (batches.TrainCrops)
    class_counts: list[int] | None = None  # training images per class (after holding out), e.g. for class weights


@dataclass
class RunImages:
    """A run's images before any choice about how they are fed: the data as loaded (its normalisation a pretrained
    start's where there is one), the training and held-out splits, and the training images as the loader reads
    them (flipped in place for flip=alternating)."""

    loaded: LoadedData
    held_out: loaders.HeldOut
    train_images: ImageSet

    @property
    def image_sets(self) -> list[ImageSet | None]:
        """Every split's images (what data_on_device would move to the device)."""
        return [self.train_images, self.loaded.test, self.held_out.val]


def load_run_images(config: Config, normalisation: Normalisation | None = None) -> RunImages:
    """The run's images on every rank; ``normalisation`` (mean, std) replaces the data's own (a pretrained start's:
    images as its weights learned them)."""
    loaded = load_datasets(config)
    if normalisation is not None:
        mean, std = normalisation
        loaded.info = dataclasses.replace(loaded.info, mean=mean, std=std)
        ranks.on_rank_zero(
            logger.info,
            "normalisation: the pretrained weights' own, mean %s, std %s (not the data's)",
            _rounded(mean),
            _rounded(std),
        )
    if loaded.val is not None:  # a val/ folder replaces val_split
        held_out = loaders.HeldOut(loaded.train, loaded.val, torch.empty(0, dtype=torch.long))
    else:
        held_out = loaders.hold_out(loaded.train, config.val_split, config.val_seed)
    train_images = loaders.pre_flip(held_out.train, config.seed) if config.flip == "alternating" else held_out.train
    return RunImages(loaded, held_out, train_images)


def setup_data(config: Config, device: torch.device, precision: Precision, images: RunImages) -> DataSetup:
    """The run's loaders, its provenance record and the numbers derived from them, the same on every rank, with
    the plan's choices (``training.setup.plan``: data_on_device, num_workers and augment_per_pass settled, never
    auto here)."""
    on_device, workers, per_pass = bool(config.data_on_device), int(config.num_workers), bool(config.augment_per_pass)
    loaded, held_out, train_images = images.loaded, images.held_out, images.train_images
    augment = dataclasses.replace(batches.TrainAugmentation.of(config), data_on_device=on_device)
    crops = batches.train_crops(augment, loaded.info) if batches.crops_in_workers(augment, device, workers) else None
    if per_pass:
        ranks.on_rank_zero(
            logger.info,
            "augment_per_pass: each pass's crops and flips cut at its start, normalised in %s",
            precision.name if precision.enabled else "fp32",
        )
    batch_loaders = loaders.make_loaders(
        train_images,
        loaded.test,
        val=held_out.val,
        batch_size=config.batch_size,
        num_workers=workers,
        train_eval_size=config.train_eval_size,
        seed=config.seed,
        device=loader_device(on_device, device),
        balanced=config.sampler == "balanced",
        train_transform=crops,
        pass_transform=batches.pass_augmentation(augment, len(train_images), loaded.info, precision.dtype)
        if per_pass
        else None,
    )
    class_counts = torch.bincount(held_out.train.labels.cpu(), minlength=len(loaded.info.classes)).tolist()
    iterations_per_epoch = config.epoch_length or len(batch_loaders.train)
    per_process = loaders.batch_size_of(batch_loaders.train)
    images_per_iteration = per_process * idist.get_world_size()
    if images_per_iteration != config.batch_size:
        ranks.on_rank_zero(
            logger.warning,
            "batch_size=%d does not divide by %d processes: each takes %d images, %d per step",
            config.batch_size,
            idist.get_world_size(),
            per_process,
            images_per_iteration,
        )
    return DataSetup(
        train=held_out.train,
        info=loaded.info,
        loaders=batch_loaders,
        split="val" if held_out.val is not None else "test",
        held_out_indices=held_out.indices.tolist() if held_out.val is not None and loaded.val is None else None,
        provenance=describe_run(config.dataset, loaded, device, precision),
        iterations_per_epoch=iterations_per_epoch,
        total_iterations=config.num_epochs * iterations_per_epoch,
        images_per_iteration=images_per_iteration,
        class_counts=class_counts,
        cropped_in_loader=crops is not None,
    )


def evaluation_loaders(config: Config, device: torch.device, loaded: LoadedData) -> loaders.Loaders:
    """The test loader of a saved model's evaluation (``evaluate``), by a run's own rules, with the plan's
    data_on_device and num_workers (``training.setup.plan.settle``)."""
    return loaders.make_loaders(
        loaded.train,
        loaded.test,
        batch_size=min(config.batch_size, len(loaded.train)),
        num_workers=int(config.num_workers),
        train_eval_size=0,
        seed=config.seed,
        device=loader_device(bool(config.data_on_device), device),
    )


AUTO_DEVICE_SHARE = 0.25  # data_on_device=auto: of the GPU's free memory the images may take (the model, its
# activations and cuDNN's workspaces need the rest; explicit True allows loader_workers.DEVICE_SHARE)


def settle_data_on_device(setting: bool | str, device: torch.device, image_sets: list[ImageSet | None]) -> bool:
    """``data_on_device``: True or False as given; auto: on a CUDA GPU when the images (every split's, uint8)
    take at most AUTO_DEVICE_SHARE of its free memory, else off; the choice is logged (rank 0)."""
    if setting != "auto":
        return bool(setting)
    if device.type != "cuda":
        return False  # on a CPU the batches are sliced in host memory either way
    needed = loaders.pixel_bytes(image_sets)
    free = loader_workers.free_bytes(device)
    chosen = agreed(free is not None and needed <= AUTO_DEVICE_SHARE * free)
    ranks.on_rank_zero(
        logger.info,
        "data_on_device=auto: %s (the images take %.2f GiB, %s GiB free on %s)",
        "on" if chosen else f"off, more than {AUTO_DEVICE_SHARE:.0%}",
        needed / 2**30,
        "?" if free is None else f"{free / 2**30:.1f}",
        device,
    )
    return chosen


def agreed(choice: bool) -> bool:
    """A choice every rank makes from what it sees (its own GPU's free memory), made the same on all: true only
    where it is true on every rank (one all-reduce; the choice itself where there is one process)."""
    if idist.get_world_size() == 1:
        return choice
    return bool(idist.all_reduce(int(choice), op="MIN"))


def loader_device(data_on_device: bool, device: torch.device) -> torch.device | None:
    """Where batches are cut: on the training device with data_on_device (the images moved there once), else in
    host memory (None)."""
    return device if data_on_device else None


def training_images(config: Config) -> int:
    """How many images the run trains on (its training split after holding out val), read from the data as it is
    on disk now: nothing is downloaded (a missing CIFAR copy is a UserError)."""
    loaded = load_datasets(dataclasses.replace(config, download=False))
    if loaded.val is not None:  # a val/ folder replaces val_split
        return len(loaded.train)
    return len(loaders.hold_out(loaded.train, config.val_split, config.val_seed).train)


def _rounded(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{value:.4f}" for value in values) + ")"


def load_datasets(config: Config) -> LoadedData:
    """The images of the run's dataset source (``sources``): downloaded, or a folder's cache built, by one process
    per node first where that is needed."""
    loaded = datasets.implementation(config.dataset).load(config)
    loaded.info = dataclasses.replace(
        loaded.info, crop_fraction=config.crop_fraction, stored=int(loaded.train.images.shape[-1])
    )  # what evaluation's view is cut from
    return loaded


def describe_run(dataset: str, loaded: LoadedData, device: torch.device, precision: Precision) -> provenance.Provenance:
    """Provenance of this run (every process calls it; rank 0 hashes the data and logs the summary): with the
    dataset's classes, normalisation and image size, and a folder's check findings."""
    checksum = ranks.on_rank_zero(data_sha256, loaded)
    record = provenance.collect(dataset, checksum, device, precision.name)
    images = {
        "train": len(loaded.train),
        **({"val": len(loaded.val)} if loaded.val is not None else {}),
        "test": len(loaded.test),
    }
    record.dataset.info, record.dataset.images = loaded.info.to_dict(), images
    record.dataset.checks = loaded.checks or None
    record.shuffle = loaders.MIXED_ORDER
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

"""From a loader's uint8 batch to the model's input, on the device: augmentation seeded per (seed, rank,
iteration) for exact resume, normalisation, memory format; and the sampler's order and position in each pass over
the data (a resumed pass skips what was seen)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from cifar10_dist.config import Config
from cifar10_dist.data import augmentation, loaders, resizing
from cifar10_dist.data.datasets import DatasetInfo
from cifar10_dist.data.device_copies import upload
from cifar10_dist.errors import UserError

logger = logging.getLogger("cifar10_dist")


@dataclass(frozen=True)
class TrainAugmentation:
    """The config keys a training batch's way to the model reads: what augments it, where it is cut, its layout
    (``of``: from a run's config). The functions below take this, not the whole config."""

    seed: int
    num_epochs: int
    epoch_length: int | None
    channels_last: bool | str
    data_on_device: bool | str  # (settled by run_data.settle_data_on_device before it is read)
    flip: str
    crop_padding: int
    crop_pad_mode: str
    random_resized_crop: float  # the smallest area fraction of a random-resized crop (0: none)
    resize_start: float
    resize_until: float
    auto_augment: str | None
    auto_augment_magnitude: int | None
    random_erasing: float
    color_jitter: float
    mixup_alpha: float
    cutmix_alpha: float

    @classmethod
    def of(cls, config: Config) -> TrainAugmentation:
        return cls(**{name: getattr(config, name) for name in cls.__dataclass_fields__})


Batch = tuple[torch.Tensor, torch.Tensor]
PrepareBatch = Callable[[Batch, int], Batch]  # (batch, iteration) -> (inputs, targets) on the device


def memory_format(channels_last: bool | str) -> torch.memory_format:
    """The layout ``channels_last`` names (an unsettled auto, where a tool builds a model before the plan's
    ``layouts`` settles it, reads as channels-last, as it always has)."""
    return torch.channels_last if channels_last else torch.contiguous_format


def iteration_seed(seed: int, rank: int, iteration: int) -> int:
    """A distinct, reproducible seed for each (run seed, rank, iteration): a resumed run draws the same numbers."""
    return ((seed * 1_000_003 + rank) * 1_000_000_007 + iteration) % 2**63


def seed_default_generators(seed: int, device: torch.device) -> torch.Generator:
    """Seed the CPU's default generator (returned) and, training on a GPU, that GPU's."""
    if device.type == "cuda":
        torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()
        ].manual_seed(seed)
    return torch.default_generator.manual_seed(seed)


def epoch_flip(flip: str, epoch: int) -> str:
    """The flip of ``epoch`` (0-based): the config's, or for alternating (a pre-flipped training set) none in even
    epochs and all in odd ones."""
    if flip != "alternating":
        return flip
    return "all" if epoch % 2 else "none"


@dataclass(frozen=True)
class TrainCrops:
    """Random-resized crops (``random_resized_crop``: the smallest area fraction ``scale``) of images stored at
    ``stored`` px, cut at each epoch's side (``sizes``), and flips: all drawn from the iteration's generator, so
    they depend on (seed, rank, iteration) alone. Called with a batch's epoch and iteration (by the DataLoader's
    workers, ``crops_in_workers``), it draws and crops; the training process then only ``draws`` (the same
    numbers, to leave its generator where the crops left it) and does no pixel work."""

    seed: int
    rank: int
    stored: int
    scale: float
    flip: str  # the config's: random, none, all or alternating
    sizes: resizing.ResizeSchedule

    def draws(self, count: int, epoch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(boxes, flips) of ``count`` images in ``epoch`` (0-based)."""
        boxes = augmentation.random_resized_boxes(count, self.stored, self.scale, generator)
        return boxes, augmentation.flip_draws(count, generator, epoch_flip(self.flip, epoch))

    def apply(self, images: torch.Tensor, epoch: int, generator: torch.Generator) -> torch.Tensor:
        """Cut on the images' device: per image on a CPU, in one batched kernel on a GPU (``batched_crops``)."""
        boxes, flips = self.draws(len(images), epoch, generator)
        cut = augmentation.batched_resized_crops if batched_crops(images.device) else augmentation.resized_crops
        return cut(images, boxes, self.sizes.size(epoch), flips)

    def __call__(self, images: torch.Tensor, epoch: int, iteration: int) -> torch.Tensor:
        """The batch of ``iteration`` (1-based) cropped and flipped, from a generator of its own (a worker's)."""
        generator = torch.Generator().manual_seed(iteration_seed(self.seed, self.rank, iteration))
        return self.apply(images, epoch, generator)


def batched_crops(device: torch.device) -> bool:
    """Whether random-resized crops are cut by one batched kernel: on CUDA, where it measured 13x (224 px) to 136x
    (28 px) faster than the per-image loop on an H200 (benchmarks/crops.py); on a CPU the per-image uint8 kernel
    stays (the batched one, float, measured 8.5x slower at 224 px and level at 28 px on a Zen 5 EPYC)."""
    return device.type == "cuda"


def train_crops(config: TrainAugmentation, info: DatasetInfo) -> TrainCrops | None:
    """The run's random-resized crops and flips, or None without ``random_resized_crop``."""
    if not config.random_resized_crop:
        return None
    sizes = resizing.schedule(config.resize_start, config.resize_until, config.num_epochs, info.image_size)
    return TrainCrops(config.seed, idist.get_rank(), info.stored_size, config.random_resized_crop, config.flip, sizes)


def crops_in_workers(config: TrainAugmentation, device: torch.device, workers: int) -> bool:
    """Whether the loader's ``workers`` cut the random-resized crops: when training on a CPU with workers (they
    run beside the training process on the other cores, which would otherwise crop while the step waits), the
    images stay in host memory (no ``data_on_device``) and an epoch is one pass (iterations counted by the loader
    match the trainer's). Elsewhere the training device crops (a GPU's kernels, the CPU's cores for the step)."""
    return (
        device.type == "cpu"
        and workers > 0
        and bool(config.random_resized_crop)
        and not config.data_on_device
        and config.epoch_length is None
    )


def say_where_crops_are_cut(crops: TrainCrops | None, in_workers: bool, device: torch.device) -> None:
    """Log who cuts the random-resized crops when it is not the training process's per-image loop."""
    if crops is not None and in_workers:
        logger.info("random-resized crops and flips: cut by the DataLoader workers (training on the CPU)")
    elif crops is not None and batched_crops(device):
        logger.info("random-resized crops and flips: one batched kernel on the GPU (torchvision.ops.roi_align)")


PASS_STREAM = 2**31 - 1  # in place of a rank in a pass's seed: no process has it, so no iteration draws the same


@dataclass(frozen=True)
class PassAugmentation:
    """``augment_per_pass``: a whole pass of training images (uint8, on the device, in the pass's order) padded,
    cut and flipped in one gather, normalised and cast to the training ``dtype`` in one go at the pass's start (as
    airbench's loader does each epoch), so that a batch is a slice. The draws are made for every image of the
    training set from (seed, epoch) alone and picked by image index: an image is cut the same way whatever its
    place in the pass, at any world size, and in a pass resumed part-way."""

    seed: int
    images: int  # in the training set (draws are made for each)
    padding: int
    pad_mode: str
    flip: str  # the config's: random, none, all or alternating
    mean: tuple[float, ...]
    std: tuple[float, ...]
    dtype: torch.dtype
    layout: torch.memory_format

    def __call__(self, images: torch.Tensor, indices: torch.Tensor, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(iteration_seed(self.seed, PASS_STREAM, epoch))
        offsets, flips = augmentation.crop_draws(self.images, generator, self.padding, epoch_flip(self.flip, epoch))
        offsets, flips = upload(offsets, images.device)[:, indices], upload(flips, images.device)[indices]
        cut = augmentation.cut(images, offsets, flips, self.padding, self.pad_mode)
        inputs = augmentation.normalize(cut, self.mean, self.std).to(self.dtype)
        return inputs.contiguous(memory_format=self.layout)


def settle_augment_per_pass(
    setting: bool | str, device: torch.device, data_on_device: bool, per_batch: list[str]
) -> bool:
    """``augment_per_pass``: True as given (refused in one line where the images are not on the device); auto: on
    a CUDA GPU with the images there and no augmentation drawn per batch (``per_batch``, config's
    ``per_batch_augmentations``), else off."""
    if setting is True and not data_on_device:
        raise UserError(
            "augment_per_pass=True cuts each pass on the training device, and the images stay in host "
            "memory (data_on_device settled to False): give --data_on_device=True, or leave "
            "augment_per_pass=auto"
        )
    if setting != "auto":
        return bool(setting)
    return device.type == "cuda" and data_on_device and not per_batch


def pass_augmentation(
    config: TrainAugmentation, images: int, info: DatasetInfo, dtype: torch.dtype | None
) -> PassAugmentation:
    """The run's ``PassAugmentation`` (``dtype``: autocast's, None for fp32); channels-last unless the config says
    otherwise (auto is settled after the data; on a GPU it is on for convolutional models)."""
    layout = memory_format(config.channels_last is not False)
    return PassAugmentation(
        config.seed,
        images,
        config.crop_padding,
        config.crop_pad_mode,
        config.flip,
        tuple(info.mean),
        tuple(info.std),
        dtype or torch.float32,
        layout,
    )


def train_batch_preparer(
    device: torch.device,
    config: TrainAugmentation,
    iterations_per_epoch: int,
    info: DatasetInfo,
    cropped_in_loader: bool = False,
    prepared_per_pass: bool = False,
) -> PrepareBatch:
    """Moves a uint8 batch to the device, augments and normalises it there.

    The default generators (CPU, and the training GPU's) are reseeded each iteration, so augmentation (the
    torchvision policies, RandomErasing and MixUp/CutMix included) and any dropout depend only on (seed, rank,
    iteration), not on what ran before: the basis of exact resume. Only those
    two: ``torch.manual_seed`` would also seed every CUDA, XPU and MTIA device, which on a machine without them
    records a stack trace for their lazy start at each call (1.3 ms per iteration, issue 29). With alternating
    flip the training set is pre-flipped (``loaders.pre_flip``) and whole batches are mirrored in every second epoch.
    With progressive resizing (``resize_start``) each epoch's images are resized to its side (``data.resizing``).
    ``cropped_in_loader``: the loader's workers cut the random-resized crops (``TrainCrops``); here they are only
    drawn, to leave the generator where they left it. ``prepared_per_pass``: batches arrive cut, normalised and in
    their layout (``PassAugmentation``); here the generators are seeded and the labels sent.
    """
    rank = idist.get_rank()
    layout = memory_format(config.channels_last)
    image_policy = augmentation.policy(config.auto_augment, config.auto_augment_magnitude)
    erasing = augmentation.random_erasing(config.random_erasing)
    mix = augmentation.mixing(config.mixup_alpha, config.cutmix_alpha, len(info.classes))
    sizes = resizing.schedule(config.resize_start, config.resize_until, config.num_epochs, info.image_size)
    if sizes.active:
        logger.info("progressive resizing: %s; evaluation at full size", sizes.describe(config.num_epochs))
    crop = batch_cropper(config, info, device, cropped_in_loader)

    def prepare(batch: Batch, iteration: int) -> Batch:
        images, labels = batch
        images = images.to(device, non_blocking=True)
        generator = seed_default_generators(iteration_seed(config.seed, rank, iteration), device)
        if prepared_per_pass:
            return images.contiguous(memory_format=layout), labels.to(device, non_blocking=True)
        epoch = (iteration - 1) // iterations_per_epoch
        side = sizes.size(epoch)
        images = crop(images, generator, epoch)
        if image_policy is not None:
            images = augmentation.per_image(image_policy, images)
        inputs = augmentation.normalize(images, info.mean, info.std)
        inputs = augmentation.brightness_contrast(inputs, config.color_jitter, generator)
        inputs = resizing.resize(inputs, side)  # progressive resizing (random-resized crops are cut at side)
        if erasing is not None:
            inputs = augmentation.per_image(erasing, inputs)
        labels = labels.to(device, non_blocking=True)
        if mix is not None:
            inputs, labels = mix(inputs, labels)  # soft labels (N, classes): the loss takes them as they are
        return inputs.contiguous(memory_format=layout), labels

    return prepare


Crop = Callable[[torch.Tensor, torch.Generator, int], torch.Tensor]  # (uint8 images, generator, epoch) -> images


def batch_cropper(config: TrainAugmentation, info: DatasetInfo, device: torch.device, cropped_in_loader: bool) -> Crop:
    """How a training batch is cut: random-resized crops and flips (cut here, or only drawn when the loader's
    workers cut them), a padded crop and flip, or the evaluation view first when the images are stored larger;
    says in the log who cuts random-resized crops."""
    crops = train_crops(config, info)
    cropped_in_workers = crops is not None and cropped_in_loader
    say_where_crops_are_cut(crops, cropped_in_workers, device)

    def crop(images: torch.Tensor, generator: torch.Generator, epoch: int) -> torch.Tensor:
        if crops is not None:
            if cropped_in_workers:
                crops.draws(len(images), epoch, generator)
                return images
            return crops.apply(images, epoch, generator)
        if images.shape[-1] != info.image_size:
            images = augmentation.eval_view(images, info.image_size, info.crop_fraction)
        return augmentation.augment(
            images, generator, config.crop_padding, config.crop_pad_mode, epoch_flip(config.flip, epoch)
        )

    return crop


def eval_batch_preparer(device: torch.device, channels_last: bool | str, info: DatasetInfo) -> PrepareBatch:
    layout = memory_format(channels_last)

    def prepare(batch: Batch, iteration: int) -> Batch:
        images, labels = batch
        view = augmentation.eval_view(images.to(device, non_blocking=True), info.image_size, info.crop_fraction)
        inputs = augmentation.normalize(view, info.mean, info.std).contiguous(memory_format=layout)
        return inputs, labels.to(device, non_blocking=True)

    return prepare


def position_sampler_each_pass(trainer: Engine, loader: torch.utils.data.DataLoader, epoch_is_one_pass: bool) -> None:
    """Each pass over the training data draws an order of its own, the same on every rank: pass p the order of
    epoch p. A run that starts at a later iteration (a resume) starts in the pass an uninterrupted run is in,
    after the batches it has seen.

    Ignite takes a new pass when the last one ends (``DATALOADER_STOP_ITERATION``), also mid-epoch where an epoch
    is not one pass; the next pass takes the next order. ``epoch_is_one_pass`` (``epoch_length`` unset): the pass
    under way is the epoch under way, counted in the checkpoint's epochs. Ignite keeps their length on resume, and
    at another world size the loader's pass may be longer or shorter.
    """
    sampler: Any = loaders.batch_sampler_of(loader).sampler  # a loaders.ResumableSampler
    batch_size = loaders.batch_size_of(loader)
    batches_per_pass = len(loaders.batch_sampler_of(loader))

    @trainer.on(Events.STARTED)
    def first_pass(engine: Engine) -> None:
        per_pass = (engine.state.epoch_length or batches_per_pass) if epoch_is_one_pass else batches_per_pass
        passes, seen = divmod(engine.state.iteration, per_pass)
        sampler.set_epoch(passes)
        sampler.start_next_pass_at(seen * batch_size)

    @trainer.on(Events.DATALOADER_STOP_ITERATION)
    def next_pass(engine: Engine) -> None:
        sampler.set_epoch(sampler.epoch + 1)

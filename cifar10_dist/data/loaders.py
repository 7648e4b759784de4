"""In-memory images served in batches: whole batches sliced from one uint8 tensor (on the training device with
``data_on_device``; training batches numbered with their iteration, so the workers can crop them as the training
process would), a seeded sampler that can resume part-way through an epoch, exact evaluation shards at any world
size, the held-out validation images and the fixed train subset."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler

from cifar10_dist.data.datasets import ImageSet, MappedImages
from cifar10_dist.data.device_copies import upload
from cifar10_dist.data.loader_workers import DEVICE_SHARE, free_bytes, worker_start_method
from cifar10_dist.errors import UserError

BatchTransform = Callable[[torch.Tensor, int, int], torch.Tensor]  # (uint8 images, epoch, iteration) -> images
PassTransform = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]  # (uint8 images, their indices, epoch)


class NumberedBatch(list):
    """A training batch's indices, with the pass over the data (0-based: the epoch, where an epoch is one pass)
    and the iteration (1-based, as the trainer counts) it is;
    with data on a device, also those indices there (``on_device``: a slice of the pass's order, sent once), the
    whole pass's order there (``pass_order``) and where in it the batch starts (``pass_offset``)."""

    epoch: int
    iteration: int
    on_device: torch.Tensor | None = None
    pass_order: torch.Tensor | None = None
    pass_offset: int = 0


class BatchTensorDataset(Dataset):
    """Serves whole batches sliced from in-memory tensors (``__getitems__``), no per-image Python work; with
    ``transform``, a numbered batch leaves transformed (in a DataLoader worker, when there are workers)."""

    def __init__(
        self, images: ImageSet, transform: BatchTransform | None = None, pass_transform: PassTransform | None = None
    ) -> None:
        self.images = images.images
        self.labels = images.labels
        self.transform = transform
        self.pass_transform = pass_transform  # augment_per_pass: a whole pass augmented at once, batches sliced
        self.prepared_pass: tuple[torch.Tensor, torch.Tensor] | None = None  # (the pass's order, its images)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = getattr(indices, "on_device", None)
        if index is None:
            index = upload(torch.as_tensor(indices), self.images.device)
        if self.pass_transform is not None and isinstance(indices, NumberedBatch):
            return self.from_pass(indices, index), self.labels[index]
        images = self.images[index]
        if self.transform is not None and isinstance(indices, NumberedBatch):
            images = self.transform(images, indices.epoch, indices.iteration)
        return images, self.labels[index]

    def from_pass(self, batch: NumberedBatch, index: torch.Tensor) -> torch.Tensor:
        """The batch's images, sliced from its pass, which is augmented once, at its first batch (a batch of no
        pass, such as the warm-up's, is augmented alone, with the same draws for the same images)."""
        order, transform = batch.pass_order, self.pass_transform
        assert transform is not None  # (batches from a pass exist only where it is cut per pass)
        if order is None:
            return transform(self.images[index], index, batch.epoch)
        if self.prepared_pass is None or self.prepared_pass[0] is not order:
            self.prepared_pass = None  # (its memory free before the next pass takes its own)
            self.prepared_pass = (order, transform(self.images[order], order, batch.epoch))
        return self.prepared_pass[1][batch.pass_offset : batch.pass_offset + len(batch)]

    def __repr__(self) -> str:
        return f"BatchTensorDataset({len(self)} images)"


def keep_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate function for BatchTensorDataset: the batch is already assembled."""
    return batch


MIXED_ORDER = "sha256(seed, epoch)"  # each (seed, epoch) its own draw: no two seeds share an epoch's order
LEGACY_ORDER = "seed+epoch"  # DistributedSampler's: seed s's epoch e had seed s+1's epoch e-1 order (before 0.1.1)


def order_seed(seed: int, epoch: int, order: str = MIXED_ORDER) -> int:
    """The seed of an epoch's order: a hash of (seed, epoch), or, for a run that began with the old order (a
    checkpoint of an older release, resumed), seed + epoch as DistributedSampler seeds it."""
    if order == LEGACY_ORDER:
        return seed + epoch
    digest = hashlib.sha256(f"cifar10_dist epoch order {seed} {epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits


class ResumableSampler(DistributedSampler):
    """A seeded DistributedSampler whose next pass can start part-way, to resume mid-pass exactly; the order of
    each pass over the data (its ``epoch``: the epoch, where an epoch is one pass) drawn from ``order_seed``
    (``order``: which way, kept by a resumed run as it began)."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0
        self.order = MIXED_ORDER

    def start_next_pass_at(self, position: int) -> None:
        """Skip the first ``position`` indices of the next pass only."""
        self.start = position

    def epoch_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(order_seed(self.seed, self.epoch, self.order))

    def __iter__(self) -> Iterator[int]:
        """DistributedSampler's pass (a permutation cut to a multiple of the world size, rank r taking every W-th
        from r) from this pass's ``order_seed``, from ``start`` on."""
        permutation = torch.randperm(len(self.dataset), generator=self.epoch_generator())  # type: ignore[arg-type]
        return self.rest_of_pass(permutation[: self.total_size][self.rank :: self.num_replicas].tolist())

    def rest_of_pass(self, indices: list[int]) -> Iterator[int]:
        """This rank's indices of the pass from ``start`` on; the next pass starts at 0."""
        rest = indices[self.start :]
        self.start = 0
        return iter(rest)


def keep_order(loader: Any, order: str) -> None:
    """Draw the training loader's epoch orders ``order``'s way (a resumed run keeps the way it began)."""
    sampler: Any = batch_sampler_of(loader).sampler
    sampler.order = order


class NumberedBatches(BatchSampler):
    """Full batches of a ResumableSampler's pass, each numbered with its epoch and iteration: the pass of epoch
    e (``set_epoch``) starting at position p (``start_next_pass_at``) holds iterations e x len + p / batch + 1 on.
    With ``device`` (the images are there), the pass's order is sent there once and each batch carries its slice
    of it: no batch makes a tensor from its list of indices, and none waits for the device."""

    def __init__(self, sampler: ResumableSampler, batch_size: int, device: torch.device | None = None) -> None:
        super().__init__(sampler, batch_size, drop_last=True)
        self.device = device

    def __iter__(self) -> Iterator[NumberedBatch]:
        sampler: Any = self.sampler  # a ResumableSampler
        epoch = sampler.epoch
        first = epoch * len(self) + sampler.start // self.batch_size + 1  # read before the pass resets start
        order = list(self.sampler)
        batches = len(order) // self.batch_size
        on_device = upload(torch.as_tensor(order), self.device) if self.device is not None else None
        for offset in range(batches):
            where = slice(offset * self.batch_size, (offset + 1) * self.batch_size)
            batch = NumberedBatch(order[where])
            batch.epoch, batch.iteration = epoch, first + offset
            if on_device is not None:
                batch.on_device, batch.pass_order, batch.pass_offset = on_device[where], on_device, where.start
            yield batch


def batch_size_of(loader: Any) -> int:
    """The images per batch of a loader (a DataLoader with batch_size or batch_sampler, or XLA's wrapper of one)."""
    return batch_sampler_of(loader).batch_size


def batch_sampler_of(loader: Any) -> BatchSampler:
    found = unwrapped(loader).batch_sampler
    assert isinstance(found, BatchSampler)
    return found


def unwrapped(loader: Any) -> DataLoader:
    """The DataLoader itself (XLA wraps it, keeping it as ``_loader``)."""
    return loader if hasattr(loader, "batch_sampler") else loader._loader


class BalancedSampler(ResumableSampler):
    """``sampler=balanced``: each pass draws as many indices as there are images, with replacement, every class
    equally likely (an image's weight is 1 / its class's count), seeded by ``order_seed`` alone; rank r takes
    every W-th of them. The draw is the same at every world size (when W divides it) and resumes mid-epoch like
    the shuffle."""

    def __init__(self, dataset: BatchTensorDataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, seed=seed)
        labels = dataset.labels.cpu()
        self.weights = (1.0 / torch.bincount(labels).double())[labels]

    def __iter__(self) -> Iterator[int]:
        drawn = torch.multinomial(self.weights, len(self.weights), replacement=True, generator=self.epoch_generator())
        return self.rest_of_pass(drawn[: self.total_size][self.rank :: self.num_replicas].tolist())


class ShardSampler(DistributedSampler):
    """Every index exactly once over all ranks (rank r gets r, r + W, ...): no padding, for exact evaluation."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        size = len(dataset)  # type: ignore[arg-type]  # (our datasets have a length)
        self.num_samples = len(range(rank, size, num_replicas))
        self.total_size = size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))


Loader = Any  # a DataLoader, or the XLA wrapper of one that Ignite's auto_dataloader returns on a TPU


@dataclass
class Loaders:
    train: Loader
    train_eval: Loader | None
    test: Loader
    val: Loader | None = None

    def close(self) -> None:
        """End the worker processes the loaders keep between passes (persistent_workers). Left to the garbage
        collector, each worker costs 5 s: it closes a loader's queues before the loader tells its workers to stop,
        and DataLoader waits out its join timeout for every one (30 s after a run with 3 loaders and 2 workers)."""
        for loader in (self.train, self.train_eval, self.test, self.val):
            workers = getattr(loader, "_iterator", None)  # where DataLoader keeps its persistent workers
            if workers is not None and hasattr(workers, "_shutdown_workers"):
                workers._shutdown_workers()  # (torch has no public call for it; it is safe to repeat)


@dataclass(frozen=True)
class HeldOut:
    """The training images left to train on, the held-out validation images, and their original indices."""

    train: ImageSet
    val: ImageSet | None
    indices: torch.Tensor  # sorted indices into the full training set; empty when nothing is held out


def hold_out(train: ImageSet, fraction: float, seed: int) -> HeldOut:
    """Hold out round(fraction * N) training images, chosen by ``seed`` alone: the same images on every rank,
    at every world size and in every run with that seed, whatever the training seed."""
    count = round(fraction * len(train))
    if count == 0:
        return HeldOut(train, None, torch.empty(0, dtype=torch.long))
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    held, kept = order[:count].sort().values, order[count:].sort().values
    return HeldOut(train.subset(kept), train.subset(held), held)


def fixed_subset(images: ImageSet, size: int, seed: int) -> ImageSet:
    """The same ``size`` images on every rank and every run with this seed."""
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:size]
    return images.subset(order)


def make_loaders(
    train: ImageSet,
    test: ImageSet,
    *,
    batch_size: int,
    num_workers: int,
    train_eval_size: int,
    seed: int,
    val: ImageSet | None = None,
    device: torch.device | None = None,
    balanced: bool = False,
    train_transform: BatchTransform | None = None,
    pass_transform: PassTransform | None = None,
) -> Loaders:
    """Train loader (shuffled per pass over the data, the same order for a given seed and pass, batches
    numbered) and exact evaluation loaders.

    ``balanced``: the training order draws every class equally often (``BalancedSampler``).
    With ``device``, every image set is moved there once and batches are sliced on it (no workers, no pinning).
    ``train_transform``: applied to each training batch where it is read (``batches.crops_in_workers``);
    ``pass_transform``: to each pass of the training images on the device at once (``augment_per_pass``).
    """
    import ignite.distributed as idist

    world_size, rank = idist.get_world_size(), idist.get_rank()
    if len(train) < batch_size:
        raise UserError(f"batch_size={batch_size} is larger than the {len(train)} training images")
    common: dict[str, Any] = dict(num_workers=num_workers, collate_fn=keep_batch, persistent_workers=num_workers > 0)
    if num_workers > 0:
        common["multiprocessing_context"] = worker_start_method()
    if device is not None:
        check_fits(pixel_bytes([train, test, val]), free_bytes(device), device)
        train, test = to_device(train, device), to_device(test, device)
        val = to_device(val, device) if val is not None else None
        common.update(num_workers=0, persistent_workers=False, pin_memory=False, multiprocessing_context=None)
    train_dataset = BatchTensorDataset(train, train_transform, pass_transform if device is not None else None)
    sampler_type = BalancedSampler if balanced else ResumableSampler
    train_sampler = sampler_type(train_dataset, num_replicas=world_size, rank=rank, seed=seed)
    per_process = batch_size // world_size if batch_size >= world_size else batch_size  # as auto_dataloader splits
    with warnings.catch_warnings():  # our batch sampler is the distributed one: Ignite's caution does not apply
        warnings.filterwarnings("ignore", message="Found batch_sampler in provided kwargs")
        train_loader = idist.auto_dataloader(
            train_dataset, batch_sampler=NumberedBatches(train_sampler, per_process, device), **common
        )
    train_eval_loader = None
    if train_eval_size > 0:
        subset = fixed_subset(train, min(train_eval_size, len(train)), seed)
        train_eval_loader = _eval_loader(subset, 2 * batch_size, common, world_size, rank)
    test_loader = _eval_loader(test, 2 * batch_size, common, world_size, rank)
    val_loader = _eval_loader(val, 2 * batch_size, common, world_size, rank) if val is not None else None
    return Loaders(train_loader, train_eval_loader, test_loader, val_loader)


def pixel_bytes(image_sets: list[ImageSet | None]) -> int:
    """What the splits' uint8 pixels take on a device (a missing split, None, takes nothing)."""
    return sum(images.images.shape.numel() for images in image_sets if images is not None)


def check_fits(needed: int, free: int | None, device: torch.device) -> None:
    """data_on_device: refused in one line when the splits' pixels would take more than DEVICE_SHARE of what is
    free there."""
    if free is not None and needed > DEVICE_SHARE * free:
        raise UserError(
            f"data_on_device=True: the images take {needed / 2**30:.1f} GiB and {device} has "
            f"{free / 2**30:.1f} GiB free ({DEVICE_SHARE:.0%} of it may hold data): leave data_on_device "
            "off (a folder's cache is read on demand) or use fewer or smaller images"
        )


def to_device(images: ImageSet, device: torch.device) -> ImageSet:
    return ImageSet(images.images.to(device), images.labels.to(device))


def pre_flip(images: ImageSet, seed: int) -> ImageSet:
    """A copy with a seeded random half of the images mirrored: the start of alternating flip, where every
    other epoch then mirrors whole batches, so each image is seen both ways in any two consecutive epochs."""
    flips = torch.rand(len(images), generator=torch.Generator().manual_seed(seed)) < 0.5
    if isinstance(images.images, MappedImages):  # mirrored as the batches are read
        return ImageSet(images.images.with_flips(flips.numpy()), images.labels)
    mirrored = torch.where(flips[:, None, None, None], images.images.flip(-1), images.images)
    return ImageSet(mirrored, images.labels)


def _eval_loader(images: ImageSet, batch_size: int, common: dict, world_size: int, rank: int) -> Loader:
    import ignite.distributed as idist

    dataset = BatchTensorDataset(images)
    sampler = ShardSampler(dataset, num_replicas=world_size, rank=rank)
    return idist.auto_dataloader(dataset, batch_size=batch_size, sampler=sampler, drop_last=False, **common)

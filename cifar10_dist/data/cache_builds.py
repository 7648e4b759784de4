"""A folder's image cache made on disk: found again, built (resumably), or copied to a node's local disk.

A build decodes every file once (``folder_scan.decode``, in parallel) into memory maps in a folder beside the
target (``.NAME.building-HOST``), saves its progress every ``PROGRESS_EVERY`` images and renames the folder when
complete: a cache is complete or absent, and a build cut short (killed, preempted, out of time) resumes at its
last saved image. The processes of one machine build or copy one at a time (a file lock); one that waited reads
what the other made. Imports no torch: the decoding processes start fast.
"""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import shutil
import socket
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from filelock import FileLock

from cifar10_dist.data.folder_scan import (
    SPLITS,
    CacheMeta,
    FolderScan,
    cache_dir,
    damage,
    decode,
    default_workers,
    fingerprint,
    read_meta,
    scan,
)
from cifar10_dist.errors import UserError

logger = logging.getLogger("cifar10_dist")

PROGRESS_EVERY = 2048  # images decoded between two saves of a build's progress
PROBE_IMAGES = 64  # decoded in the building process first, to time an image
# what a spawned decoding pool costs to start and feed (1,000 128-px JPEGs, 2-core Zen 5: 4.7 s with one, 2.0 s here)
POOL_START_SECONDS = 3.0
PROGRESS = "progress.json"


def ensure_cache(
    root: Path, image_size: int, under: Path | None = None, workers: int | None = None
) -> tuple[Path, CacheMeta, FolderScan, str]:
    """The cache for the folder at this image size: read when its fingerprint matches; with ``under`` (cache_dir,
    e.g. a node's local disk) copied from the same cache beside the data when one is there (staging: no
    decoding); built otherwise. (Its folder, meta, the scan, and "reused", "copied" or "built".)"""
    found = scan(root)
    key = fingerprint(found, image_size)
    folder = cache_dir(root, image_size, key, under)
    meta = intact_meta(folder)
    if meta is not None:
        return folder, meta, found, "reused"
    shared = cache_dir(root, image_size, key)
    copying = under is not None and shared != folder and whole_meta(shared) is not None
    try:
        if copying:
            meta, how = copy_or_reuse(shared, folder, folder_bytes(shared))
            return folder, meta, found, how
        meta, how = build_or_reuse(found, image_size, folder, key, workers)
    except (OSError, shutil.Error) as error:
        if out_of_space(error):
            needed = folder_bytes(shared) if copying else cache_bytes(found, image_size)
            raise no_room(needed, folder.parent) from error
        raise UserError(
            f"cannot write the image cache in {folder.parent} ({_reason(error)}): make it writable or "
            "give cache_dir=<a writable folder>"
        ) from error
    return folder, meta, found, how


def cache_bytes(found: FolderScan, image_size: int) -> int:
    """What a build of this folder's cache writes: its pixels (uint8, 3 x S x S per image) and, per image, a
    content hash, a readable flag, its size, label, split and path (a bound)."""
    count = sum(len(files) for files in found.files.values())
    return count * (3 * image_size * image_size + 16 + 1 + 8 + 8 + 1 + 512)


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def out_of_space(error: BaseException) -> bool:
    """Whether a write failed for want of room (a full disk, a quota), also inside shutil.copytree's list."""
    if isinstance(error, shutil.Error) and error.args and isinstance(error.args[0], list):
        return any("No space left" in str(why) or "Disk quota" in str(why) for *_, why in error.args[0])
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def no_room(needed: int, folder: Path) -> UserError:
    """The one line for a cache that does not fit where it is to be written."""
    free = shutil.disk_usage(folder).free if folder.exists() else 0
    return UserError(
        f"the image cache needs {needed / 2**20:.1f} MiB in {folder} and its disk has "
        f"{free / 2**20:.1f} MiB free: free some space there, or give cache_dir=<a folder on a disk with "
        "room>"
    )


def check_room(needed: int, folder: Path) -> None:
    """Refused before anything is written when the disk under ``folder`` has less free space than ``needed``."""
    folder.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(folder).free < needed:
        raise no_room(needed, folder)


def _reason(error: BaseException) -> str:
    if isinstance(error, shutil.Error) and error.args and isinstance(error.args[0], list) and error.args[0]:
        return str(error.args[0][0][-1])  # the first file's reason, not the whole list
    return getattr(error, "strerror", None) or str(error)


def whole_meta(folder: Path) -> CacheMeta | None:
    """A finished cache's meta when its files are whole, else None, touching nothing: the cache beside the data,
    looked at to copy it into cache_dir (a damaged one there is left alone with one warning, and cache_dir gets
    its own build: the data folder may be read-only)."""
    meta = read_meta(folder)
    damaged = damage(folder, meta) if meta is not None else None
    if damaged is not None:
        logger.warning(
            "image cache %s beside the data is damaged (%s): not copied; building one in cache_dir", folder, damaged
        )
        return None
    return meta


def intact_meta(folder: Path) -> CacheMeta | None:
    """A finished cache's meta when its files are whole (``folder_scan.damage``: the headers only); a damaged one
    is removed with one warning (it is built again from the images), or, where it cannot be, one line naming it."""
    meta = read_meta(folder)
    damaged = damage(folder, meta) if meta is not None else None
    if damaged is None:
        return meta
    try:
        with _machine_lock(folder):
            meta = read_meta(folder)  # another process of this machine may have rebuilt it meanwhile
            damaged = damage(folder, meta) if meta is not None else None
            if damaged is None:
                return meta
            logger.warning("image cache %s is damaged (%s): building it again from the images", folder, damaged)
            aside = folder.with_name(f".{folder.name}.damaged-{socket.gethostname()}")
            shutil.rmtree(aside, ignore_errors=True)
            folder.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
    except OSError as error:
        raise UserError(
            f"image cache {folder} is damaged ({damaged}) and cannot be removed here "
            f"({error.strerror or error}): remove it (it is built again from the images) or give "
            "cache_dir=<a writable folder>"
        ) from error
    return None


def _machine_lock(target: Path) -> FileLock:
    target.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(target.with_name(f".{target.name}.lock-{socket.gethostname()}")))


def build_cache(found: FolderScan, image_size: int, target: Path, key: str, workers: int | None = None) -> CacheMeta:
    """Decode every file once into target/images.npy (uint8 N x 3 x S x S, a preallocated memory map written in
    place: the decoded set is never held twice), labels, content hashes and meta.json; resumed where a build cut
    short left off; renamed into place when complete."""
    return build_or_reuse(found, image_size, target, key, workers)[0]


def build_or_reuse(
    found: FolderScan, image_size: int, target: Path, key: str, workers: int | None = None
) -> tuple[CacheMeta, str]:
    """``build_cache``, and "built", or "reused" when another process of this machine built it while this one
    waited for the lock (its card must not say it was built now)."""
    with _machine_lock(target):
        meta = read_meta(target)
        if meta is not None:  # another process of this machine built it while this one waited
            return meta, "reused"
        building = target.with_name(f".{target.name}.building-{socket.gethostname()}")
        _remove_leftovers(target, building)
        started = time.perf_counter()
        order = [(split, path, label) for split in SPLITS for path, label in found.files.get(split, [])]
        try:
            if not (building / PROGRESS).is_file():  # (a build resumed has its room already)
                check_room(cache_bytes(found, image_size), target.parent)
            meta = _decode_into(found, image_size, order, building, workers or default_workers())
        except OSError as error:
            if out_of_space(error):  # nothing half-written is left behind: the next build starts afresh
                shutil.rmtree(building, ignore_errors=True)
            raise
        meta.fingerprint = key
        meta.build_seconds = time.perf_counter() - started
        (building / PROGRESS).unlink()
        (building / "meta.json").write_text(json.dumps(asdict(meta)))
        try:
            building.rename(target)
        except OSError:  # a process of another node, sharing this folder, finished the same cache first
            if read_meta(target) is None:
                raise
            shutil.rmtree(building, ignore_errors=True)
    return meta, "built"


def _remove_leftovers(target: Path, building: Path) -> None:
    """Temporary folders of builds by an earlier version of this code (one per process id, never resumed)."""
    for old in target.parent.glob(f".{target.name}.building*"):
        if old != building and old.name[len(target.name) + 10 :].isdigit():
            shutil.rmtree(old, ignore_errors=True)


def _open_arrays(folder: Path, count: int, size: int) -> tuple[dict[str, np.ndarray], int, list[list[str]]]:
    """The build's memory maps (pixels, content hashes, readable or not, original width and height) and how far
    it had got: opened as they were when their saved progress matches this build, created empty otherwise."""
    shapes = {
        "images": ((count, 3, size, size), np.uint8),
        "hashes": ((count,), "S16"),
        "good": ((count,), bool),
        "sizes": ((count, 2), np.int32),
    }
    try:
        progress = json.loads((folder / PROGRESS).read_text())
        if progress["images"] == count and progress["size"] == size:
            arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r+") for name in shapes}
            if all(arrays[name].shape == shape for name, (shape, _) in shapes.items()):
                return arrays, int(progress["done"]), list(progress["bad"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    arrays = {name: allocated_memmap(folder / f"{name}.npy", shape, dtype) for name, (shape, dtype) in shapes.items()}
    _save_progress(folder, arrays, 0, [])
    return arrays, 0, []


def allocated_memmap(path: Path, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A new .npy memory map whose blocks are reserved on disk first (``posix_fallocate``): a disk without room
    fails here with ENOSPC, not later, when a page of the map is written, with a SIGBUS that kills the process."""
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    if hasattr(os, "posix_fallocate"):
        with open(path, "r+b") as file:
            try:
                os.posix_fallocate(file.fileno(), 0, os.fstat(file.fileno()).st_size)
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # a filesystem that cannot reserve blocks (EOPNOTSUPP, EINVAL): the map is written as before
    return array


def _save_progress(folder: Path, arrays: dict[str, np.ndarray], done: int, bad: list[list[str]]) -> None:
    """The first ``done`` images are on disk: the maps flushed, then the count written (atomically)."""
    for array in arrays.values():
        array.flush()  # type: ignore[attr-defined]  # (a numpy memmap)
    first = arrays["images"]
    partial = folder / f"{PROGRESS}.partial"
    partial.write_text(json.dumps({"images": len(first), "size": first.shape[-1], "done": done, "bad": bad}))
    os.replace(partial, folder / PROGRESS)


def decoded_in_order(tasks: list[tuple[str, int]], workers: int) -> Iterator[tuple[Any, ...]]:
    """``decode`` of each task, in order: the first PROBE_IMAGES in this process, timed; the rest in a pool of
    ``workers`` spawned processes where that saves time (a pool takes about POOL_START_SECONDS to start: a small
    folder is decoded faster here), else here too."""
    started = time.perf_counter()
    yield from map(decode, tasks[:PROBE_IMAGES])
    rest = tasks[PROBE_IMAGES:]
    per_image = (time.perf_counter() - started) / max(1, min(PROBE_IMAGES, len(tasks)))
    if workers < 2 or len(rest) * per_image * (1 - 1 / workers) < POOL_START_SECONDS:
        yield from map(decode, rest)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(decode, rest, chunksize=64)


def _decode_into(
    found: FolderScan, size: int, order: list[tuple[str, str, int]], folder: Path, workers: int
) -> CacheMeta:
    arrays, done, bad = _open_arrays(folder, len(order), size)
    if done:
        logger.info("image cache %s: resuming the build cut short at image %d of %d", folder.name, done, len(order))
    tasks = [(str(found.root / path), size) for _, path, _ in order[done:]]
    for index, (decoded, why, digest, original) in enumerate(decoded_in_order(tasks, workers), done):
        arrays["good"][index] = decoded is not None
        if decoded is None:
            bad.append([order[index][1], why])
        else:
            arrays["images"][index] = np.frombuffer(decoded, np.uint8).reshape(size, size, 3).transpose(2, 0, 1)
            arrays["hashes"][index], arrays["sizes"][index] = digest, original
        if (index + 1) % PROGRESS_EVERY == 0:
            _save_progress(folder, arrays, index + 1, bad)
    _save_progress(folder, arrays, len(order), bad)
    splits = [split for split, _, _ in order]
    np.save(folder / "labels.npy", np.array([label for _, _, label in order], dtype=np.int64))
    np.save(folder / "splits.npy", np.array([SPLITS.index(s) for s in splits], dtype=np.int8))
    (folder / "paths.txt").write_text("\n".join(path for _, path, _ in order))
    good = np.asarray(arrays["good"])
    mean, std = _channel_statistics(arrays["images"], [i for i, s in enumerate(splits) if s == "train" and good[i]])
    first = {split: splits.index(split) for split in SPLITS if split in splits}
    readable = np.asarray(arrays["sizes"])[good]
    return CacheMeta(
        fingerprint="",
        image_size=size,
        classes=list(found.classes),
        splits={split: [first[split], splits.count(split)] for split in first},
        carved_test=found.carved_test,
        mean=mean,
        std=std,
        bad_files=bad,
        resumed_at=done,
        sizes={
            name: [int(v.min()), int(statistics.median(v.tolist())), int(v.max())]
            for name, v in (("width", readable[:, 0]), ("height", readable[:, 1]))
            if len(v)
        },
    )


def _channel_statistics(
    pixels: np.ndarray, indices: list[int], chunk_bytes: int = 2**25
) -> tuple[list[float], list[float]]:
    """Per-channel mean and std (in 0..1) of the training images, in chunks of about 32 MB of pixels (float32
    copies of a chunk only; sums in float64)."""
    total, squares, count = np.zeros(3), np.zeros(3), 0
    chunk = max(1, chunk_bytes // max(1, pixels[0].size))
    for start in range(0, len(indices), chunk):
        part = pixels[indices[start : start + chunk]].astype(np.float32) / 255
        total += part.sum(axis=(0, 2, 3), dtype=np.float64)
        squares += np.square(part).sum(axis=(0, 2, 3), dtype=np.float64)
        count += part.shape[0] * part.shape[2] * part.shape[3]
    if count == 0:
        return [0.5] * 3, [0.25] * 3
    mean = total / count
    return mean.tolist(), np.sqrt(np.maximum(squares / count - mean**2, 1e-12)).tolist()


def copy_or_reuse(source: Path, target: Path, needed: int = 0) -> tuple[CacheMeta, str]:
    """A finished cache copied to ``target`` (a node's local disk): into a temporary folder, renamed when
    complete, so a copy cut short is never used (the next run copies again); "copied", or "reused" when another
    process of this node copied it while this one waited. Refused before copying when the disk has less room
    than ``needed``."""
    with _machine_lock(target):
        meta = read_meta(target)
        if meta is not None:  # another process of this node copied it while this one waited
            return meta, "reused"
        check_room(needed, target.parent)
        copying = target.with_name(f".{target.name}.copying-{socket.gethostname()}")
        shutil.rmtree(copying, ignore_errors=True)
        try:
            shutil.copytree(source, copying)
            if target.exists():  # unusable (cut short, another version): no run reads it
                shutil.rmtree(target)
            copying.rename(target)
        finally:
            shutil.rmtree(copying, ignore_errors=True)
    meta = read_meta(target)
    if meta is None:
        raise UserError(f"the image cache copied from {source} to {target} cannot be read: remove {target}")
    return meta, "copied"

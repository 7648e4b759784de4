"""Labelled image folders (torchvision's ImageFolder layout, ``DIR/train/<class>/<image>``, optionally ``test/``
and ``val/`` beside it): found and checked, decoded once (in parallel, into a preallocated memory map) into a
cache of uint8 pixels at ``image_size`` that later runs and every rank read, and described in a card. Imports no
torch: the decoding processes start fast.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cifar10_dist.errors import UserError, first_line

SPLITS = ("train", "val", "test")
SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
CARVED_TEST_SHARE = 10  # without test/: the training files whose path hash is 0 modulo this (a stable tenth)
IMBALANCE_RATIO = 10.0  # largest / smallest class count above this: a warning
SHOWN = 5  # files or pairs named in a message
CACHE_VERSION = 1
CACHE_FOLDER = ".cifar10_dist_cache"


@dataclass(frozen=True)
class FolderScan:
    """The files of each split (paths relative to the root, with their labels), the classes (train's class
    folders, sorted by name as torchvision's ImageFolder does) and whether test was carved from train."""

    root: Path
    classes: tuple[str, ...]
    files: dict[str, list[tuple[str, int]]]
    carved_test: bool


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def class_folders(split_dir: Path) -> list[str]:
    """The class folders of a split, sorted; hidden ones ignored."""
    return sorted(p.name for p in split_dir.iterdir() if p.is_dir() and _visible(p))


def _images_in(folder: Path, root: Path) -> list[str]:
    """Image files under a class folder (any depth), relative to the root; hidden and non-image files ignored."""
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if path.suffix.lower() in SUFFIXES and path.is_file() and all(_visible(Path(p)) for p in relative.parts):
            found.append(str(path.relative_to(root)))
    return sorted(found)


def scan(root: Path) -> FolderScan:
    """Find and check the layout: refused in one line when there is no train/ folder, no class, a single class,
    an empty class, or a class in test/ or val/ that train/ lacks."""
    if not root.is_dir():
        raise UserError(f"data_path='{root}' is not a folder: dataset=folder wants DIR/train/<class>/<images>")
    if not (root / "train").is_dir():
        raise UserError(f"data_path='{root}' has no train/ folder: dataset=folder wants DIR/train/<class>/<images> "
                        "(and optionally DIR/test/ and DIR/val/ alike)")
    classes = class_folders(root / "train")
    if len(classes) < 2:
        found = f"only '{classes[0]}'" if classes else "none"
        raise UserError(f"{root / 'train'} holds {found} of the class folders a classifier needs (at least 2): "
                        "one folder per class, named for it")
    files: dict[str, list[tuple[str, int]]] = {}
    for split in SPLITS:
        if not (root / split).is_dir():
            continue
        unknown = [name for name in class_folders(root / split) if name not in classes]
        if unknown:
            raise UserError(f"{root / split} has class folders that train/ lacks: {', '.join(unknown[:SHOWN])}: "
                            f"every class must have training images (train/ has {', '.join(classes)})")
        files[split] = []
        for label, name in enumerate(classes):
            found = _images_in(root / split / name, root) if (root / split / name).is_dir() else []
            if split == "train" and not found:
                raise UserError(f"class folder {root / split / name} holds no images ({', '.join(SUFFIXES)}): "
                                "remove it or add its images")
            files[split].extend((path, label) for path in found)
    carved = "test" not in files
    if carved:
        kept = [item for item in files["train"] if _path_hash(item[0]) % CARVED_TEST_SHARE]
        files["test"] = [item for item in files["train"] if not _path_hash(item[0]) % CARVED_TEST_SHARE]
        files["train"] = kept
    return FolderScan(root, tuple(classes), files, carved)


def _path_hash(relative: str) -> int:
    return int.from_bytes(hashlib.sha256(relative.encode()).digest()[:8], "big")


def fingerprint(found: FolderScan, image_size: int) -> str:
    """What the cache depends on: every file's path, size and modification time, the split and the image size."""
    digest = hashlib.sha256(f"v{CACHE_VERSION} size {image_size} classes {found.classes}".encode())
    for split, items in sorted(found.files.items()):
        for relative, label in items:
            stat = (found.root / relative).stat()
            digest.update(f"{split}\0{relative}\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


# ---------------------------------------------------------------- decoding


def fit_image(image: Any, size: int) -> Any:
    """A PIL image as RGB ``size`` x ``size``: greyscale, palette and alpha converted (alpha dropped); the shorter
    side scaled to ``size`` (bilinear), then the centre square taken. The rule for training images and for
    ``predict`` alike."""
    from PIL import Image

    image = to_rgb(image)
    if image.size != (size, size):
        width, height = image.size
        scale = size / min(width, height)
        scaled = (max(size, round(width * scale)), max(size, round(height * scale)))
        image = image.resize(scaled, Image.Resampling.BILINEAR)
        left, top = (scaled[0] - size) // 2, (scaled[1] - size) // 2
        image = image.crop((left, top, left + size, top + size))
    return image


def read_fitted(path: Path, size: int) -> Any:
    """One image file as uint8 (size, size, 3) RGB through ``fit_image``, or None when it cannot be read."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return np.asarray(fit_image(image, size), dtype=np.uint8).copy()
    except (OSError, ValueError):
        return None


def to_rgb(image: Any) -> Any:
    """RGB, from any mode (a palette with transparency through RGBA, so that its colours come out right)."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image if image.mode == "RGB" else image.convert("RGB")


def decode(task: tuple[str, int]) -> tuple[bytes | None, str, bytes, tuple[int, int]]:
    """(pixels HWC at the size, or None; why not; a hash of the full decoded pixels; original width, height)."""
    from PIL import Image

    path, size = task
    try:
        with Image.open(path) as opened:
            opened.load()  # a truncated file fails here, not later
            rgb = to_rgb(opened)
            content = hashlib.blake2b(rgb.tobytes(), digest_size=16, person=b"cifar10dist")
            content.update(f"{rgb.size}".encode())
            return fit_image(rgb, size).tobytes(), "", content.digest(), opened.size
    except Exception as error:  # unreadable, truncated, not an image after all: named, never fatal here
        return None, first_line(error) or type(error).__name__, b"", (0, 0)


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


@dataclass
class CacheMeta:
    """meta.json of a cache: what it holds and what the checks found while building it."""

    fingerprint: str
    image_size: int
    classes: list[str]
    splits: dict[str, list[int]]  # split: [first index, count]
    carved_test: bool
    mean: list[float]
    std: list[float]
    bad_files: list[list[str]] = field(default_factory=list)  # [file, why]
    sizes: dict[str, list[int]] = field(default_factory=dict)  # width and height: [min, median, max]
    build_seconds: float = 0.0
    version: int = CACHE_VERSION


def cache_dir(root: Path, image_size: int, key: str, under: Path | None = None) -> Path:
    return (under or root / CACHE_FOLDER) / f"{image_size}px-{key}"


def build_cache(found: FolderScan, image_size: int, target: Path, key: str, workers: int | None = None) -> CacheMeta:
    """Decode every file once into target/images.u8 (uint8 N x 3 x S x S, a preallocated memory map written in
    place: the decoded set is never held twice), labels.npy, hashes.npy (content hashes) and meta.json; written
    in a temporary folder and renamed, so a cache is complete or absent."""
    started = time.perf_counter()
    order = [(split, path, label) for split in SPLITS for path, label in found.files.get(split, [])]
    target.parent.mkdir(parents=True, exist_ok=True)
    building = target.with_name(f".{target.name}.building{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    try:
        meta = _decode_into(found, image_size, order, building, workers or default_workers())
        meta.fingerprint = key
        meta.build_seconds = time.perf_counter() - started
        (building / "meta.json").write_text(json.dumps(asdict(meta)))
        try:
            building.rename(target)
        except OSError:  # another process (a rank of another node) finished the same cache first
            if not (target / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return meta


def _decode_into(found: FolderScan, size: int, order: list[tuple[str, str, int]], folder: Path, workers: int
                 ) -> CacheMeta:
    pixels = np.lib.format.open_memmap(folder / "images.npy", mode="w+", dtype=np.uint8,
                                       shape=(len(order), 3, size, size))
    hashes = np.zeros(len(order), dtype="S16")
    good = np.ones(len(order), dtype=bool)
    widths, heights, bad = [], [], []
    tasks = [(str(found.root / path), size) for _, path, _ in order]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for index, (decoded, why, digest, (width, height)) in enumerate(pool.imap(decode, tasks, chunksize=64)):
            if decoded is None:
                good[index] = False
                bad.append([order[index][1], why])
                continue
            pixels[index] = np.frombuffer(decoded, dtype=np.uint8).reshape(size, size, 3).transpose(2, 0, 1)
            hashes[index] = digest
            widths.append(width), heights.append(height)
    pixels.flush()
    labels = np.array([label for _, _, label in order], dtype=np.int64)
    splits = [split for split, _, _ in order]
    np.save(folder / "labels.npy", labels)
    np.save(folder / "hashes.npy", hashes)
    np.save(folder / "good.npy", good)
    np.save(folder / "splits.npy", np.array([SPLITS.index(s) for s in splits], dtype=np.int8))
    (folder / "paths.txt").write_text("\n".join(path for _, path, _ in order))
    mean, std = _channel_statistics(pixels, [i for i, s in enumerate(splits) if s == "train" and good[i]])
    first = {split: splits.index(split) for split in SPLITS if split in splits}
    return CacheMeta(
        fingerprint="", image_size=size, classes=list(found.classes),
        splits={split: [first[split], splits.count(split)] for split in first}, carved_test=found.carved_test,
        mean=mean, std=std, bad_files=bad,
        sizes={name: [min(v), int(statistics.median(v)), max(v)] for name, v in (("width", widths), ("height", heights))
               if v})


def _channel_statistics(pixels: np.ndarray, indices: list[int], chunk_bytes: int = 2**25
                        ) -> tuple[list[float], list[float]]:
    """Per-channel mean and std (in 0..1) of the training images, in chunks of about 32 MB of pixels (float32
    copies of a chunk only; sums in float64)."""
    total, squares, count = np.zeros(3), np.zeros(3), 0
    chunk = max(1, chunk_bytes // max(1, pixels[0].size))
    for start in range(0, len(indices), chunk):
        part = pixels[indices[start:start + chunk]].astype(np.float32) / 255
        total += part.sum(axis=(0, 2, 3), dtype=np.float64)
        squares += np.square(part).sum(axis=(0, 2, 3), dtype=np.float64)
        count += part.shape[0] * part.shape[2] * part.shape[3]
    if count == 0:
        return [0.5] * 3, [0.25] * 3
    mean = total / count
    return mean.tolist(), np.sqrt(np.maximum(squares / count - mean ** 2, 1e-12)).tolist()


def read_meta(folder: Path) -> CacheMeta | None:
    """A finished cache's meta, or None (absent, or from another version of this code)."""
    try:
        values = json.loads((folder / "meta.json").read_text())
        return CacheMeta(**values) if values.get("version") == CACHE_VERSION else None
    except (OSError, ValueError, TypeError):
        return None


def ensure_cache(root: Path, image_size: int, under: Path | None = None, workers: int | None = None
                 ) -> tuple[Path, CacheMeta, FolderScan, str]:
    """The cache for the folder at this image size: read when its fingerprint matches; with ``under`` (cache_dir,
    e.g. a node's local disk) copied from the same cache beside the data when one is there (staging: no
    decoding); built otherwise. (Its folder, meta, the scan, and "reused", "copied" or "built".)"""
    found = scan(root)
    key = fingerprint(found, image_size)
    folder = cache_dir(root, image_size, key, under)
    meta = read_meta(folder)
    if meta is not None:
        return folder, meta, found, "reused"
    shared = cache_dir(root, image_size, key)
    try:
        if under is not None and shared != folder and read_meta(shared) is not None:
            return folder, copy_cache(shared, folder), found, "copied"
        meta = build_cache(found, image_size, folder, key, workers)
    except OSError as error:
        raise UserError(f"cannot write the image cache in {folder.parent} ({error.strerror or error}): make it "
                        "writable or give cache_dir=<a writable folder>") from error
    return folder, meta, found, "built"


def copy_cache(source: Path, target: Path) -> CacheMeta:
    """A finished cache copied to ``target`` (a node's local disk): into a temporary folder, renamed when
    complete, so a copy cut short is never used (the next run copies again)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    copying = target.with_name(f".{target.name}.copying{os.getpid()}")
    shutil.rmtree(copying, ignore_errors=True)
    try:
        shutil.copytree(source, copying)
        if target.exists() and read_meta(target) is None:  # unusable (cut short, another version): no run reads it
            shutil.rmtree(target)
        try:
            copying.rename(target)
        except OSError:  # another process of this node finished the same copy first
            if not (target / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(copying, ignore_errors=True)
    meta = read_meta(target)
    if meta is None:
        raise UserError(f"the image cache copied from {source} to {target} cannot be read: remove {target}")
    return meta

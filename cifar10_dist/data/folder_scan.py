"""Labelled image folders (torchvision's ImageFolder layout, ``DIR/train/<class>/<image>``, optionally ``test/``
and ``val/`` beside it): found and checked, fingerprinted, each image decoded to ``image_size`` (the rule for
the cache and for ``predict`` alike), and the meta of their cache of uint8 pixels (made by ``cache_builds``).
Imports no torch: the decoding processes start fast.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
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
        raise UserError(
            f"data_path='{root}' has no train/ folder: dataset=folder wants DIR/train/<class>/<images> "
            "(and optionally DIR/test/ and DIR/val/ alike)"
        )
    classes = class_folders(root / "train")
    if len(classes) < 2:
        held = f"only '{classes[0]}'" if classes else "none"
        raise UserError(
            f"{root / 'train'} holds {held} of the class folders a classifier needs (at least 2): "
            "one folder per class, named for it"
        )
    files: dict[str, list[tuple[str, int]]] = {}
    for split in SPLITS:
        if not (root / split).is_dir():
            continue
        unknown = [name for name in class_folders(root / split) if name not in classes]
        if unknown:
            raise UserError(
                f"{root / split} has class folders that train/ lacks: {', '.join(unknown[:SHOWN])}: "
                f"every class must have training images (train/ has {', '.join(classes)})"
            )
        files[split] = []
        for label, name in enumerate(classes):
            found = _images_in(root / split / name, root) if (root / split / name).is_dir() else []
            if split == "train" and not found:
                raise UserError(
                    f"class folder {root / split / name} holds no images ({', '.join(SUFFIXES)}): "
                    "remove it or add its images"
                )
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
    resumed_at: int = 0  # a build cut short and resumed: the image it went on from
    version: int = CACHE_VERSION


def cache_dir(root: Path, image_size: int, key: str, under: Path | None = None) -> Path:
    return (under or root / CACHE_FOLDER) / f"{image_size}px-{key}"


ARRAYS = {"images.npy": 4, "labels.npy": 1, "splits.npy": 1, "hashes.npy": 1, "good.npy": 1, "sizes.npy": 2}  # dims


def damage(folder: Path, meta: CacheMeta) -> str | None:
    """How a finished cache's files differ from what its meta.json says (a file cut short by a full disk or a
    copy, one missing, another shape), in a few words naming the file; None when each file has the length its
    header and the image count give. Reads the headers only."""
    count = sum(length for _, length in meta.splits.values())
    for name, dims in ARRAYS.items():
        path = folder / name
        try:
            with path.open("rb") as stream:
                version = np.lib.format.read_magic(stream)
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(stream)
                header = stream.tell()
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        except (OSError, ValueError) as error:
            return f"{name} cannot be read ({first_line(error)})"
        expected = header + int(np.prod(shape)) * np.dtype(dtype).itemsize
        if (
            len(shape) != dims
            or shape[0] != count
            or (name == "images.npy" and shape[1:] != (3, meta.image_size, meta.image_size))
        ):
            return f"{name} holds an array of shape {shape}, the cache {count} images at {meta.image_size} px"
        if size != expected:
            return f"{name} is {size:,} bytes, its header says {expected:,}"
    try:
        paths = (folder / "paths.txt").read_text().split("\n")
    except (OSError, UnicodeDecodeError) as error:
        return f"paths.txt cannot be read ({first_line(error)})"
    return None if len(paths) == count else f"paths.txt names {len(paths)} files, the cache holds {count} images"


def read_meta(folder: Path) -> CacheMeta | None:
    """A finished cache's meta, or None (absent, or from another version of this code)."""
    try:
        values = json.loads((folder / "meta.json").read_text())
        return CacheMeta(**values) if values.get("version") == CACHE_VERSION else None
    except (OSError, ValueError, TypeError):
        return None

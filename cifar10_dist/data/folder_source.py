"""The folder source (``dataset=folder``): a labelled image folder as a run's images, read on demand from its
memory-mapped cache (``folder_scan``; ``records.MappedImages``), its checks applied (unreadable files, duplicates
across splits, imbalanced classes) and its card (``prepare-data``)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import ignite.distributed as idist
import numpy as np
import torch

from cifar10_dist.config import Config
from cifar10_dist.data import cache_builds, folder_scan
from cifar10_dist.data.datasets import DatasetInfo, ImageSet, LoadedData, MappedImages
from cifar10_dist.errors import UserError
from cifar10_dist.results import PreparedData
from cifar10_dist.system import ranks

logger = logging.getLogger("cifar10_dist")


@dataclass
class FolderData(LoadedData):
    """A folder's splits as a run loads them (val None without a val/ folder, ``checks``: the findings recorded in
    provenance and summary.json), with the warnings to log and where its cache is."""

    warnings: list[str] = field(default_factory=list)
    cache: Path | None = None
    how: str = "reused"  # the cache: "reused", "copied" (staged from beside the data) or "built" now
    meta: folder_scan.CacheMeta | None = None

    @property
    def built(self) -> bool:
        return self.how == "built"


def load_folder(
    root: Path,
    image_size: int,
    skip_bad_images: bool = False,
    drop_test_duplicates: bool = False,
    cache_under: Path | None = None,
) -> FolderData:
    """The folder's images from its cache (built first when missing or stale), checked."""
    folder, meta, _, how = cache_builds.ensure_cache(root, image_size, cache_under)
    if meta.bad_files and not skip_bad_images:
        raise UserError(
            f"{len(meta.bad_files)} image file(s) in {root} cannot be read: {_named(meta.bad_files)}: "
            "fix or remove them, or give --skip_bad_images=True to train without them"
        )
    labels = np.load(folder / "labels.npy")
    hashes = np.load(folder / "hashes.npy")
    good = np.load(folder / "good.npy")
    paths = (folder / "paths.txt").read_text().split("\n")
    indices = {
        split: [i for i in range(first, first + count) if good[i]] for split, (first, count) in meta.splits.items()
    }
    duplicates = cross_split_duplicates(indices, hashes, paths)
    warnings = (
        [f"{len(meta.bad_files)} unreadable image file(s) skipped: {_named(meta.bad_files)}"] if meta.bad_files else []
    )
    dropped = _note_duplicates(duplicates, indices, paths, drop_test_duplicates, warnings)
    counts = np.bincount(labels[indices["train"]], minlength=len(meta.classes)).tolist()
    imbalance = max(counts) / max(min(counts), 1)
    if imbalance > folder_scan.IMBALANCE_RATIO:
        warnings.append(_imbalance_warning(imbalance, meta.classes, counts))
    for split in ("train", "test"):
        if not indices.get(split):
            raise UserError(f"{root}: no readable {split} images are left: {split} needs at least one")
    sets = {split: _image_set(folder / "images.npy", labels, chosen) for split, chosen in indices.items()}
    info = DatasetInfo(tuple(meta.classes), tuple(meta.mean), tuple(meta.std), meta.image_size)
    checks = {
        "duplicates_across_splits": len(duplicates),
        "duplicates_dropped": dropped,
        "bad_files_skipped": len(meta.bad_files),
        "imbalance_ratio": round(imbalance, 3),
        "test_carved_from_train": meta.carved_test,
        "cache": str(folder),
    }
    return FolderData(sets["train"], sets["test"], info, sets.get("val"), checks, warnings, folder, how, meta)


def load_configured(config: Config) -> FolderData:
    """``load_folder`` with what the config says: the folder, the stored size, the bad images and duplicates
    settings, and the cache's place."""
    return load_folder(
        Path(config.data_path),
        stored_size(config),
        config.skip_bad_images,
        config.drop_test_duplicates,
        Path(config.cache_dir) if config.cache_dir else None,
    )


def _note_duplicates(
    duplicates: list[tuple[str, str]], indices: dict[str, list[int]], paths: list[str], drop: bool, warnings: list[str]
) -> int:
    """A warning naming test/val images that copy another split's; with ``drop``, those copies taken out of
    ``indices``. Returns how many were dropped."""
    if not duplicates:
        return 0
    pairs = "; ".join(f"{a} = {b}" for a, b in duplicates[: folder_scan.SHOWN])
    warnings.append(
        f"{len(duplicates)} image(s) of test/val are exact copies of images in another split "
        f"(decoded pixels): {pairs}" + ("" if drop else "; --drop_test_duplicates=True removes them from test/val")
    )
    if not drop:
        return 0
    position = {path: index for index, path in enumerate(paths)}
    copies = {position[copy] for copy, _ in duplicates}
    dropped = 0
    for split in ("test", "val"):
        if split in indices:
            kept = [i for i in indices[split] if i not in copies]
            dropped += len(indices[split]) - len(kept)
            indices[split] = kept
    return dropped


def _imbalance_warning(imbalance: float, classes: list[str], counts: list[int]) -> str:
    return (
        f"classes are imbalanced: the largest has {imbalance:.1f}x the images of the smallest "
        f"(above {folder_scan.IMBALANCE_RATIO:g}): "
        + ", ".join(f"{name} {count}" for name, count in zip(classes, counts))
        + "; remedies: --sampler=balanced or --class_weights=auto, and --best_metric=balanced_accuracy "
        "or macro_f1 (docs/your-data.md)"
    )


def _image_set(pixels: Path, labels: np.ndarray, chosen: list[int]) -> ImageSet:
    """A split read on demand from the cache (``MappedImages``): no copy of its pixels in this process."""
    return ImageSet(MappedImages(pixels, np.asarray(chosen, dtype=np.int64)), torch.from_numpy(labels[chosen]))


def cross_split_duplicates(
    indices: dict[str, list[int]], hashes: np.ndarray, paths: list[str]
) -> list[tuple[str, str]]:
    """(copy in test or val, its original in train or val) for every image whose decoded pixels equal an image of
    an earlier split (train, then val)."""
    seen: dict[bytes, int] = {}
    for index in indices["train"]:
        seen.setdefault(bytes(hashes[index]), index)
    found = []
    for split in ("val", "test"):
        for index in indices.get(split, []):
            original = seen.get(bytes(hashes[index]))
            if original is not None:
                found.append((paths[index], paths[original]))
        if split == "val":
            for index in indices.get("val", []):
                seen.setdefault(bytes(hashes[index]), index)
    return found


def _named(files: list[list[str]]) -> str:
    shown = ", ".join(f"{path} ({why})" for path, why in files[: folder_scan.SHOWN])
    return shown + (f" and {len(files) - folder_scan.SHOWN} more" if len(files) > folder_scan.SHOWN else "")


def card(loaded: FolderData, root: Path) -> str:
    """The dataset's card: classes with counts per split, image sizes, checks, cache size and build time."""
    meta, checks, cache = loaded.meta, loaded.checks, loaded.cache
    assert meta is not None and checks is not None and cache is not None  # (a folder's load sets them)
    splits = {"train": loaded.train, "val": loaded.val, "test": loaded.test}
    present = {name: images for name, images in splits.items() if images is not None}
    width = max(12, *(len(name) for name in loaded.info.classes))
    lines = [
        f"{root}: {len(loaded.info.classes)} classes, "
        + ", ".join(f"{name} {len(images)}" for name, images in present.items())
        + " images"
        + (" (test carved from train: no test/ folder)" if meta.carved_test else ""),
        f"{'class':<{width}}" + "".join(f"{name:>8}" for name in present),
    ]
    counts = [torch.bincount(images.labels, minlength=len(loaded.info.classes)).tolist() for images in present.values()]
    for label, name in enumerate(loaded.info.classes):
        lines.append(f"{name:<{width}}" + "".join(f"{split[label]:>8}" for split in counts))
    if meta.sizes:
        lines.append(
            "image sizes (min/median/max): width "
            + "/".join(map(str, meta.sizes["width"]))
            + ", height "
            + "/".join(map(str, meta.sizes["height"]))
            + f"; stored at {meta.image_size}x{meta.image_size} "
            "(shorter side scaled, centre crop)"
        )
    lines.append(
        "normalisation (train): mean "
        + ", ".join(f"{v:.4f}" for v in meta.mean)
        + "; std "
        + ", ".join(f"{v:.4f}" for v in meta.std)
    )
    lines.append(
        f"duplicates across splits: {checks['duplicates_across_splits']} "
        f"(dropped {checks['duplicates_dropped']}); unreadable files: {len(meta.bad_files)}; "
        f"largest/smallest class: {checks['imbalance_ratio']:.2f}"
    )
    size = sum(path.stat().st_size for path in cache.iterdir() if path.is_file()) / 2**20
    resumed = f" (resumed at image {meta.resumed_at})" if meta.resumed_at else ""
    lines.append(
        f"cache: {loaded.cache} ({size:.1f} MiB), "
        + (
            f"built now in {meta.build_seconds:.1f} s{resumed}"
            if loaded.built
            else f"{'copied from beside the data' if loaded.how == 'copied' else 'reused'} (built in "
            f"{meta.build_seconds:.1f} s{resumed})"
        )
    )
    lines.extend(f"warning: {warning}" for warning in loaded.warnings)
    return "\n".join(lines)


# ---------------------------------------------------------------- the folder source (sources.py)


def stored_size(config: Config) -> int:
    """The side a folder's images are cached at (a run's config, or a checkpoint's recorded one): image_size, or
    larger by 1 / crop_fraction (evaluation's central crop is then image_size, and random-resized crops have the
    whole picture to choose from)."""
    return round(config.image_size / config.crop_fraction)


def info(config: Config) -> DatasetInfo:
    """The class folders of train/ (the normalisation is the training images', known once the cache is built)."""
    return DatasetInfo(tuple(folder_scan.scan(Path(config.data_path)).classes), image_size=config.image_size)


def load(config: Config) -> FolderData:
    """The folder through its cache (local rank 0 builds it, the others wait and read it), its warnings logged
    once."""
    with idist.one_rank_first(local=True):
        loaded = load_configured(config)
    loaded.info = dataclasses.replace(loaded.info, image_size=config.image_size)
    sizes = ", ".join(
        f"{name} {len(images)}"
        for name, images in (("train", loaded.train), ("val", loaded.val), ("test", loaded.test))
        if images is not None
    )
    stored = stored_size(config)
    ranks.on_rank_zero(
        logger.info,
        "image folder %s: %d classes, %s images stored at %dx%d (cache %s, %s)%s",
        config.data_path,
        len(loaded.info.classes),
        sizes,
        stored,
        stored,
        loaded.cache,
        {"built": "built now", "copied": "copied from the data folder's"}.get(loaded.how, "reused"),
        f", seen at {config.image_size}x{config.image_size}" if stored != config.image_size else "",
    )
    for warning in loaded.warnings:
        ranks.on_rank_zero(logger.warning, "%s", warning)
    return loaded


def preflight(config: Config) -> None:
    """The layout, checked before any process starts (one line); the images when the run reads them."""
    folder_scan.scan(Path(config.data_path))


def sample_images(config: Config, limit: int) -> tuple[torch.Tensor, str] | None:
    """The first ``limit`` images of test/ (else train/) of the folder a checkpoint's config names, at its size."""
    root = Path(config.data_path)
    try:
        found = folder_scan.scan(root)
    except UserError:
        return None
    files = [root / path for path, _ in found.files["test" if found.files.get("test") else "train"][:limit]]
    images = [folder_scan.read_fitted(path, stored_size(config)) for path in files]
    images = [torch.from_numpy(image).permute(2, 0, 1) for image in images if image is not None]
    return (torch.stack(images), f"{len(images)} images of {root}") if images else None


def prepare(
    config: Config, synthetic: int | None = None, synthetic_test: int | None = None, seed: int = 0
) -> PreparedData:
    """Build (or reuse) and check the folder's cache, and describe it in a card."""
    loaded = load_configured(config)
    return PreparedData(
        str(loaded.cache),
        len(loaded.train),
        len(loaded.test),
        synthetic=False,
        card=card(loaded, Path(config.data_path)),
    )

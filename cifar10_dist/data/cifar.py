"""CIFAR-10 and CIFAR-100 on disk and as uint8 tensors (their layouts and classes: ``cifar_layouts``): reading
and validating the batch files (and writing them), download and extraction. ``loaders`` serves the images in batches and
``augmentation`` transforms the batches on the training device. Nothing here knows about models or the command
line.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import tarfile
from pathlib import Path
from typing import Any, Mapping

import ignite.distributed as idist
import numpy as np
import torch

from cifar10_dist import checkpoint_layout
from cifar10_dist.config import Config
from cifar10_dist.data.cifar_layouts import (
    CIFAR100_COARSE,
    CIFAR100_FINE,
    LAYOUTS,
    TEST_FILE,
    TRAIN_FILES,
    Layout,
    cifar_info,
    num_classes,
)
from cifar10_dist.data.datasets import CLASSES, NUM_CLASSES, DatasetInfo, ImageSet, LoadedData
from cifar10_dist.data.synthetic import make_synthetic
from cifar10_dist.errors import UserError
from cifar10_dist.results import PreparedData
from cifar10_dist.system import ranks

logger = logging.getLogger(__name__)


def checkpoint_info(checkpoint: Mapping[str, Any]) -> DatasetInfo:
    """The classes, normalisation and image size a checkpoint's model was trained with (recorded in its
    provenance; CIFAR's for files from before they were recorded)."""
    recorded = checkpoint_layout.recorded_data_info(checkpoint)
    if recorded:
        return DatasetInfo.from_dict(recorded)
    config = checkpoint_layout.recorded_config(checkpoint) or Config()  # a bare state dict: CIFAR-10's
    return cifar_info(config.dataset, config.label_mode)


# ---------------------------------------------------------------- reading and writing the on-disk format


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a batch file can never run code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("copyreg", "_reconstructor"),
        ("builtins", "object"),
        ("_codecs", "encode"),  # bytes in protocol-2 pickles
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _read_batch(path: Path, label_key: str = "labels", classes: int = NUM_CLASSES, kind: str = "CIFAR-10") -> ImageSet:
    try:
        with path.open("rb") as file:
            entry = _ArrayUnpickler(file, encoding="latin1").load()
    except Exception as error:  # truncated, corrupt or hostile: all the same to the user
        raise UserError(f"{path} is not a readable {kind} batch file ({type(error).__name__}: {error})") from error
    if not isinstance(entry, dict):
        raise UserError(f"{path} is not a {kind} batch file: expected a dict, found {type(entry).__name__}")
    entry = {key.decode() if isinstance(key, bytes) else key: value for key, value in entry.items()}
    if "data" not in entry or label_key not in entry:
        raise UserError(f"{path} is not a {kind} batch file: keys 'data' and '{label_key}' missing")
    data = np.asarray(entry["data"])
    labels = np.asarray(entry[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise UserError(f"{path}: data must be uint8 rows of 3072 values (3x32x32), found {data.dtype} {data.shape}")
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"{path}: expected {len(data)} integer labels, found {labels.dtype} {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        bad = labels[(labels < 0) | (labels >= classes)][0]
        raise UserError(f"{path}: label {bad} is out of range: {label_key} must be 0..{classes - 1}")
    images = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    return ImageSet(images, torch.from_numpy(labels.astype(np.int64)))


def _concat(parts: list[ImageSet]) -> ImageSet:
    return ImageSet(torch.cat([torch.as_tensor(p.images) for p in parts]), torch.cat([p.labels for p in parts]))


def read_cifar10(folder: Path) -> tuple[ImageSet, ImageSet]:
    """Read and validate (train, test) from a cifar-10-batches-py folder."""
    return read_folder("cifar10", folder)


def _write_batch(path: Path, images: ImageSet, label: str) -> None:
    entry = {
        "batch_label": label,
        "labels": images.labels.tolist(),
        "data": torch.as_tensor(images.images).reshape(len(images), -1).numpy(),
        "filenames": [f"image_{i:06d}.png" for i in range(len(images))],
    }
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as file:
        pickle.dump(entry, file, protocol=4)
    temporary.replace(path)


def write_cifar10(folder: Path, train: ImageSet, test: ImageSet) -> None:
    """Write (train, test) in the standard cifar-10-batches-py layout (5 training files, 1 test file)."""
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(train) // len(TRAIN_FILES))
    for index, name in enumerate(TRAIN_FILES):
        part = slice(index * per_file, (index + 1) * per_file)
        chunk = ImageSet(train.images[part], train.labels[part])
        _write_batch(folder / name, chunk, f"training batch {index + 1} of 5")
    _write_batch(folder / TEST_FILE, test, "testing batch 1 of 1")
    meta = {"label_names": list(CLASSES), "num_cases_per_batch": per_file, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=4))


def read_cifar100(folder: Path, label_mode: str = "fine") -> tuple[ImageSet, ImageSet]:
    """Read and validate (train, test) from a cifar-100-python folder: fine labels (100 classes) or coarse (20)."""
    return read_folder("cifar100", folder, label_mode)


def write_cifar100(folder: Path, train: ImageSet, test: ImageSet) -> None:
    """Write (train, test) with fine labels 0..99 in the cifar-100-python layout (train, test, meta); the coarse
    label of fine class c is c // 5 here (the real release groups classes by meaning)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, images in (("train", train), ("test", test)):
        entry = {
            "filenames": [f"image_{i:06d}.png" for i in range(len(images))],
            "batch_label": name,
            "fine_labels": images.labels.tolist(),
            "coarse_labels": (images.labels // 5).tolist(),
            "data": torch.as_tensor(images.images).reshape(len(images), -1).numpy(),
        }
        (folder / name).write_bytes(pickle.dumps(entry, protocol=4))
    meta = {"fine_label_names": list(CIFAR100_FINE), "coarse_label_names": list(CIFAR100_COARSE)}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=4))


def read_dataset(
    dataset: str, data_path: Path, label_mode: str = "fine", download: bool = True
) -> tuple[Path, ImageSet, ImageSet]:
    """(folder, train, test) of cifar10 or cifar100 under data_path, extracted or downloaded when missing."""
    folder = ensure_dataset(data_path, LAYOUTS[dataset], download)
    return (folder, *read_folder(dataset, folder, label_mode))


def _read_layout_batch(dataset: str, path: Path, label_mode: str) -> ImageSet:
    layout = LAYOUTS[dataset]
    return _read_batch(path, layout.label_key.format(mode=label_mode), num_classes(dataset, label_mode), layout.name)


def read_test_set(dataset: str, folder: Path, label_mode: str = "fine") -> ImageSet:
    """The test images alone (no training files read) from a cifar-10-batches-py or cifar-100-python folder."""
    return _read_layout_batch(dataset, folder / LAYOUTS[dataset].test_file, label_mode)


def read_folder(dataset: str, folder: Path, label_mode: str = "fine") -> tuple[ImageSet, ImageSet]:
    """Read and validate (train, test) from a dataset's folder (cifar-10-batches-py or cifar-100-python)."""
    layout = LAYOUTS[dataset]
    expected = (*layout.train_files, layout.test_file)
    missing = [name for name in expected if not (folder / name).is_file()]
    if missing:
        raise UserError(f"{folder} is missing {', '.join(missing)}: expected {', '.join(expected)}")
    train = _concat([_read_layout_batch(dataset, folder / name, label_mode) for name in layout.train_files])
    test = read_test_set(dataset, folder, label_mode)
    if len(train) == 0 or len(test) == 0:
        raise UserError(f"{folder} holds {len(train)} training and {len(test)} test images: both must be non-empty")
    return train, test


def matches_official_release(folder: Path, layout: Layout | None = None) -> bool:
    """Whether every batch file has the md5 sum of the official release (copies made elsewhere differ)."""
    for name, expected in (layout or LAYOUTS["cifar10"]).official_md5.items():
        digest = hashlib.md5((folder / name).read_bytes(), usedforsecurity=False).hexdigest()
        if digest != expected:
            return False
    return True


# ---------------------------------------------------------------- finding, extracting, downloading


def ensure_cifar10(data_path: Path, download: bool = True) -> Path:
    """Return the cifar-10-batches-py folder under data_path, extracting or downloading it when missing."""
    return ensure_dataset(data_path, LAYOUTS["cifar10"], download)


def ensure_dataset(data_path: Path, layout: Layout, download: bool = True) -> Path:
    """Return the layout's folder under data_path, extracting or downloading its archive when missing."""
    folder = data_path / layout.folder
    if (folder / layout.test_file).is_file():
        return folder
    archive = data_path / layout.archive
    if not archive.is_file() and download:
        _download(archive, layout)
    if archive.is_file():
        _extract(archive, data_path)
    if not folder.is_dir():
        raise UserError(
            f"{layout.name} not found: put {layout.archive} (from {layout.url}) or its extracted "
            f"{layout.folder}/ folder in '{data_path}'"
        )
    return folder


def _download(archive: Path, layout: Layout) -> None:
    from torchvision.datasets.utils import download_url

    logger.info("Downloading %s from %s to %s", layout.name, layout.url, archive.parent)
    created = not archive.parent.exists()
    try:
        download_url(layout.url, str(archive.parent), filename=layout.archive)
    except Exception as error:  # offline, proxy, disk full ...
        archive.unlink(missing_ok=True)
        if created and not any(archive.parent.iterdir()):
            archive.parent.rmdir()  # leave no empty folder behind
        raise UserError(
            f"{layout.name} is not in '{archive.parent}' and downloading {layout.url} failed "
            f"({type(error).__name__}): put {layout.archive} or its extracted {layout.folder}/ folder there by hand"
        ) from error


def _extract(archive: Path, destination: Path) -> None:
    logger.info("Extracting %s", archive)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.10.12+, 3.11.4+
                tar.extractall(destination, filter="data")
            else:
                tar.extractall(destination, members=_safe_members(tar, destination))
    except (tarfile.TarError, OSError, EOFError) as error:
        raise UserError(f"{archive} could not be extracted ({error}): delete it and download it again") from error


def _safe_members(tar: tarfile.TarFile, destination: Path) -> list[tarfile.TarInfo]:
    """What the "data" filter allows, for Pythons without it: plain files and folders inside destination."""
    root = destination.resolve()
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or (target != root and root not in target.parents):
            raise tarfile.TarError(f"refusing to extract {member.name!r}: not a plain file or folder inside {root}")
    return tar.getmembers()


# ---------------------------------------------------------------- synthetic data


# ---------------------------------------------------------------- the cifar10 and cifar100 sources (sources.py)


def info(config: Config) -> DatasetInfo:
    """Their class names and CIFAR-10's channel statistics, 32x32."""
    return cifar_info(config.dataset, config.label_mode)


def load(config: Config) -> LoadedData:
    """The dataset from data_path (downloaded there by one process per node when missing and allowed)."""
    layout = LAYOUTS[config.dataset]
    with idist.one_rank_first(local=True):
        folder = ensure_dataset(Path(config.data_path), layout, download=config.download)
    train_set, test_set = read_folder(config.dataset, folder, config.label_mode)
    ranks.on_rank_zero(_log_dataset, folder, layout, train_set, test_set)
    return LoadedData(train_set, test_set, info(config))


def _log_dataset(folder: Path, layout: Layout, train_set: ImageSet, test_set: ImageSet) -> None:
    official = "match" if matches_official_release(folder, layout) else "differ from"  # hashes the files
    logger.info(
        "%s from %s: %d train, %d test images (files %s the official release)",
        layout.name,
        folder,
        len(train_set),
        len(test_set),
        official,
    )


def preflight(config: Config) -> None:
    """Nothing to check before the launch: a missing dataset is downloaded (or refused) by the run itself."""


def sample_images(config: Config, limit: int) -> tuple[torch.Tensor, str] | None:
    """The first ``limit`` test images of the dataset a checkpoint's config names, while they are readable."""
    folder = Path(config.data_path) / LAYOUTS[config.dataset].folder
    try:
        test = read_test_set(config.dataset, folder, config.label_mode) if folder.is_dir() else None
    except UserError:
        return None
    return None if test is None else (test.images[:limit], f"{min(limit, len(test))} test images of {folder}")


def prepare(
    config: Config, synthetic: int | None = None, synthetic_test: int | None = None, seed: int = 0
) -> PreparedData:
    """Download, extract and check the dataset in data_path; or write ``synthetic`` training images (and
    ``synthetic_test``, default a fifth) in its on-disk format."""
    layout = LAYOUTS[config.dataset]
    if synthetic is None:
        folder, train_set, test_set = read_dataset(config.dataset, Path(config.data_path), config.label_mode)
        return PreparedData(
            str(folder),
            len(train_set),
            len(test_set),
            synthetic=False,
            official=matches_official_release(folder, layout),
        )
    num_test = synthetic_test if synthetic_test is not None else max(int(synthetic) // 5, 1)
    if not isinstance(synthetic, int) or synthetic < 1 or not isinstance(num_test, int) or num_test < 1:
        raise UserError(f"synthetic={synthetic!r}, synthetic_test={num_test!r}: both must be whole numbers >= 1")
    train_set, test_set = make_synthetic(synthetic, num_test, seed, num_classes(config.dataset))
    folder = Path(config.data_path) / layout.folder
    WRITERS[config.dataset](folder, train_set, test_set)
    return PreparedData(str(folder), len(train_set), len(test_set), synthetic=True)


WRITERS = {"cifar10": write_cifar10, "cifar100": write_cifar100}

"""Using a trained model: rebuild it from a checkpoint, read image files, and compute class probabilities.

Images go through exactly what evaluation does (uint8 RGB 32x32, normalised with the training mean/std, the same
test-time augmentation), so a folder of test images written as PNG gets the accuracy that ``evaluate`` reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn

from cifar10_dist import checkpoint_layout
from cifar10_dist.config import Config, commands
from cifar10_dist.data import augmentation, cifar, cifar_layouts, folder_scan
from cifar10_dist.data.datasets import IMAGE_SIZE, DatasetInfo
from cifar10_dist.errors import UserError
from cifar10_dist.models.restoring import restore_model
from cifar10_dist.models.viewing import TemperatureScaled, tta_logits
from cifar10_dist.outputs import checkpoint_files
from cifar10_dist.system.hardware import usable_device

logger = logging.getLogger(__name__)


@dataclass
class TrainedModel:
    """A checkpoint's model in eval mode on ``device``, with what it was trained with."""

    model: Any  # an nn.Module, or an ONNX file's runtime session behind the same call (quantizing.OnnxModel)
    checkpoint: Path
    config: Config  # the config recorded in the checkpoint (an ONNX file's: its model, tta 0)
    classes: tuple[str, ...]
    device: torch.device
    provenance: dict[str, Any]  # recorded in the checkpoint (code version, data hash)
    info: DatasetInfo = cifar_layouts.cifar_info("cifar10")  # classes, normalisation and image size it was trained with
    temperature: float | None = None  # calibrate=temperature: its logits are divided by this

    @property
    def scaled(self) -> nn.Module:
        """The model whose logits give its probabilities: divided by the temperature when it has one."""
        return self.model if self.temperature is None else TemperatureScaled(self.model, self.temperature)

    @property
    def tta(self) -> int:
        return int(self.config.tta)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_trained_model(
    checkpoint: str | Path, device: str | torch.device | None = None, raw_weights: bool = False
) -> TrainedModel:
    """The model a checkpoint (training checkpoint or best-model file) records, rebuilt with its weights (the EMA
    weights of a run with ema_decay, unless ``raw_weights``); or an ONNX file of ``export`` (int8 included) on
    ONNX Runtime, on the CPU."""
    chosen = usable_device(str(device)) if device is not None else default_device()
    if str(checkpoint).endswith(".onnx"):
        from cifar10_dist.deployment import quantizing

        if not Path(checkpoint).is_file():
            raise UserError(f"checkpoint '{checkpoint}' does not exist")
        metadata = quantizing.onnx_metadata(checkpoint)
        info = quantizing.info_of(metadata)
        return TrainedModel(
            quantizing.OnnxModel(checkpoint),
            Path(checkpoint),
            quantizing.config_of(metadata),
            info.classes,
            torch.device("cpu"),
            quantizing.provenance_of(metadata),
            info,
        )
    loaded = checkpoint_files.load_checkpoint(checkpoint)
    info = cifar.checkpoint_info(loaded)
    model = restore_model(loaded, checkpoint, len(info.classes), raw_weights=raw_weights)
    config = checkpoint_layout.recorded_config(loaded) or Config.from_record({})  # (restore_model found its model)
    return TrainedModel(
        model.eval().to(chosen),
        Path(checkpoint),
        config,
        info.classes,
        chosen,
        checkpoint_layout.recorded_provenance(loaded),
        info,
        checkpoint_layout.temperature(loaded),
    )


@torch.no_grad()
def probabilities(
    trained: TrainedModel,
    images: torch.Tensor,
    batch_size: int = commands.default(commands.PREDICT, "batch_size"),
    tta: int | None = commands.default(commands.PREDICT, "tta"),
) -> torch.Tensor:
    """Class probabilities (N, classes) on the CPU of uint8 images (N, 3, S, S) as the model's images were stored
    (the evaluation view is cut from them), in batches."""
    views = trained.tta if tta is None else check_tta(tta)
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size} must be at least 1")
    chunks = []
    for start in range(0, len(images), batch_size):
        view = augmentation.eval_view(
            images[start : start + batch_size].to(trained.device), trained.info.image_size, trained.info.crop_fraction
        )
        batch = augmentation.normalize(view, trained.info.mean, trained.info.std)
        chunks.append(torch.softmax(tta_logits(trained.scaled, batch, views).float(), dim=1).cpu())
    return torch.cat(chunks) if chunks else torch.zeros(0, len(trained.classes))


def check_tta(tta: Any) -> int:
    if tta not in (0, 1, 2) or isinstance(tta, bool):
        raise UserError(f"tta={tta!r} is not accepted: choose 0 (none), 1 (mirror) or 2 (mirror + shifts)")
    return int(tta)


# ---------------------------------------------------------------- image files


def image_suffixes() -> set[str]:
    """The file name endings Pillow can open (.png, .jpg, .jpeg, .bmp, .webp, ...)."""
    from PIL import Image

    return {suffix.lower() for suffix in Image.registered_extensions()}


@dataclass
class ImageFiles:
    """Files to classify, and the paths given that yield none (with the reason)."""

    files: list[Path] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)


def find_images(paths: Iterable[str | Path]) -> ImageFiles:
    """Image files named directly (whatever their ending) or found in folders, recursively, in sorted order."""
    found = ImageFiles()
    suffixes = None
    for given in map(Path, paths):
        if given.is_file():
            found.files.append(given)
        elif given.is_dir():
            suffixes = suffixes or image_suffixes()
            named = sorted(path for path in given.rglob("*") if path.suffix.lower() in suffixes)
            inside = [path for path in named if path.is_file()]
            broken = [
                (str(path), "a broken link (it points to nothing)")
                for path in named
                if path.is_symlink() and not path.exists()
            ]
            found.failures.extend(broken)
            if inside:
                found.files.extend(inside)
            elif not broken:
                found.failures.append((str(given), "the folder holds no image files (searched recursively)"))
        else:
            found.failures.append((str(given), "no such file or folder"))
    return found


def image_to_tensor(image: Any, size: int = IMAGE_SIZE) -> tuple[torch.Tensor, bool]:
    """A PIL image as uint8 (3, S, S) RGB (grayscale, palette and RGBA converted; alpha dropped), and whether it
    had to be resized: the shorter side to S pixels, then the centre square (``folder_scan.fit_image``, the
    rule training images of a folder went through)."""
    resized = image.size != (size, size)
    image = folder_scan.fit_image(image, size)
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    return pixels.view(size, size, 3).permute(2, 0, 1).contiguous(), resized


@dataclass
class ReadImages:
    images: torch.Tensor  # uint8 (N, 3, 32, 32)
    paths: list[Path]  # the files read, in the order of images
    failures: list[tuple[str, str]]  # (file, why it could not be read)
    resized: int  # how many were not of the size asked for


def read_images(files: Sequence[Path], size: int = IMAGE_SIZE) -> ReadImages:
    """Read image files with Pillow at S x S; a file that is not an image is a failure, the others are still
    read."""
    from PIL import Image

    tensors, paths, failures, resized = [], [], [], 0
    for path in files:
        try:
            with Image.open(path) as image:
                tensor, was_resized = image_to_tensor(image, size)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            failures.append((str(path), f"cannot be read as an image ({type(error).__name__}: {error})"))
            continue
        tensors.append(tensor)
        paths.append(path)
        resized += was_resized
    images = torch.stack(tensors) if tensors else torch.zeros(0, 3, size, size, dtype=torch.uint8)
    return ReadImages(images, paths, failures, resized)


@dataclass
class ClassifiedBatch:
    """One batch of image files: the files read, their class probabilities (N, classes) on the CPU, the files
    that could not be read (with why), and how many were not of the model's size (and were resized)."""

    paths: list[Path]
    probabilities: torch.Tensor
    failures: list[tuple[str, str]]
    resized: int


@dataclass
class FilePredictions:
    """Image files and folders classified batch by batch, lazily (a large folder streams): the model's class
    names, the size it takes, the paths given that yield no file (with why), and the batches."""

    classes: tuple[str, ...]
    image_size: int
    missing: list[tuple[str, str]]
    batches: Iterator[ClassifiedBatch]


def classify_files(
    trained: TrainedModel, paths: Iterable[str | Path], batch_size: int, tta: int | None
) -> FilePredictions:
    found = find_images(paths)

    def batches() -> Iterator[ClassifiedBatch]:
        for start in range(0, len(found.files), batch_size):
            read = read_images(found.files[start : start + batch_size], trained.info.stored_size)
            yield ClassifiedBatch(
                read.paths, probabilities(trained, read.images, batch_size, tta), read.failures, read.resized
            )

    return FilePredictions(trained.classes, trained.info.stored_size, list(found.failures), batches())


def as_uint8_batch(images: Any, size: int = IMAGE_SIZE) -> torch.Tensor:
    """uint8 (N, 3, S, S) from a tensor of that shape (or one image), PIL images, or image paths; a path that
    is not an image is a UserError naming it."""
    if isinstance(images, torch.Tensor):
        batch = images.unsqueeze(0) if images.dim() == 3 else images
        if batch.dtype != torch.uint8 or tuple(batch.shape[1:]) != (3, size, size):
            raise UserError(
                f"images: expected a uint8 tensor of shape (N, 3, {size}, {size}), got {batch.dtype} "
                f"{tuple(batch.shape)}"
            )
        return batch
    items = list(images) if isinstance(images, (list, tuple)) else [images]
    if all(isinstance(item, (str, Path)) for item in items):
        found = find_images(items)
        read = read_images(found.files, size)
        failures = found.failures + read.failures
        if failures:
            raise UserError(f"{failures[0][0]}: {failures[0][1]}")
        return read.images
    try:
        return torch.stack([image_to_tensor(item, size)[0] for item in items])
    except AttributeError as error:
        raise UserError("images: give image paths, PIL images, or a uint8 tensor (N, 3, 32, 32)") from error

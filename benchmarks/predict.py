"""Predict: how fast ``predict`` classifies images, the whole command on PNG files and the model alone on a uint8
tensor; prints a table of images per second. Last run: 2 cores, CPU not recorded, 2,000 real test images, batch
256, CPU (docs/models-in-and-out.md: airbench 371 img/s for the command, 432 for the model alone); one pass per
model, about a minute for the three.

    python -m benchmarks.predict [--models=airbench,resnet18,cifar_resnet18] [--images=2000] [--batch_size=256]
        [--device=cpu] [--data_path=DIR]

Weights are freshly initialised (speed does not depend on them). The images are the first test images of DIR (real
CIFAR-10) when given, else synthetic ones, written as PNG files.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from cifar10_dist import cli, models
from cifar10_dist.data import cifar, cifar_layouts
from cifar10_dist.data.synthetic import make_synthetic
from cifar10_dist.deployment import inference


def test_images(count: int, data_path: str | None) -> torch.Tensor:
    if data_path:
        return cifar.read_cifar10(Path(data_path) / cifar_layouts.FOLDER)[1].images[:count]
    return make_synthetic(1, count, seed=0)[1].images


def write_pngs(images: torch.Tensor, folder: Path) -> None:
    for index, image in enumerate(images):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{index:05d}.png")


def saved_model(name: str, folder: Path) -> Path:
    path = folder / f"{name}.pt"
    torch.save({"model": models.build_model(name).state_dict(), "meta": {"config": {"model": name}}}, path)
    return path


def command_speed(checkpoint: Path, folder: Path, count: int, batch_size: int, device: str) -> float:
    """Images per second of `cifar10-dist predict` on the folder: loading, decoding, forward, printing."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        code = cli.main(
            ["predict", f"--checkpoint={checkpoint}", str(folder), f"--batch_size={batch_size}", f"--device={device}"]
        )
    seconds = time.perf_counter() - started
    assert code == 0 and len(printed.getvalue().splitlines()) == count
    return count / seconds


def model_speed(checkpoint: Path, images: torch.Tensor, batch_size: int, device: str) -> float:
    """Images per second of the model alone (normalise, forward, softmax) on a uint8 tensor, after a warm-up."""
    trained = inference.load_trained_model(checkpoint, device)
    inference.probabilities(trained, images[:batch_size], batch_size)
    started = time.perf_counter()
    inference.probabilities(trained, images, batch_size)
    return len(images) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="airbench,resnet18,cifar_resnet18")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data_path", default=None)
    args = parser.parse_args()
    images = test_images(args.images, args.data_path)
    print(
        f"{len(images)} {'test' if args.data_path else 'synthetic'} images, batch {args.batch_size}, "
        f"device {args.device}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print(f"{'model':<16}{'predict command (PNG files) img/s':>36}{'model on a tensor img/s':>26}")
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary) / "images"
        folder.mkdir()
        write_pngs(images, folder)
        for name in args.models.split(","):
            checkpoint = saved_model(name, Path(temporary))
            command = command_speed(checkpoint, folder, len(images), args.batch_size, args.device)
            alone = model_speed(checkpoint, images, args.batch_size, args.device)
            print(f"{name:<16}{command:>36.0f}{alone:>26.0f}")


if __name__ == "__main__":
    main()

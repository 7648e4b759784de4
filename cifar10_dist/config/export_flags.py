"""export's flags, declared once as plain data (no torch: ``export --help`` and a mistyped flag answer at once):
the file, the format and the output (``EXPORT_FLAGS``), and the int8 quantization's settings (``Quantization``),
with the calibration's numbers that ``quantizing`` works with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cifar10_dist.config.commands import flag, flags_of
from cifar10_dist.config.export_formats import FORMATS, NAMES
from cifar10_dist.errors import UserError

CALIBRATION_IMAGES = 300  # training images whose activations set the int8 ranges (ORT's docs: a few hundred)
MIN_AGREEMENT = 0.98  # of the test images, the int8 model's top-1 must equal the fp32 model's on at least this share
CHOICE_IMAGES = 1000  # other training images, held out from the calibration, that choose how to calibrate
METHODS = ("minmax", "percentile", "entropy")  # ORT's calibration methods (Percentile: its 99.999th)


@dataclass(frozen=True)
class ExportFlags:
    """export's flags for the file (``Quantization``'s for int8)."""

    checkpoint: str | None = flag(
        None, "training_checkpoint_*.pt, best_model_*.pt, or a run folder (its best model)", shown="FILE", required=True
    )
    format: str | None = flag(
        None, "one of:\n" + "\n".join(f"{f.name}: {f.help}" for f in FORMATS.values()), shown=NAMES, required=True
    )
    output: str | None = flag(
        None, f"file to write (default: next to the checkpoint, {'/'.join(f.suffix for f in FORMATS.values())})"
    )
    raw_weights: bool = flag(False, "a run with ema_decay: use the trained weights, not the EMA (training checkpoints)")


EXPORT_FLAGS = flags_of(ExportFlags)


@dataclass(frozen=True)
class Quantization:
    """``quantize=int8`` and its settings (deployment.quantizing), export's flags; ``calibration``: uint8 images to
    calibrate on instead of a choice of training images (a test's way to quantize badly on purpose)."""

    kind: str | None = flag(
        None,
        "int8 (format=onnx): ONNX Runtime's static quantization, int8 weights and 8-bit "
        "activations calibrated on training images; its test accuracy and top-1 agreement with "
        "the fp32 model are printed, and below min_agreement nothing is written (default file: "
        "CHECKPOINT.int8.onnx; predict --checkpoint=FILE.onnx runs it)",
        name="quantize",
        shown="int8",
    )
    calibration_images: int = flag(CALIBRATION_IMAGES, "training images that calibrate the int8 activations")
    min_agreement: float = flag(
        MIN_AGREEMENT,
        "the share of test images whose int8 top-1 must equal "
        "the fp32 model's (a tie between classes counts as a difference)",
    )
    calibration_method: str = flag(
        "auto",
        "how the int8 activation ranges are set: auto (MinMax, Percentile and "
        "Entropy, weights per channel or per tensor: the one whose top-1 agrees most "
        f"often with the fp32 model's on {CHOICE_IMAGES} other training "
        f"images), or {', '.join(METHODS[:-1])} or {METHODS[-1]}",
    )
    calibration: Any = None  # a uint8 tensor (N, 3, H, W)

    def check(self, format: str) -> None:
        if self.kind is None:
            return
        if self.kind != "int8":
            raise UserError(f"quantize={self.kind!r} is not accepted: int8 (ONNX Runtime's static quantization)")
        if format != "onnx":
            raise UserError(f"quantize=int8 is for format=onnx (ONNX Runtime's static quantization), not {format}")
        if (
            isinstance(self.calibration_images, bool)
            or not isinstance(self.calibration_images, int)
            or self.calibration_images < 1
        ):
            raise UserError(f"calibration_images={self.calibration_images!r} must be a whole number >= 1")
        if not 0 < self.min_agreement <= 1:
            raise UserError(f"min_agreement={self.min_agreement} must be in (0, 1], e.g. 0.98")
        check_calibration_method(self.calibration_method)


def check_calibration_method(method: str) -> None:
    """A one-line UserError unless ``method`` is auto or one of METHODS."""
    if method != "auto" and method not in METHODS:
        raise UserError(
            f"calibration_method={method!r} is not accepted: auto (choose on held-out training images) "
            f"or one of {', '.join(METHODS)}"
        )


@dataclass(frozen=True)
class Calibration:
    """How the int8 model is made: ORT's calibration ``method`` for the activation ranges, and weight scales per
    output channel or per tensor."""

    method: str = "minmax"
    per_channel: bool = True

    @property
    def name(self) -> str:
        return self.method + ("" if self.per_channel else " per-tensor")


CANDIDATES = tuple(Calibration(method, per_channel) for method in METHODS for per_channel in (True, False))


def candidates_for(method: str) -> tuple[Calibration, ...]:
    """The calibrations an export tries: all CANDIDATES for ``auto``, else that method's two (per channel, per
    tensor); a one-line UserError for another word."""
    check_calibration_method(method)
    if method == "auto":
        return CANDIDATES
    return tuple(candidate for candidate in CANDIDATES if candidate.method == method)

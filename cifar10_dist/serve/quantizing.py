"""int8 ONNX (``export --format=onnx --quantize=int8``): ONNX Runtime's static quantization of the verified fp32
ONNX export (QDQ format, signed int8 weights per output channel, unsigned 8-bit activations whose ranges are
calibrated on N training images, MinMax: ORT's fast U8S8 kernels on x86; signed activations ran far slower on
the Zen 4 EPYC, benchmarks.int8 measures both), then checked on the whole test set of the data the model was trained on: the test
accuracy of the fp32 and the int8 model and how often their top-1 classes agree. Below ``min_agreement`` (default
MIN_AGREEMENT) the export is refused in one line and nothing is written. ``OnnxModel`` runs an exported file for
``predict``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cifar10_dist.config import INHERITED_BY_EVALUATE, load_config
from cifar10_dist.data import augmentation, run_data
from cifar10_dist.data.records import DatasetInfo
from cifar10_dist.errors import UserError

CALIBRATION_IMAGES = 300  # training images whose activations set the int8 ranges (ORT's docs: a few hundred)
MIN_AGREEMENT = 0.98  # of the test images, the int8 model's top-1 must equal the fp32 model's on at least this share
SEED = 0  # which training images calibrate
BATCH = 256


class OnnxModel:
    """An ONNX file on ONNX Runtime (CPU), called like a model: normalised float32 images in, logits out."""

    def __init__(self, path: str | Path) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        array = images.detach().cpu().float().contiguous().numpy()
        return torch.from_numpy(self.session.run(None, {self.input: array})[0])

    def eval(self) -> OnnxModel:
        return self


def onnx_metadata(path: str | Path) -> dict[str, Any]:
    """What an export of ours recorded in the file (classes, normalisation, sizes), or a UserError."""
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:
        raise UserError(f"'{path}' is not an ONNX file ONNX can read: {error}") from error
    props = {prop.key: prop.value for prop in proto.metadata_props}
    if "cifar10_dist" not in props:
        raise UserError(f"'{path}' was not exported by cifar10-dist export: it does not say its classes and "
                        "normalisation (export it with cifar10-dist export --format=onnx)")
    return json.loads(props["cifar10_dist"])


def info_of(metadata: dict[str, Any]) -> DatasetInfo:
    size = int(metadata["input"]["shape"][-1])
    return DatasetInfo(tuple(metadata["classes"]), tuple(metadata["mean"]), tuple(metadata["std"]), size,
                       float(metadata.get("crop_fraction", 1.0)), metadata.get("stored_size"))


def trained_data(config: dict[str, Any]) -> Any:
    """The data a checkpoint's model was trained on (its recorded dataset keys): the LoadedData."""
    recorded = {key: config[key] for key in INHERITED_BY_EVALUATE if key in config}
    return run_data.load_datasets(load_config(None, **recorded))


def model_inputs(images: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """uint8 images as stored -> the model's normalised float32 evaluation view."""
    return augmentation.normalize(augmentation.eval_view(images, info.image_size, info.crop_fraction), info.mean,
                                  info.std)


def logits_of(model: Any, images: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    return torch.cat([model(model_inputs(images[start:start + BATCH], info)) for start in range(0, len(images), BATCH)])


def calibration_images(train: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` training images, a fixed random choice (SEED)."""
    chosen = torch.randperm(len(train), generator=torch.Generator().manual_seed(SEED))[:count]
    return train[chosen.sort().values]


def quantize(fp32: Path, int8: Path, calibration: torch.Tensor, info: DatasetInfo, work: Path,
             signed_activations: bool = False) -> None:
    """Static int8 quantization of ``fp32`` into ``int8`` (ORT's pre-processing first, as its docs advise);
    ``signed_activations``: int8 activations instead of uint8 (S8S8: what benchmarks.int8 compares)."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"images": model_inputs(calibration[start:start + 32], info).numpy()}
                                 for start in range(0, len(calibration), 32)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    prepared = work / "prepared.onnx"
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    quantize_static(str(prepared), str(int8), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8 if signed_activations else QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)


def compared_on_test(fp32: Path, int8: Path, test: Any, info: DatasetInfo) -> dict[str, Any]:
    """Test accuracy of both files and their top-1 agreement, over every test image."""
    labels = test.labels.cpu()
    full, low = (logits_of(OnnxModel(path), test.images.cpu(), info).argmax(1) for path in (fp32, int8))
    return {"test_images": len(labels), "accuracy_fp32": float((full == labels).float().mean()),
            "accuracy_int8": float((low == labels).float().mean()),
            "agreement": float((full == low).float().mean())}


def check_agreement(found: dict[str, Any], min_agreement: float, path: Path) -> None:
    if found["agreement"] < min_agreement:
        raise UserError(f"int8 export refused: its top-1 class agrees with the fp32 model's on {found['agreement']:.2%} "
                        f"of the {found['test_images']} test images, below min_agreement={min_agreement:g} (test "
                        f"accuracy fp32 {found['accuracy_fp32']:.4f}, int8 {found['accuracy_int8']:.4f}); nothing "
                        f"written to {path}: calibrate on more images (--calibration_images) or ship the fp32 model")

"""int8 ONNX (``export --format=onnx --quantize=int8``): ONNX Runtime's static quantization of the verified fp32
ONNX export (QDQ format, signed int8 weights, unsigned 8-bit activations: ORT's fast U8S8 kernels on x86; signed
activations ran far slower on the Zen 4 EPYC, benchmarks.int8 measures both).

The classifier (the last layer with weights) stays fp32. The activation ranges are calibrated on N training images.
How (MinMax, Percentile or Entropy; weights per output channel or per tensor) is chosen, by default, among the
planner's candidates (config.export_flags.CANDIDATES) on other training images, held out from the calibration (or on
the run's validation images, where it had a val split): the one whose top-1 class agrees with the fp32 model's most
often there. The test set is used once, on the chosen model, to report the test accuracy of both and their
agreement; below ``min_agreement`` (default MIN_AGREEMENT) the export is refused in one line and nothing is written.
An int8 model whose largest logit is tied between classes does not agree (nor is it correct): it has not decided.
``OnnxModel`` runs an exported file for ``predict``."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from cifar10_dist.config import INHERITED_BY_EVALUATE, Config, load_config
from cifar10_dist.config.export_flags import (  # noqa: F401 - declared with export's flags
    CALIBRATION_IMAGES,
    CHOICE_IMAGES,
    METHODS,
    MIN_AGREEMENT,
    Calibration,
    check_calibration_method,
)
from cifar10_dist.data import augmentation, loaders, run_data
from cifar10_dist.data.datasets import DatasetInfo
from cifar10_dist.errors import UserError

WORTH_ACCEPTING = 0.9  # a refusal offers --min_agreement=<what was measured> only from this agreement up
SEED = 0  # which training images calibrate and choose
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
        raise UserError(
            f"'{path}' was not exported by cifar10-dist export: it does not say its classes and "
            "normalisation (export it with cifar10-dist export --format=onnx)"
        )
    return json.loads(props["cifar10_dist"])


def info_of(metadata: dict[str, Any]) -> DatasetInfo:
    size = int(metadata["input"]["shape"][-1])
    return DatasetInfo(
        tuple(metadata["classes"]),
        tuple(metadata["mean"]),
        tuple(metadata["std"]),
        size,
        float(metadata.get("crop_fraction", 1.0)),
        metadata.get("stored_size"),
    )


def config_of(metadata: dict[str, Any]) -> Config:
    """The config an exported file stands for: its model, evaluated on one view (an ONNX file holds no more)."""
    return Config.from_record({"model": metadata["model"], "tta": 0})


def provenance_of(metadata: dict[str, Any]) -> dict[str, Any]:
    """The provenance the export copied from its checkpoint (empty where the file has none)."""
    return dict(metadata.get("provenance") or {})


def trained_data(config: Config) -> Any:
    """The data a checkpoint's model was trained on (its recorded dataset keys): the LoadedData."""
    return run_data.load_datasets(load_config(None, **{key: getattr(config, key) for key in INHERITED_BY_EVALUATE}))


def model_inputs(images: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """uint8 images as stored -> the model's normalised float32 evaluation view."""
    return augmentation.normalize(
        augmentation.eval_view(images, info.image_size, info.crop_fraction), info.mean, info.std
    )


def logits_of(model: Any, images: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    return torch.cat(
        [model(model_inputs(images[start : start + BATCH], info)) for start in range(0, len(images), BATCH)]
    )


def held_out_split(train: torch.Tensor, calibrating: int, choosing: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two disjoint fixed random choices (SEED) of training images: ``calibrating`` to set the int8 ranges, and up
    to ``choosing`` of the others to choose the calibration on (fewer when the training images run out)."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(SEED))
    first, rest = order[:calibrating], order[calibrating : calibrating + choosing]
    return train[first.sort().values], train[rest.sort().values]


def calibration_and_choice(
    data: Any, config: Config, calibrating: int, choosing: int
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The training images that calibrate, the images that choose the calibration and what they are: the run's
    validation images where it had them (a val/ folder, or the val_split its config records: never trained on),
    else training images the calibration does not use."""
    val = data.val
    train = data.train
    if val is None and config.val_split > 0:
        held = loaders.hold_out(data.train, config.val_split, config.val_seed)
        train, val = held.train, held.val
    if val is not None and len(val):
        calibration = held_out_split(train.images, calibrating, 0)[0]
        return calibration, held_out_split(val.images, choosing, 0)[0], "validation"
    calibration, rest = held_out_split(train.images, calibrating, choosing)
    return calibration, rest, "held-out training"


def prepared(fp32: Path, work: Path) -> Path:
    """ORT's pre-processing of the fp32 graph (shape inference, folding), as its docs advise before quantizing."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    path = work / f"{fp32.stem}.prepared.onnx"
    if not path.exists():
        quant_pre_process(str(fp32), str(path), skip_symbolic_shape=True)
    return path


def quantize(
    fp32: Path,
    int8: Path,
    calibration: torch.Tensor,
    info: DatasetInfo,
    work: Path,
    signed_activations: bool = False,
    how: Calibration = Calibration(),
) -> None:
    """Static int8 quantization of ``fp32`` into ``int8``, its activation ranges calibrated on ``calibration``
    (uint8 images) ``how``; ``signed_activations``: int8 activations instead of uint8 (S8S8: what
    benchmarks.int8 compares)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    # batches of one size: ORT's histogram calibrators (Percentile, Entropy) stack them
    size = max(divisor for divisor in range(1, 33) if len(calibration) % divisor == 0)

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(
                [
                    {"images": model_inputs(calibration[start : start + size], info).numpy()}
                    for start in range(0, len(calibration), size)
                ]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    methods = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
    }
    # the histogram calibrators print their progress; per-channel quantization warns on the root logger for every
    # 1-d weight (a BatchNorm's, "Axis 1 is out-of-range"), which it then quantizes per tensor as it should
    graph = prepared(fp32, work)
    with contextlib.redirect_stdout(io.StringIO()), quiet_root_warnings():
        quantize_static(
            str(graph),
            str(int8),
            Batches(),
            quant_format=QuantFormat.QDQ,
            per_channel=how.per_channel,
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QInt8 if signed_activations else QuantType.QUInt8,
            calibrate_method=methods[how.method],
            nodes_to_exclude=classifier_nodes(graph),
        )


def classifier_nodes(graph: Path) -> list[str]:
    """The last layer with weights (the classifier), kept in fp32: its outputs are the logits, whose small
    differences decide the top-1 class, and it is a sliver of the compute (the default recipe's ResNet-18, 2-core
    Zen 5: test agreement 94.4% -> 97.3%, benchmarks.int8_calibration)."""
    import onnx

    layers = [
        node.name
        for node in onnx.load(str(graph), load_external_data=False).graph.node
        if node.op_type in ("Gemm", "MatMul", "Conv")
    ]
    return layers[-1:]


@contextlib.contextmanager
def quiet_root_warnings() -> Iterator[None]:
    """ONNX Runtime's quantization tools log to the root logger: its warnings held back meanwhile."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def decided_agreement(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per image, whether ``logits`` put the class ``reference`` (class indices) strictly above every other
    class: a tie at the top is no agreement."""
    chosen = logits.gather(1, reference[:, None]).squeeze(1)
    others = logits.scatter(1, reference[:, None], float("-inf")).amax(1)
    return chosen > others


def choose(
    fp32: Path,
    calibration: torch.Tensor,
    choosing: torch.Tensor,
    info: DatasetInfo,
    work: Path,
    candidates: tuple[Calibration, ...],
) -> tuple[Path, Calibration, list[dict[str, Any]]]:
    """Quantize with each candidate calibration and keep the one whose top-1 agrees with the fp32 model's on the
    most ``choosing`` images (the first of equals: CANDIDATES' order); its file, itself and every candidate's
    agreement. One candidate is taken without a choice."""
    if len(candidates) == 1 or not len(choosing):
        path = work / "model.int8.onnx"
        quantize(fp32, path, calibration, info, work, how=candidates[0])
        return path, candidates[0], []
    reference = logits_of(OnnxModel(fp32), choosing, info).argmax(1)
    table, paths = [], []
    for index, candidate in enumerate(candidates):
        paths.append(work / f"candidate{index}.int8.onnx")
        quantize(fp32, paths[-1], calibration, info, work, how=candidate)
        agreed = decided_agreement(reference, logits_of(OnnxModel(paths[-1]), choosing, info))
        table.append({"calibration": candidate.name, "agreement": float(agreed.float().mean())})
    best = max(range(len(table)), key=lambda index: float(table[index]["agreement"]))  # type: ignore[arg-type]
    return paths[best], candidates[best], table


def compared_on_test(fp32: Path, int8: Path, test: Any, info: DatasetInfo) -> dict[str, Any]:
    """Test accuracy of both files and their top-1 agreement, over every test image (ties: neither)."""
    labels = test.labels.cpu()
    full, low = (logits_of(OnnxModel(path), test.images.cpu(), info) for path in (fp32, int8))
    return {
        "test_images": len(labels),
        "accuracy_fp32": float(decided_agreement(labels, full).float().mean()),
        "accuracy_int8": float(decided_agreement(labels, low).float().mean()),
        "agreement": float(decided_agreement(full.argmax(1), low).float().mean()),
    }


def accepted_floor(agreement: float) -> float:
    """The largest min_agreement of three decimals that ``agreement`` meets."""
    return math.floor(agreement * 1000) / 1000


def check_agreement(found: dict[str, Any], min_agreement: float, path: Path) -> None:
    if found["agreement"] >= min_agreement:
        return
    tried = len(found["candidates"]) or 1
    choice = (
        f"the best of {tried} calibrations on {found['chosen_on']} {found['chosen_from']} images: " if tried > 1 else ""
    )
    floor = accepted_floor(found["agreement"])
    accept = f", or accept this agreement with --min_agreement={floor:g}" if floor >= WORTH_ACCEPTING else ""
    raise UserError(
        f"int8 export refused: its top-1 class ({choice}{found['calibration']}) agrees with the fp32 "
        f"model's on {found['agreement']:.2%} of the {found['test_images']} test images, below "
        f"min_agreement={min_agreement:g} (test accuracy fp32 {found['accuracy_fp32']:.4f}, int8 "
        f"{found['accuracy_int8']:.4f}); nothing written to {path}: ship the fp32 model (--format=onnx "
        f"without --quantize){accept}"
    )

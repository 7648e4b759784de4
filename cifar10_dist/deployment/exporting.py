"""Taking a trained model out: safetensors weights, a torch.export program (pt2), an ONNX graph, or a TorchScript
module (deprecated by torch), each verified.

Every form maps normalised float32 images (N, 3, S, S) to logits, exactly as the trained ``nn.Module`` does;
a JSON sidecar (``<file>.json``) and the file's own metadata carry the model reference, class names, the
normalisation mean/std and provenance. Each export is checked by loading it back with its own runtime (safetensors,
``torch.jit.load``, ``onnx.checker`` and ONNX Runtime) against the PyTorch model on a batch of images, and the file
appears only when that check passed (it is written under a temporary name, then renamed).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from cifar10_dist import models, sources
from cifar10_dist.config import Config
from cifar10_dist.config.export_flags import EXPORT_FLAGS, Quantization  # noqa: F401 - export's flags
from cifar10_dist.config.export_formats import FORMATS, INSTALL_HINT
from cifar10_dist.data import augmentation, datasets
from cifar10_dist.data.datasets import DatasetInfo
from cifar10_dist.data.synthetic import make_synthetic
from cifar10_dist.deployment import inference, quantizing
from cifar10_dist.errors import OutputNotWritable, UserError
from cifar10_dist.outputs import files
from cifar10_dist.results import ExportResult
from cifar10_dist.training.setup import plan

# The largest logit difference accepted between an exported form and the PyTorch model, as a fraction of the
# logits' scale (their largest absolute value, at least 1): fp32 kernels of other runtimes and CPUs sum in another
# order, and their rounding grows with the values (seen: 1.2e-5 of the scale on an AVX-512 Xeon, 3e-6 on AVX2)
RELATIVE_TOLERANCE = 1e-3
CHECK_IMAGES = 64  # images the exported form and the PyTorch model are compared on


def require(format: str) -> None:
    """The packages an export format needs, or a one-line UserError saying how to install them."""
    for module in FORMATS[format].needs:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise UserError(
                f"format={format} needs the {module} package, which is not installed: {INSTALL_HINT}"
            ) from error


def export(
    checkpoint: str | Path,
    format: str,
    output: str | Path | None = None,
    raw_weights: bool = False,
    quantization: Quantization = Quantization(),
) -> ExportResult:
    """Export a checkpoint's model to ``format`` at ``output`` (default: next to the checkpoint), verified; the
    EMA weights of a run with ema_decay unless ``raw_weights``; int8 ONNX with ``quantization``."""
    if format not in FORMATS:
        raise UserError(f"format={format!r} is not accepted: choose one of {', '.join(FORMATS)}")
    quantization.check(format)
    require(format)
    trained = inference.load_trained_model(checkpoint, device="cpu", raw_weights=raw_weights)
    chosen = FORMATS[format]
    suffix = ".int8" + chosen.suffix if quantization.kind else chosen.suffix
    path = Path(output) if output is not None else Path(checkpoint).with_suffix(suffix)
    if path.is_dir():
        raise UserError(f"output='{path}' is a folder: give a file name, e.g. {path / ('model' + chosen.suffix)}")
    if not path.parent.is_dir():
        raise UserError(f"output='{path}': the folder {path.parent} does not exist")
    metadata = describe(trained)
    images, source = check_images(trained.config, trained.info)
    found: dict[str, Any] = {}
    if quantization.kind:
        found = write_int8_onnx(trained, path, metadata, images, quantization)
        metadata = {**metadata, "quantization": found["quantization"]}
    else:
        exporter = globals()[chosen.writer]  # the format's writer, below
        files.write_file(path, lambda temporary: found.update(exporter(trained, temporary, metadata, images)))
    sidecar = path.with_name(path.name + ".json")
    try:
        files.write_json(sidecar, {**metadata, "format": format, "file": path.name})
    except OutputNotWritable as error:  # the exported file without its sidecar is not written either
        path.unlink(missing_ok=True)
        raise OutputNotWritable(
            f"{error}; {path.name}, written before it, was removed (a model file without its "
            "sidecar is not one of ours)"
        ) from error
    return ExportResult(format=format, path=str(path), sidecar=str(sidecar), images=source, **found)


def write_int8_onnx(
    trained: inference.TrainedModel,
    path: Path,
    metadata: dict[str, Any],
    images: torch.Tensor,
    quantization: Quantization,
) -> dict[str, Any]:
    """The fp32 ONNX export (verified against PyTorch), quantized to int8 and checked against it on the test set;
    written to ``path`` only when the agreement holds (deployment.quantizing)."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="cifar10_dist-int8-") as folder:
        work = Path(folder)
        fp32 = work / "model.onnx"
        found = write_onnx(trained, fp32, metadata, images)
        data = quantizing.trained_data(trained.config)
        calibration, choosing, chosen_from = quantizing.calibration_and_choice(
            data, trained.config, quantization.calibration_images, quantizing.CHOICE_IMAGES
        )
        if quantization.calibration is not None:
            calibration = quantization.calibration
        candidates = plan.calibration_candidates(quantization.calibration_method)
        int8, how, table = quantizing.choose(fp32, calibration, choosing, trained.info, work, candidates)
        compared = quantizing.compared_on_test(fp32, int8, data.test, trained.info)
        described = {
            "method": "ONNX Runtime static quantization: QDQ, int8 weights, uint8 activations",
            "calibration": how.name,
            "calibration_images": len(calibration),
            "chosen_on": len(choosing) if table else 0,
            "chosen_from": chosen_from,
            "candidates": table,
            "min_agreement": quantization.min_agreement,
            **compared,
        }
        quantizing.check_agreement(described, quantization.min_agreement, path)
        proto = onnx.load(str(int8))
        del proto.metadata_props[:]
        for key, value in {
            "cifar10_dist": json.dumps({**metadata, "quantization": described}),
            "classes": json.dumps(metadata["classes"]),
            "mean": json.dumps(metadata["mean"]),
            "std": json.dumps(metadata["std"]),
        }.items():
            proto.metadata_props.add(key=key, value=value)
        files.write_file(path, lambda temporary: onnx.save(proto, str(temporary)))
    return {**found, "quantization": described}


def resize_rule(info: DatasetInfo) -> str:
    """How an image becomes the model's input square, in words (with crop_fraction, the central part of it)."""
    if info.crop_fraction == 1 and info.stored_size == info.image_size:
        return "shorter side to the size (bilinear), then the centre square"
    side = round(info.stored_size * info.crop_fraction)
    return (
        f"shorter side to {info.stored_size} (bilinear), then the centre {info.stored_size}x{info.stored_size}, "
        f"then its centre {side}x{side} (crop_fraction {info.crop_fraction:g})"
        + (f" resized to {info.image_size}x{info.image_size}" if side != info.image_size else "")
    )


def describe(trained: inference.TrainedModel) -> dict[str, Any]:
    """What a user of the exported model needs: input layout and normalisation, class names, where it came from."""
    return {
        "model": trained.config.model,
        "model_kwargs": trained.config.model_kwargs,
        "classes": list(trained.classes),
        "input": {
            "shape": ["N", 3, trained.info.image_size, trained.info.image_size],
            "dtype": "float32",
            "layout": "RGB, channels first",
            "normalisation": "(pixel / 255 - mean) / std per channel, pixel in 0..255",
            "resize": resize_rule(trained.info),
        },
        "mean": list(trained.info.mean),
        "std": list(trained.info.std),
        "crop_fraction": trained.info.crop_fraction,
        "stored_size": trained.info.stored_size,
        "output": "logits (N, classes); softmax gives probabilities"
        if trained.temperature is None
        else f"logits (N, classes) already divided by the temperature {trained.temperature:.6g} "
        "(calibrate=temperature; safetensors holds the raw weights: divide by it yourself); softmax gives "
        "calibrated probabilities",
        "temperature": trained.temperature,
        "checkpoint": str(trained.checkpoint),
        "provenance": trained.provenance,
        "torch": str(torch.__version__),
    }


def check_images(config: Config, info: DatasetInfo) -> tuple[torch.Tensor, str]:
    """Normalised images for the check (with the model's normalisation): the first test images of the data the
    model was trained on when that is still readable (its source says), else synthetic images of its size."""
    known = config.dataset in sources.SOURCES  # (a checkpoint of a source this installation lacks: synthetic ones)
    found = datasets.implementation(config.dataset).sample_images(config, CHECK_IMAGES) if known else None
    images, described = (
        found
        if found is not None
        else (make_synthetic(1, CHECK_IMAGES, seed=0)[1].images, f"{CHECK_IMAGES} synthetic images")
    )
    images = torch.as_tensor(images)
    if images.shape[-1] not in (info.image_size, info.stored_size):  # synthetic check images: 32 px
        images = torch.nn.functional.interpolate(images.float(), size=info.stored_size).to(torch.uint8)
    view = augmentation.eval_view(images, info.image_size, info.crop_fraction)
    return augmentation.normalize(view, info.mean, info.std), described


def compare(reference: torch.Tensor, exported: torch.Tensor) -> dict[str, Any]:
    """How far the exported form's logits are from the model's. ``agrees``: within RELATIVE_TOLERANCE of the
    logits' scale, and the same top-1 class on every image whose two best classes are further apart than twice
    the accepted difference (a closer tie may flip within it)."""
    difference = float((reference - exported).abs().max())
    scale = max(1.0, float(reference.abs().max()))
    same = reference.argmax(1) == exported.argmax(1)
    best_two = reference.topk(min(2, reference.shape[1]), dim=1).values
    decided = best_two[:, 0] - best_two[:, -1] > 2 * RELATIVE_TOLERANCE * scale
    return {
        "max_abs_difference": difference,
        "relative_difference": difference / scale,
        "logit_scale": scale,
        "accepted_relative_difference": RELATIVE_TOLERANCE,
        "same_top1": int(same.sum()),
        "num_images": len(reference),
        "agrees": difference <= RELATIVE_TOLERANCE * scale and bool(same[decided].all()),
    }


@torch.no_grad()
def logits(model: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor) -> torch.Tensor:
    return model(images).float()


def write_safetensors(
    trained: inference.TrainedModel, path: Path, metadata: dict[str, Any], images: torch.Tensor
) -> dict[str, Any]:
    """The state dict (no pickle), loaded back into a freshly built model to compare tensors and logits."""
    from safetensors.torch import load_model, save_model

    model = trained.model
    save_model(model, str(path), metadata={"cifar10_dist": json.dumps(metadata)})
    rebuilt = models.build_model(trained.config.model, trained.config.model_kwargs, len(trained.classes)).eval()
    load_model(rebuilt, str(path), strict=True)
    state, loaded = model.state_dict(), rebuilt.state_dict()
    equal = sum(torch.equal(state[key], loaded[key]) for key in state)
    if equal != len(state):
        raise UserError(
            f"safetensors export of {trained.checkpoint}: only {equal} of {len(state)} tensors read back "
            "equal; no file written"
        )
    return {
        **checked(trained, "safetensors", compare(logits(model, images), logits(rebuilt, images))),
        "tensors_equal": equal,
    }


def write_pt2(
    trained: inference.TrainedModel, path: Path, metadata: dict[str, Any], images: torch.Tensor
) -> dict[str, Any]:
    """``torch.export`` of the model in eval mode with a dynamic batch dimension (an ExportedProgram, torch's
    supported form for deployment), saved with the metadata as ``metadata.json``, loaded back with
    ``torch.export.load`` and run against the PyTorch model."""
    try:
        program = torch.export.export(trained.scaled, (images[:2],), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    except Exception as error:
        raise cannot_export(trained, "pt2", error) from error
    archive = io.BytesIO()  # the file has a temporary name until checked, and torch wants .pt2 names or buffers
    torch.export.save(program, archive, extra_files={"metadata.json": json.dumps(metadata)})
    path.write_bytes(archive.getvalue())
    loaded = torch.export.load(io.BytesIO(path.read_bytes()))
    return checked(trained, "pt2", compare(logits(trained.scaled, images), logits(loaded.module(), images)))


def write_torchscript(
    trained: inference.TrainedModel, path: Path, metadata: dict[str, Any], images: torch.Tensor
) -> dict[str, Any]:
    """A traced module in eval mode. Deprecated: torch deprecates TorchScript (torch 2.14 warns on
    ``torch.jit.load``: "Please switch to torch.export"); kept for libtorch users, pt2 is its successor."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            traced = torch.jit.trace(trained.scaled, images[:2])
        except Exception as error:
            raise cannot_export(trained, "torchscript", error) from error
        torch.jit.save(traced, str(path), _extra_files={"metadata.json": json.dumps(metadata)})
        loaded = torch.jit.load(str(path), map_location="cpu")
    return checked(trained, "TorchScript", compare(logits(trained.scaled, images), logits(loaded, images)))


def write_onnx(
    trained: inference.TrainedModel, path: Path, metadata: dict[str, Any], images: torch.Tensor
) -> dict[str, Any]:
    """torch.onnx (dynamo) with a dynamic batch dimension and the metadata as metadata_props; checked by
    onnx.checker, then run by ONNX Runtime (CPU) against PyTorch."""
    import onnx
    import onnxruntime

    messages = io.StringIO()  # torch.onnx prints its progress
    with contextlib.redirect_stdout(messages), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                trained.scaled,
                (images[:2],),
                None,
                dynamo=True,
                input_names=["images"],
                output_names=["logits"],
                dynamic_shapes=({0: torch.export.Dim.DYNAMIC},),
            )
            assert program is not None  # (dynamo=True returns the program)
            proto = program.model_proto
        except Exception as error:
            raise cannot_export(trained, "onnx", error) from error
    for key, value in {
        "cifar10_dist": json.dumps(metadata),
        "classes": json.dumps(metadata["classes"]),
        "mean": json.dumps(metadata["mean"]),
        "std": json.dumps(metadata["std"]),
    }.items():
        proto.metadata_props.add(key=key, value=value)
    onnx.save(proto, str(path))
    onnx.checker.check_model(str(path), full_check=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return checked(
        trained,
        "ONNX",
        compare(
            logits(trained.scaled, images), torch.from_numpy(session.run(["logits"], {"images": images.numpy()})[0])
        ),
    )


def checked(trained: inference.TrainedModel, form: str, result: dict[str, Any]) -> dict[str, Any]:
    """The comparison, or a UserError naming both numbers when the exported form computes something else."""
    if not result["agrees"]:
        raise UserError(
            f"the {form} export of {trained.checkpoint} does not compute what the model computes: "
            f"{describe_difference(result)}, same top-1 on {result['same_top1']} of {result['num_images']} images; "
            "no file written"
        )
    return {key: value for key, value in result.items() if key != "agrees"}


def describe_difference(result: dict[str, Any]) -> str:
    """'logits max abs difference 1.22e-04 (1.2e-05 of their scale 10.1; accepted: 1e-03 of it)'."""
    return (
        f"logits max abs difference {result['max_abs_difference']:.2e} ({result['relative_difference']:.1e} "
        f"of their scale {result['logit_scale']:.3g}; accepted: {RELATIVE_TOLERANCE:.0e} of it)"
    )


def cannot_export(trained: inference.TrainedModel, format: str, error: BaseException) -> UserError:
    return UserError(f"model={trained.config.model} cannot be exported to {format}: {failure_reason(error)}")


def failure_reason(error: BaseException) -> str:
    """The operator or reason an exporter gives, in one line (its messages run to pages)."""
    text = str(error)
    operator = re.search(r"No ONNX function found for <OpOverload\(op='([^']+)'", text)
    if operator:
        return f"operator {operator.group(1)} has no ONNX conversion in torch {torch.__version__}"
    summary = re.search(r"## Exception summary\s+<class '([^']+)'>: (.+)", text)
    if summary:
        return f"{summary.group(1).rsplit('.', 1)[-1]}: {summary.group(2).strip()[:300]}"
    first = " ".join(text.split("\n\n")[0].split())
    return f"{type(error).__name__}: {first[:300]}" if first else type(error).__name__

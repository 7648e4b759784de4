"""int8 against fp32 in ONNX Runtime on this CPU: images per second of cifar_resnet18 (32 px) and resnet18
(224 px) as our export writes them (the fp32 ONNX graph, and its static int8 quantization by
``deployment.quantizing.quantize``, with its unsigned activations and, for comparison, signed ones), and, for a trained
model, the test accuracy of both and their agreement.

    python -m benchmarks.int8 [--checkpoint=FILE] [--rounds=5] [--json=PATH]

Speed: random weights (speed does not depend on them) and random calibration images; each model timed in
``--rounds`` interleaved rounds (fp32, int8, fp32, ...) of ``steps`` batches after a warm-up, ORT's default
threads; the median round is reported. ``--checkpoint``: a trained model of ours, exported with
``export --quantize=int8`` through the API (its test accuracy and agreement are the export's own check).
The CPU's int8 instructions (AVX512-VNNI, AVX-VNNI, AMX-INT8) are recorded: they decide what int8 gains.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import records
from cifar10_dist import api, models
from cifar10_dist.data.datasets import DatasetInfo
from cifar10_dist.deployment import quantizing

SHAPES = {"cifar_resnet18": (32, 64, 20), "resnet18": (224, 16, 10)}  # image size, batch, batches per round


def export_fp32(name: str, size: int, path: Path) -> None:
    model = models.build_model(name).eval()
    program = torch.onnx.export(
        model,
        (torch.randn(2, 3, size, size),),
        None,
        dynamo=True,
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=({0: torch.export.Dim.DYNAMIC},),
    )
    program.model_proto.metadata_props.add(key="cifar10_dist", value="{}")
    import onnx

    onnx.save(program.model_proto, str(path))


def images_per_second(path: Path, size: int, batch: int, steps: int) -> float:
    model = quantizing.OnnxModel(path)
    inputs = torch.randn(batch, 3, size, size)
    model(inputs)  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        model(inputs)
    return batch * steps / (time.perf_counter() - started)


def speeds(name: str, rounds: int, work: Path) -> dict[str, Any]:
    size, batch, steps = SHAPES[name]
    fp32, int8 = work / f"{name}.onnx", work / f"{name}.int8.onnx"
    export_fp32(name, size, fp32)
    calibration = torch.randint(
        0, 256, (64, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    info = DatasetInfo(tuple(str(i) for i in range(10)), image_size=size)
    signed = work / f"{name}.s8s8.onnx"
    quantizing.quantize(fp32, int8, calibration, info, work)
    quantizing.quantize(fp32, signed, calibration, info, work, signed_activations=True)
    timings: dict[str, list[float]] = {"fp32": [], "int8": [], "int8 signed activations": []}
    for _ in range(rounds):
        for kind, path in (("fp32", fp32), ("int8", int8), ("int8 signed activations", signed)):
            timings[kind].append(images_per_second(path, size, batch, steps))
    medians = {kind: statistics.median(values) for kind, values in timings.items()}
    print(
        f"{name} at {size} px, batch {batch}: fp32 {medians['fp32']:.0f} img/s, int8 {medians['int8']:.0f} img/s "
        f"({medians['int8'] / medians['fp32']:.2f}x), with signed activations "
        f"{medians['int8 signed activations']:.0f} img/s",
        flush=True,
    )
    return {
        "image_size": size,
        "batch": batch,
        "rounds": timings,
        "median_images_per_second": medians,
        "int8_over_fp32": medians["int8"] / medians["fp32"],
        "signed_int8_over_fp32": medians["int8 signed activations"] / medians["fp32"],
        "file_mb": {"fp32": fp32.stat().st_size / 1e6, "int8": int8.stat().st_size / 1e6},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a trained model of ours: its int8 export's accuracy and agreement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", dest="json_path", default="docs/measurements/int8_cpu.json")
    args = parser.parse_args()
    machine = records.machine("cpu")
    capabilities = {key: value for key, value in torch.cpu.get_capabilities().items() if "vnni" in key or "amx" in key}
    print(f"{machine}, torch {torch.__version__}, int8 instructions: {capabilities}", flush=True)
    with tempfile.TemporaryDirectory(prefix="benchmark-int8-") as temporary:
        result: dict[str, Any] = {"speed": {name: speeds(name, args.rounds, Path(temporary)) for name in SHAPES}}
        if args.checkpoint:
            exported = api.export(args.checkpoint, "onnx", Path(temporary) / "trained.int8.onnx", quantize="int8")
            result["trained"] = {"checkpoint": args.checkpoint, **exported.quantization}
            print(f"trained: {exported.quantization}", flush=True)
    import onnxruntime

    records.write(
        Path(args.json_path),
        {
            "machine": machine,
            "hardware": records.hardware_record(),
            "int8_instructions": capabilities,
            "onnxruntime": onnxruntime.__version__,
            "torch": str(torch.__version__),
            **result,
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

"""int8 calibration per trained model: every calibration ``export --quantize=int8`` can choose (MinMax, Percentile,
Entropy; weights per channel or per tensor), with its top-1 agreement with the fp32 model on the held-out training
images that choose and on the test set, the int8 test accuracy, which one the export chooses, and MinMax's
agreement as the calibration grows (300, 1000, 3000 images: "calibrate on more images" was the old advice).

    python -m benchmarks.int8_calibration --checkpoints=NAME=FILE[,NAME=FILE...] [--json=PATH]

The export itself looks at the test set once, for the chosen calibration; this benchmark scores every candidate on
it to show what the choice on training images is worth. A tie at the top counts as disagreement. About 1-3 minutes
per model on 2 CPU cores (cifar-sized ResNet-18: the Entropy calibration's histograms take most of it).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import records
from cifar10_dist import api
from cifar10_dist.deployment import inference, quantizing

GROWING = (300, 1000, 3000)  # MinMax calibration sizes


def agreements(fp32: Path, int8: Path, choosing: torch.Tensor, test: Any, info: Any) -> dict[str, float]:
    reference = quantizing.logits_of(quantizing.OnnxModel(fp32), choosing, info).argmax(1)
    held_out = quantizing.decided_agreement(reference, quantizing.logits_of(quantizing.OnnxModel(int8), choosing, info))
    return {"held_out_agreement": float(held_out.float().mean()), **quantizing.compared_on_test(fp32, int8, test, info)}


def one_model(name: str, checkpoint: str, work: Path) -> dict[str, Any]:
    trained = inference.load_trained_model(checkpoint, device="cpu")
    fp32 = work / f"{name}.onnx"
    api.export(checkpoint, "onnx", fp32)
    data = quantizing.trained_data(trained.config)
    calibration, choosing = quantizing.held_out_split(
        data.train.images, quantizing.CALIBRATION_IMAGES, quantizing.CHOICE_IMAGES
    )
    rows = []
    for index, how in enumerate(quantizing.CANDIDATES):
        started = time.perf_counter()
        int8 = work / f"{name}.{index}.int8.onnx"
        quantizing.quantize(fp32, int8, calibration, trained.info, work / name, how=how)
        rows.append(
            {
                "calibration": how.name,
                "seconds": time.perf_counter() - started,
                **agreements(fp32, int8, choosing, data.test, trained.info),
            }
        )
        print(f"{name} {how.name}: {rows[-1]}", flush=True)
    growing = []
    for count in GROWING:
        images = quantizing.held_out_split(data.train.images, count, 0)[0]
        int8 = work / f"{name}.minmax{count}.int8.onnx"
        quantizing.quantize(fp32, int8, images, trained.info, work / name)
        growing.append(
            {"calibration_images": count, **quantizing.compared_on_test(fp32, int8, data.test, trained.info)}
        )
    exported = api.export(checkpoint, "onnx", work / f"{name}.chosen.int8.onnx", quantize="int8", min_agreement=1e-9)
    found = exported.quantization
    return {
        "checkpoint": checkpoint,
        "model": trained.config.get("model"),
        "candidates": rows,
        "minmax_growing": growing,
        "chosen": found["calibration"],
        "chosen_test_agreement": found["agreement"],
        "accuracy_fp32": found["accuracy_fp32"],
        "accuracy_int8": found["accuracy_int8"],
        "passes_default": found["agreement"] >= quantizing.MIN_AGREEMENT,
        "minmax_test_agreement": rows[0]["agreement"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", required=True, help="NAME=FILE,NAME=FILE: trained models of ours")
    parser.add_argument("--json", dest="json_path", default="docs/measurements/int8_calibration_cpu.json")
    args = parser.parse_args()
    machine = records.machine("cpu")
    print(machine, flush=True)
    models: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="benchmark-int8-calibration-") as temporary:
        for pair in args.checkpoints.split(","):
            name, checkpoint = pair.split("=", 1)
            (Path(temporary) / name).mkdir()
            models[name] = one_model(name, checkpoint, Path(temporary))
            print(
                f"{name}: chose {models[name]['chosen']}, test agreement {models[name]['chosen_test_agreement']:.4f}"
                f" (MinMax {models[name]['minmax_test_agreement']:.4f})",
                flush=True,
            )
    import onnxruntime

    records.write(
        Path(args.json_path),
        {
            "machine": machine,
            "hardware": records.hardware_record(),
            "onnxruntime": onnxruntime.__version__,
            "torch": str(torch.__version__),
            "held_out_images": quantizing.CHOICE_IMAGES,
            "calibration_images": quantizing.CALIBRATION_IMAGES,
            "models": models,
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

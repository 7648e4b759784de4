"""int8 ONNX export: ONNX Runtime's static quantization, its calibration chosen on held-out training images, checked
once on the test set (accuracy of both, top-1 agreement, ties as disagreement), refused with nothing written and
advice that works when badly quantized, and run by predict."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnxruntime
import pytest
import torch

from cifar10_dist import api
from cifar10_dist.config import Config, export_flags
from cifar10_dist.data import cifar, cifar_layouts
from cifar10_dist.deployment import quantizing
from tests.conftest import run_in_this_process
from tests.test_predict_export import write_png_folder


@pytest.fixture(scope="module")
def trained(long_reference) -> Path:
    """simple_cnn (8 channels wide) trained by the LONG reference run on small_dataset (301 test images): its
    best-model file."""
    return sorted(long_reference.glob("best_model_*.pt"))[-1]


def test_int8_export_reports_accuracy_and_agreement_and_loads_in_onnx_runtime(trained, small_dataset, tmp_path):
    output = tmp_path / "model.int8.onnx"
    result = run_in_this_process(
        "export",
        f"--checkpoint={trained}",
        "--format=onnx",
        "--quantize=int8",
        f"--output={output}",
        "--calibration_images=200",
        "--min_agreement=0.9",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    sidecar = json.loads(Path(f"{output}.json").read_text())
    found = sidecar["quantization"]
    assert found["test_images"] == 301 and found["calibration_images"] == 200
    # chosen among the 6 calibrations on the 400 training images the calibration did not use (of small_dataset's 600)
    assert [row["calibration"] for row in found["candidates"]] == [c.name for c in export_flags.CANDIDATES]
    assert found["chosen_on"] == 400
    best = max(found["candidates"], key=lambda row: row["agreement"])
    assert found["calibration"] == best["calibration"]
    assert (
        f"int8 calibrated {found['calibration']} on 200 training images, chosen of 6 on 400 held-out training "
        f"images (agreement {best['agreement']:.2%})"
    ) in result.stdout
    # this 8-channel test model flips about 11 of its 301 low-margin test images (96%): a real one agrees more
    assert found["agreement"] >= 0.9 and abs(found["accuracy_int8"] - found["accuracy_fp32"]) < 0.03
    assert (
        f"int8 on the 301 test images: accuracy {found['accuracy_int8']:.4f} against fp32 "
        f"{found['accuracy_fp32']:.4f}, the same top-1 class on {found['agreement']:.2%} (accepted from "
        "90%)"
    ) in result.stdout
    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    nodes = __import__("onnx").load(str(output)).graph.node
    assert any(node.op_type == "QuantizeLinear" for node in nodes)
    dequantized = {name for node in nodes if node.op_type == "DequantizeLinear" for name in node.output}
    [classifier] = [node for node in nodes if node.op_type in ("Gemm", "MatMul")]
    assert not dequantized & set(classifier.input)  # the classifier computes in fp32 on fp32 inputs
    assert session.get_outputs()[0].shape[1] == 10


def test_a_badly_quantized_model_is_refused_and_nothing_is_written(trained, tmp_path, monkeypatch):
    output = tmp_path / "bad.int8.onnx"
    black = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)  # one black image: activation ranges of nothing
    test_evaluations = []
    compare = quantizing.compared_on_test
    monkeypatch.setattr(quantizing, "compared_on_test", lambda *args: test_evaluations.append(1) or compare(*args))
    with pytest.raises(
        Exception,
        match=r"int8 export refused: its top-1 class \(the best of 6 calibrations on 300 "
        r"held-out training images: .*\) agrees with the fp32 model's on \d+\.\d+% .* "
        r"ship the fp32 model \(--format=onnx without --quantize\)$",
    ):
        api.export(trained, "onnx", output, quantize="int8", calibration=black)
    assert not list(tmp_path.iterdir())
    assert test_evaluations == [1]  # the test set decides nothing but the verdict: used once, on the chosen model


def test_a_refusal_advises_a_min_agreement_that_is_then_accepted(trained, tmp_path):
    output = tmp_path / "model.int8.onnx"
    with pytest.raises(Exception, match="below min_agreement=1") as refused:
        api.export(
            trained,
            "onnx",
            output,
            quantize="int8",
            calibration_images=100,
            min_agreement=1.0,
            calibration_method="minmax",
        )
    assert not list(tmp_path.iterdir())
    advice = re.search(
        r"ship the fp32 model \(--format=onnx without --quantize\), or accept this agreement with "
        r"--min_agreement=([0-9.]+)$",
        str(refused.value),
    )
    assert advice, str(refused.value)
    result = api.export(
        trained,
        "onnx",
        output,
        quantize="int8",
        calibration_images=100,
        min_agreement=float(advice.group(1)),
        calibration_method="minmax",
    )
    assert Path(result.path) == output and output.is_file()
    assert [row["calibration"] for row in result.quantization["candidates"]] == ["minmax", "minmax per-tensor"]
    from cifar10_dist.cli import printing

    assert f"(accepted from {float(advice.group(1)) * 100:g}%)" in printing.int8_summary(result.quantization)


def test_an_int8_tie_at_the_top_is_no_agreement():
    reference = torch.tensor([0, 1, 2])
    logits = torch.tensor([[3.0, 3.0, 1.0], [0.0, 2.0, 1.0], [5.0, 0.0, 5.0]])  # a tie, a clear 1, a tie
    assert quantizing.decided_agreement(reference, logits).tolist() == [False, True, False]


def test_quantize_is_for_onnx_and_int8_only(trained, tmp_path):
    for flags, message in (
        (["--format=pt2", "--quantize=int8"], "quantize=int8 is for format=onnx"),
        (["--format=onnx", "--quantize=int4"], "quantize='int4' is not accepted: int8"),
        (["--format=onnx", "--quantize=int8", "--min_agreement=2"], "min_agreement=2.0 must be in (0, 1]"),
        (
            ["--format=onnx", "--quantise=int8"],
            "export does not take --quantise (did you mean --quantize?): its flags are --checkpoint, --format",
        ),
        (
            ["--format=onnx", "--quantize=int8", "--calibration_method=kl"],
            "calibration_method='kl' is not accepted: auto (choose on held-out training images) or one "
            "of minmax, percentile, entropy",
        ),
    ):
        result = run_in_this_process("export", f"--checkpoint={trained}", *flags, f"--output={tmp_path / 'x.onnx'}")
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())


def test_predict_classifies_image_files_with_the_int8_file(trained, small_dataset, tmp_path):
    output = tmp_path / "model.int8.onnx"
    api.export(trained, "onnx", output, quantize="int8", calibration_images=100, min_agreement=0.9)
    test = cifar.read_cifar10(small_dataset / cifar_layouts.FOLDER)[1]
    write_png_folder(test, tmp_path / "images")
    result = run_in_this_process("predict", f"--checkpoint={output}", str(tmp_path / "images"), "--json", "--top_k=1")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 301
    fp32 = api.predict(trained, test.images).argmax(1)
    by_index = {int(Path(line["path"]).stem): line["top_k"][0]["index"] for line in lines}
    agree = sum(by_index[index] == int(fp32[index]) for index in range(301)) / 301
    assert agree >= 0.9


def test_a_run_with_a_val_split_chooses_its_calibration_on_the_val_images():
    """The images that choose the calibration are the run's validation images where it had them (never trained on):
    exactly the ones its val_split and val_seed held out; else training images the calibration does not use."""
    from types import SimpleNamespace

    from cifar10_dist.data import loaders
    from cifar10_dist.data.datasets import ImageSet

    images = torch.arange(100, dtype=torch.uint8).view(100, 1, 1, 1).expand(100, 3, 2, 2).contiguous()
    data = SimpleNamespace(train=ImageSet(images, torch.zeros(100, dtype=torch.long)), val=None)
    calibration, choosing, kind = quantizing.calibration_and_choice(data, Config(val_split=0.2, val_seed=3), 30, 50)
    held = loaders.hold_out(data.train, 0.2, 3)
    assert kind == "validation" and sorted(choosing[:, 0, 0, 0].tolist()) == held.indices.tolist()
    assert not set(calibration[:, 0, 0, 0].tolist()) & set(held.indices.tolist()) and len(calibration) == 30
    calibration, choosing, kind = quantizing.calibration_and_choice(data, Config(val_split=0.0), 30, 50)
    assert kind == "held-out training" and len(choosing) == 50
    assert not set(calibration[:, 0, 0, 0].tolist()) & set(choosing[:, 0, 0, 0].tolist())

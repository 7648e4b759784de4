"""int8 ONNX export: ONNX Runtime's static quantization checked on the test set (accuracy of both, top-1
agreement), refused with nothing written when badly quantized, and run by predict."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime
import pytest
import torch

from cifar10_dist import api
from cifar10_dist.data import cifar
from tests.conftest import run_in_process
from tests.test_predict_export import write_png_folder


@pytest.fixture(scope="module")
def trained(long_reference) -> Path:
    """simple_cnn (8 channels wide) trained by the LONG reference run on small_dataset (301 test images): its
    best-model file."""
    return sorted(long_reference.glob("best_model_*.pt"))[-1]


def test_int8_export_reports_accuracy_and_agreement_and_loads_in_onnx_runtime(trained, small_dataset, tmp_path):
    output = tmp_path / "model.int8.onnx"
    result = run_in_process("export", f"--checkpoint={trained}", "--format=onnx", "--quantize=int8",
                            f"--output={output}", "--calibration_images=200", "--min_agreement=0.9")
    assert result.returncode == 0, result.stderr[-2000:]
    sidecar = json.loads(Path(f"{output}.json").read_text())
    found = sidecar["quantization"]
    assert found["test_images"] == 301 and found["calibration_images"] == 200
    # this 8-channel test model flips about 11 of its 301 low-margin test images (96%): a real one agrees more
    assert found["agreement"] >= 0.9 and abs(found["accuracy_int8"] - found["accuracy_fp32"]) < 0.03
    assert (f"int8 on the 301 test images: accuracy {found['accuracy_int8']:.4f} against fp32 "
            f"{found['accuracy_fp32']:.4f}, the same top-1 class on {found['agreement']:.2%}") in result.stdout
    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    assert any(node.op_type == "QuantizeLinear" for node in __import__("onnx").load(str(output)).graph.node)
    assert session.get_outputs()[0].shape[1] == 10


def test_a_badly_quantized_model_is_refused_and_nothing_is_written(trained, tmp_path):
    output = tmp_path / "bad.int8.onnx"
    black = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)  # one black image: activation ranges of nothing
    with pytest.raises(Exception, match=r"int8 export refused: its top-1 class agrees with the fp32 model's on"):
        api.export(trained, "onnx", output, quantize="int8", calibration=black)
    assert not list(tmp_path.iterdir())


def test_quantize_is_for_onnx_and_int8_only(trained, tmp_path):
    for flags, message in ((["--format=pt2", "--quantize=int8"], "quantize=int8 is for format=onnx"),
                           (["--format=onnx", "--quantize=int4"], "quantize='int4' is not accepted: int8"),
                           (["--format=onnx", "--quantize=int8", "--min_agreement=2"], "min_agreement=2.0 must be in (0, 1]")):
        result = run_in_process("export", f"--checkpoint={trained}", *flags, f"--output={tmp_path / 'x.onnx'}")
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())


def test_predict_classifies_image_files_with_the_int8_file(trained, small_dataset, tmp_path):
    output = tmp_path / "model.int8.onnx"
    api.export(trained, "onnx", output, quantize="int8", calibration_images=100, min_agreement=0.9)
    test = cifar.read_cifar10(small_dataset / cifar.FOLDER)[1]
    write_png_folder(test, tmp_path / "images")
    result = run_in_process("predict", f"--checkpoint={output}", str(tmp_path / "images"), "--json", "--top_k=1")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 301
    fp32 = api.predict(trained, test.images).argmax(1)
    by_index = {int(Path(line["path"]).stem): line["top_k"][0]["index"] for line in lines}
    agree = sum(by_index[index] == int(fp32[index]) for index in range(301)) / 301
    assert agree >= 0.9

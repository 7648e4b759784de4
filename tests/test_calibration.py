"""Calibration: the expected calibration error of every evaluation against its formula on hand-made predictions,
the reliability diagram of evaluate and of a run's end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cifar10_dist.training.loop.evaluators import CalibrationBins, expected_calibration_error, reliability
from tests.conftest import TINY, run_in_this_process


def logits_with_top1(probabilities: list[float], classes: int = 4) -> torch.Tensor:
    """Logits whose softmax puts ``p`` on class 0 and the rest evenly on the others, one row per p."""
    rows = []
    for p in probabilities:
        rest = (1 - p) / (classes - 1)
        rows.append(torch.log(torch.tensor([p] + [rest] * (classes - 1), dtype=torch.float64)))
    return torch.stack(rows).float()


def test_the_ece_is_the_binned_gap_between_confidence_and_accuracy():
    # top-1 probabilities 0.95 (x4, 3 right), 0.55 (x2, 2 right), 0.3 (x2, 0 right), 15 bins of width 1/15
    confidences = [0.95, 0.95, 0.95, 0.95, 0.55, 0.55, 0.3, 0.3]
    targets = torch.tensor([0, 0, 0, 1, 0, 0, 2, 3])
    metric = CalibrationBins()
    metric.update((logits_with_top1(confidences[:5]), targets[:5]))  # two batches, as an evaluation runs
    metric.update((logits_with_top1(confidences[5:]), targets[5:]))
    sums = metric.compute()
    # by hand: bin of 0.95 (14th): |3/4 - 0.95| x 4/8; of 0.55 (9th): |1 - 0.55| x 2/8; of 0.3 (5th): |0 - 0.3| x 2/8
    by_hand = abs(0.75 - 0.95) * 4 / 8 + abs(1.0 - 0.55) * 2 / 8 + abs(0.0 - 0.3) * 2 / 8
    assert expected_calibration_error(sums) == pytest.approx(by_hand, abs=1e-6)
    rows = reliability(sums)
    assert rows["images"][14] == 4 and rows["images"][8] == 2 and rows["images"][4] == 2 and sum(rows["images"]) == 8
    assert rows["accuracy"][14] == pytest.approx(0.75) and rows["confidence"][8] == pytest.approx(0.55, abs=1e-6)


def test_a_probability_on_a_bin_edge_falls_in_the_lower_bin_and_one_in_the_last():
    metric = CalibrationBins()
    metric.update((logits_with_top1([1 / 3 + 1e-7, 1.0 - 1e-7], classes=3), torch.tensor([0, 0])))
    counts = metric.compute()[0]
    assert counts[5] == 1 and counts[14] == 1  # (5/15, 6/15] holds 1/3 + a hair; (14/15, 1] holds ~1


def test_evaluate_and_a_run_report_the_ece_and_draw_the_reliability_diagram(small_dataset, tmp_path):
    result = run_in_this_process(
        "run",
        *TINY,
        "--figures=True",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=calibrated",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = tmp_path / "calibrated"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0 <= metrics["test"]["ece"] <= 1
    drawn = json.loads((run_dir / "calibration.json").read_text())
    assert drawn["ece"] == pytest.approx(metrics["test"]["ece"]) and sum(drawn["images"]) == 301
    assert (run_dir / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ", ECE " in (run_dir / "run.log").read_text()
    [best] = sorted(run_dir.glob("best_model_*.pt"))
    evaluated = run_in_this_process("evaluate", f"--checkpoint={best}", f"--data_path={small_dataset}")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    test = metrics["test"]
    assert f"calibration: ECE {test['ece']:.4f} (15 bins), NLL {test['loss']:.4f}" in evaluated.stdout
    assert (run_dir / f"calibration_{best.stem}.png").is_file()


def test_the_fitted_temperature_undoes_overconfidence_and_lowers_the_nll():
    """Logits drawn calibrated, then made 3x too sharp: the fitted T is near 3 and the NLL falls back."""
    from cifar10_dist.training.trained_models.temperature import fit_temperature

    generator = torch.Generator().manual_seed(0)
    calibrated = torch.randn(4000, 10, generator=generator) * 1.5
    targets = torch.multinomial(calibrated.softmax(dim=1), 1, generator=generator).squeeze(1)
    sharp = calibrated * 3
    found = fit_temperature(sharp, targets)
    assert 2.7 < found < 3.3
    nll = torch.nn.functional.cross_entropy
    assert nll(sharp / found, targets) < nll(sharp, targets) - 0.1


def test_calibrate_without_a_validation_split_is_refused_in_one_line(tmp_path):
    result = run_in_this_process("run", "--calibrate=temperature", f"--output_path={tmp_path}")
    assert result.returncode == 2
    assert "calibrate=temperature fits the temperature on a validation split, never on the test set" in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_calibrated_run_stores_its_temperature_and_evaluate_predict_and_export_use_it(small_dataset, tmp_path):
    import onnxruntime

    from cifar10_dist import api
    from cifar10_dist.data import augmentation, cifar, cifar_layouts
    from cifar10_dist.models import restoring
    from cifar10_dist.outputs import checkpoint_files

    result = run_in_this_process(
        "run",
        *TINY,
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=tempered",
        "--val_split=0.2",
        "--calibrate=temperature",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = tmp_path / "tempered"
    found = json.loads((run_dir / "summary.json").read_text())["calibration"]
    assert found["temperature"] > 0 and found["images"] == 120
    lines = {line.split(":")[0]: line for line in result.stdout.splitlines() if line.startswith("final ")}
    assert lines["final val"].endswith("; uncalibrated: the model's own probabilities)")
    assert lines["final test"].endswith(f"; calibrated: logits / T {found['temperature']:.4f})")
    assert lines["final train subset"].endswith("; uncalibrated: the model's own probabilities)")
    assert found["val_nll_after"] <= found["val_nll_before"] + 1e-9
    [best] = sorted(run_dir.glob("best_model_*.pt"))
    stored = checkpoint_files.load_checkpoint(best)
    assert stored["temperature"] == found["temperature"]
    assert (
        checkpoint_files.load_checkpoint(checkpoint_files.newest_valid_checkpoint(run_dir))["temperature"]
        == found["temperature"]
    )
    # evaluate reads it: the same test loss (the NLL of the calibrated probabilities) as the run's end
    final = json.loads((run_dir / "metrics.json").read_text())["test"]
    evaluated = run_in_this_process("evaluate", f"--checkpoint={best}", f"--data_path={small_dataset}", "--json")
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["loss"] == pytest.approx(final["loss"], abs=1e-4)
    # predict and ONNX: the raw model's logits divided by T
    info = cifar.checkpoint_info(stored)
    raw = restoring.restore_model(stored, best, len(info.classes)).eval()
    test_images = cifar.read_cifar10(small_dataset / cifar_layouts.FOLDER)[1].images[:16]
    inputs = augmentation.normalize(
        augmentation.eval_view(test_images, info.image_size, info.crop_fraction), info.mean, info.std
    )
    with torch.no_grad():
        expected = raw(inputs) / found["temperature"]
    assert torch.allclose(api.predict(best, test_images), expected.softmax(dim=1), atol=1e-5)
    exported = api.export(best, "onnx", tmp_path / "tempered.onnx")
    session = onnxruntime.InferenceSession(exported.path, providers=["CPUExecutionProvider"])
    onnx_logits = torch.from_numpy(session.run(["logits"], {"images": inputs.numpy()})[0])
    assert torch.allclose(onnx_logits, expected, atol=1e-4)
    assert json.loads(Path(exported.sidecar).read_text())["temperature"] == found["temperature"]


def test_a_folder_without_a_validation_split_is_refused_before_training():
    from cifar10_dist.errors import UserError
    from cifar10_dist.models.viewing import TemperatureScaled
    from cifar10_dist.training.trained_models.temperature import scaled_test_model

    with pytest.raises(
        UserError,
        match="calibrate=temperature fits the temperature on a validation split, never on "
        "the test set, and this run has none",
    ):
        scaled_test_model("temperature", "test", torch.nn.Identity())
    assert isinstance(scaled_test_model("temperature", "val", torch.nn.Identity()), TemperatureScaled)
    assert scaled_test_model(None, "test", torch.nn.Identity()) is None


def test_the_temperature_is_stored_only_with_the_weights_it_was_fitted_to(tmp_path):
    """Two best-model files (epochs 1 and 2) and the newest training checkpoint: T fitted on the epoch-1 model goes
    into its file only (the checkpoint holds later weights); fitted on the epoch-2 model, into its file and the
    checkpoint that holds the same weights (its EMA's where it has one); with no best-model file, the checkpoint."""
    from cifar10_dist.outputs import checkpoint_files
    from cifar10_dist.training.trained_models import temperature

    def weights(value: float) -> dict[str, torch.Tensor]:
        return {"layer.weight": torch.full((2, 2), value), "layer.bias": torch.zeros(2)}

    def write(name: str, content: dict) -> None:
        torch.save(content, tmp_path / name)

    def stored() -> dict[str, float | None]:
        return {
            path.name: checkpoint_files.load_checkpoint(path).get("temperature")
            for path in sorted(tmp_path.glob("*.pt"))
        }

    training = {"trainer": {}, "optimizer": {}, "lr_scheduler": {}}
    first, second = "best_model_1_val_accuracy=0.5000.pt", "best_model_2_val_accuracy=0.6000.pt"
    write(first, {"model": weights(1.0)})
    write(second, {"model": weights(2.0)})
    write("training_checkpoint_20.pt", {**training, "model": weights(2.0)})
    assert temperature.store_temperature(tmp_path, 1.5, first) == [first]
    assert stored() == {first: 1.5, second: None, "training_checkpoint_20.pt": None}
    assert temperature.store_temperature(tmp_path, 1.7, second) == [second, "training_checkpoint_20.pt"]
    assert stored() == {first: 1.5, second: 1.7, "training_checkpoint_20.pt": 1.7}
    write("training_checkpoint_20.pt", {**training, "model": weights(3.0), "ema_model": weights(2.0)})
    assert temperature.store_temperature(tmp_path, 1.9, second) == [second, "training_checkpoint_20.pt"]
    for path in (tmp_path / first, tmp_path / second):
        path.unlink()
    write("training_checkpoint_20.pt", {**training, "model": weights(3.0)})
    assert temperature.store_temperature(tmp_path, 2.1, "final") == ["training_checkpoint_20.pt"]
    assert stored() == {"training_checkpoint_20.pt": 2.1}

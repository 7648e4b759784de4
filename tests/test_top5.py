"""Top-5 accuracy, reported beside accuracy when a dataset has more than 5 classes: in every evaluation line,
metrics.jsonl, summary.json, TensorBoard's final scalars, report and evaluate --json, and equal to a hand
computation from the model's class probabilities."""

from __future__ import annotations

import json

from cifar10_dist import api
from cifar10_dist.config import load_config
from cifar10_dist.data import synthetic
from tests.conftest import run_in_this_process

RUN = dict(
    dataset="synthetic",
    synthetic_size=320,
    model="simple_cnn",
    batch_size=32,
    num_workers=0,
    num_epochs=1,
    num_warmup_epochs=0,
    train_eval_size=0,
    learning_rate=0.02,
)


def test_top5_is_reported_everywhere_and_equals_a_hand_computation(tmp_path):
    result = api.train(**RUN, output_path=str(tmp_path), run_name="ten")
    run_dir = tmp_path / "ten"
    assert 0 < result.test.top5_accuracy <= 1 and result.test.top5_accuracy >= result.test.accuracy
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"]["test"]["top5_accuracy"] == result.test.top5_accuracy
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["top5_accuracy"] for line in lines if line.get("event") == "evaluation"] == [result.test.top5_accuracy]

    best = sorted(run_dir.glob("best_model_*.pt"))[-1]
    evaluated = run_in_this_process("evaluate", f"--checkpoint={best}", "--num_workers=0", "--json")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    reported = json.loads(evaluated.stdout.strip().splitlines()[-1])["top5_accuracy"]
    text = run_in_this_process("evaluate", f"--checkpoint={best}", "--num_workers=0").stdout
    assert f"test: accuracy {result.test.accuracy:.4f}, top-5 {reported:.4f}, loss " in text
    test_set = synthetic.load(load_config(**RUN)).test
    probabilities = api.predict(best, test_set.images)
    by_hand = (probabilities.topk(5, dim=1).indices == test_set.labels[:, None]).any(dim=1).float().mean().item()
    assert reported == result.test.top5_accuracy and abs(reported - by_hand) < 1e-9

    table = run_in_this_process("report", str(run_dir), f"--output={tmp_path / 'r.png'}").stdout
    assert "top-5" in table.splitlines()[0] and f"{result.test.top5_accuracy:.4f}" in table.splitlines()[1]


def test_with_five_classes_or_fewer_there_is_no_top5(tmp_path):
    from tests.test_image_folders import FOLDER_RUN, write_image_folder

    root = write_image_folder(tmp_path / "data", train=12, test=4)
    result = run_in_this_process(
        "run", *FOLDER_RUN, f"--data_path={root}", "--num_epochs=2", f"--output_path={tmp_path}", "--run_name=three"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "top-5" not in result.stderr and "top-5" not in result.stdout
    summary = json.loads((tmp_path / "three" / "summary.json").read_text())
    assert summary["final"]["test"]["top5_accuracy"] is None

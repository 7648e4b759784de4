"""The mistakes as a picture: evaluate writes the test images its model got wrong with the most confidence,
drawn (mistakes_<checkpoint>.png) and listed (.json), most confident first, found in the same one pass over the
test set as its metrics; a run writes its own from its final test evaluation in every process (mistakes.png, and
in TensorBoard), the same images evaluate finds."""

from __future__ import annotations

import json

import pytest
import torch

from cifar10_dist import api
from cifar10_dist.outputs import mistake_grid
from tests.conftest import run_in_this_process


def test_the_most_confident_mistakes_are_the_wrong_ones_in_order_of_confidence_across_batches():
    from ignite.engine import Engine

    from cifar10_dist.training.loop.evaluators import MistakeCollector

    probabilities = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7], [0.95, 0.05], [0.5, 0.5]])
    labels = torch.tensor([0, 0, 1, 1, 1, 0])  # wrong: 1 (0.8), 2 (0.6), 4 (0.95); 5 is a tie, taken as right
    batches = [(probabilities[:3].log(), labels[:3]), (probabilities[3:].log(), labels[3:])]
    evaluator = Engine(lambda engine, batch: batch)
    collector = MistakeCollector(evaluator, batch_size=3, count=2)
    evaluator.run(batches)
    found = collector.gathered(["cat", "dog"])
    assert [(m.index, m.true, m.predicted, m.confidence) for m in found] == [
        (4, "dog", "cat", 0.95),
        (1, "cat", "dog", 0.8),
    ]


COUNTING_MODEL = """
import os
from torch import nn


class Counting(nn.Module):
    \"\"\"A linear model that appends the number of images of each forward pass in eval mode to $COUNT_FILE.\"\"\"

    def __init__(self, num_classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))

    def forward(self, images):
        if not self.training and os.environ.get("COUNT_FILE"):
            with open(os.environ["COUNT_FILE"], "a") as counts:
                counts.write(f"{images.shape[0]}\\n")
        return self.net(images)


def Net(num_classes=10):
    return Counting(num_classes)
"""


@pytest.mark.parametrize("tta, views", [(0, 1), (1, 2)])
def test_evaluate_passes_over_the_test_set_once_for_its_metrics_its_confusion_matrix_and_its_mistakes(
    tmp_path, monkeypatch, tta, views
):
    """The model sees each test image once per view: the mistakes come from the same pass as the metrics."""
    (tmp_path / "counting.py").write_text(COUNTING_MODEL)
    api.train(
        dataset="synthetic",
        synthetic_size=320,
        model=f"{tmp_path / 'counting.py'}:Net",
        batch_size=32,
        num_workers=0,
        num_epochs=1,
        num_warmup_epochs=0,
        train_eval_size=0,
        output_path=str(tmp_path),
        run_name="c",
    )
    best = sorted((tmp_path / "c").glob("best_model_*.pt"))[-1]
    counts = tmp_path / "counts.txt"
    monkeypatch.setenv("COUNT_FILE", str(counts))
    result = run_in_this_process("evaluate", f"--checkpoint={best}", "--num_workers=0", f"--tta={tta}")
    assert result.returncode == 0, result.stderr[-2000:]
    check, *passes = [int(line) for line in counts.read_text().split()]
    assert check == 2  # the launch's check that a model of one's own maps a 2-image batch to logits
    assert sum(passes) == 64 * views  # 320 / 5 test images, each once per view
    assert json.loads((tmp_path / "c" / f"mistakes_{best.stem}.json").read_text())["test_images"] == 64
    assert (tmp_path / "c" / f"confusion_{best.stem}.png").is_file()


def test_evaluate_draws_and_lists_its_most_confident_mistakes(tmp_path):
    api.train(
        dataset="synthetic",
        synthetic_size=320,
        model="simple_cnn",
        batch_size=32,
        num_workers=0,
        num_epochs=1,
        num_warmup_epochs=0,
        train_eval_size=0,
        learning_rate=0.02,
        output_path=str(tmp_path),
        run_name="m",
    )
    best = sorted((tmp_path / "m").glob("best_model_*.pt"))[-1]
    result = run_in_this_process("evaluate", f"--checkpoint={best}", "--num_workers=0")
    assert result.returncode == 0, result.stderr[-2000:]
    listed = json.loads((tmp_path / "m" / f"mistakes_{best.stem}.json").read_text())
    wrong = round((1 - api.evaluate(best, num_workers=0).accuracy) * listed["test_images"])
    assert len(listed["mistakes"]) == min(mistake_grid.SHOWN, wrong) > 0
    confidences = [entry["confidence"] for entry in listed["mistakes"]]
    assert confidences == sorted(confidences, reverse=True)
    assert all(entry["true"] != entry["predicted"] for entry in listed["mistakes"])
    picture = tmp_path / "m" / f"mistakes_{best.stem}.png"
    assert picture.stat().st_size > 1000 and f"most confident mistakes: {picture.with_suffix('')}.png" in result.stdout
    pytest.importorskip("PIL")
    from PIL import Image

    assert Image.open(picture).size == (int(1.6 * 8 * 100), int((1.9 * 2 + 0.4) * 100))  # 16 tiles: 8 x 2


def test_a_run_with_two_processes_finds_the_mistakes_that_evaluate_finds_and_shows_them_in_tensorboard(
    small_dataset, spawned_run
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, output = spawned_run
    (run_dir,) = output.iterdir()
    final = max(run_dir.glob("training_checkpoint_*.pt"), key=lambda path: int(path.stem.rsplit("_", 1)[1]))
    assert (
        run_in_this_process(
            "evaluate", f"--checkpoint={final}", f"--data_path={small_dataset}", "--num_workers=0"
        ).returncode
        == 0
    )
    own = json.loads((run_dir / "mistakes.json").read_text())
    evaluated = json.loads((run_dir / f"mistakes_{final.stem}.json").read_text())
    assert own["test_images"] == 301 and own["model"] == "final"
    assert [(m["index"], m["true"], m["predicted"]) for m in own["mistakes"]] == [
        (m["index"], m["true"], m["predicted"]) for m in evaluated["mistakes"]
    ]  # rank 1's indices mapped back
    assert [m["confidence"] for m in own["mistakes"]] == pytest.approx(
        [m["confidence"] for m in evaluated["mistakes"]], abs=2e-4
    )
    assert len(own["mistakes"]) == mistake_grid.SHOWN and (run_dir / "mistakes.png").stat().st_size > 1000
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    events.Reload()
    (image,) = events.Images("test/mistakes")
    assert (image.width, image.height) == (int(1.6 * 8 * 100), int((1.9 * 2 + 0.4) * 100))

"""Imbalanced classes: class weights (auto = inverse frequency, recorded), the balanced sampler (classes drawn
equally, the same draw at world sizes 1 and 2, resumable mid-epoch), both raising the balanced accuracy on an
imbalanced dataset for the same budget, and best_metric choosing the best model, the summary and the tuning
objective by itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ignite.engine import Engine

from cifar10_dist.data import cifar, cifar_layouts, loaders
from cifar10_dist.data.datasets import ImageSet
from cifar10_dist.data.synthetic import make_synthetic
from cifar10_dist.outputs import checkpoint_files
from cifar10_dist.outputs import summary as summary_file
from cifar10_dist.results import RunResult, SplitMetrics
from cifar10_dist.training.loop import checkpointing
from tests.conftest import run_in_this_process

MAJORITY, MINORITY = 300, 15  # training images of classes 0-4 and of classes 5-9: 20 to 1
RUN = [
    "--model=simple_cnn",
    '--model_kwargs={"width": 16}',  # (half the default: the same margins, in half the time)
    "--figures=False",
    "--batch_size=32",
    "--num_workers=0",
    "--num_epochs=2",
    "--learning_rate=0.1",
    "--train_eval_size=0",
    "--validate_every=2",
    "--channels_last=True",
]


@pytest.fixture(scope="module")
def imbalanced_data(tmp_path_factory) -> Path:
    """The synthetic CIFAR-10 with 300 training images in each of classes 0-4 and 15 in each of 5-9; a balanced
    test set of 1,000."""
    train, test = make_synthetic(4000, 1000, seed=0)
    kept = torch.cat([(train.labels == c).nonzero().flatten()[: MAJORITY if c < 5 else MINORITY] for c in range(10)])
    kept = kept.sort().values
    root = tmp_path_factory.mktemp("imbalanced")
    cifar.write_cifar10(root / cifar_layouts.FOLDER, ImageSet(train.images[kept], train.labels[kept]), test)
    return root


@pytest.fixture(scope="module")
def three_runs(imbalanced_data, tmp_path_factory) -> dict[str, Path]:
    """The same budget without a remedy, with class_weights=auto and with sampler=balanced."""
    output = tmp_path_factory.mktemp("imbalance-runs")
    remedies = {"plain": [], "class_weights": ["--class_weights=auto"], "sampler": ["--sampler=balanced"]}
    for name, extra in remedies.items():
        result = run_in_this_process(
            "run", *RUN, *extra, f"--data_path={imbalanced_data}", f"--output_path={output}", f"--run_name={name}"
        )
        assert result.returncode == 0, result.stderr[-3000:]
    return {name: output / name for name in remedies}


def final_test(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())["test"]


@pytest.mark.slow  # three runs of 1,575 images
def test_each_remedy_raises_the_balanced_accuracy_for_the_same_budget(three_runs):
    plain = final_test(three_runs["plain"])
    for remedy in ("class_weights", "sampler"):
        remedied = final_test(three_runs[remedy])
        assert remedied["balanced_accuracy"] > plain["balanced_accuracy"] + 0.02, (remedy, remedied, plain)
        assert remedied["macro_f1"] > plain["macro_f1"] + 0.02, (remedy, remedied, plain)


@pytest.mark.slow
def test_auto_class_weights_are_the_inverse_class_frequency_and_recorded(three_runs):
    recorded = json.loads((three_runs["class_weights"] / "provenance.json").read_text())["class_weights"]
    total = 5 * MAJORITY + 5 * MINORITY
    expected = [total / (10 * MAJORITY)] * 5 + [total / (10 * MINORITY)] * 5
    assert recorded == pytest.approx(expected, rel=1e-5)
    assert "class_weights" not in json.loads((three_runs["plain"] / "provenance.json").read_text())


def sampler_draw(labels: torch.Tensor, world_size: int, epoch: int) -> list[list[int]]:
    """Each rank's indices of one epoch of the balanced sampler."""
    dataset = loaders.BatchTensorDataset(ImageSet(torch.zeros(len(labels), 3, 2, 2, dtype=torch.uint8), labels))
    draws = []
    for rank in range(world_size):
        sampler = loaders.BalancedSampler(dataset, num_replicas=world_size, rank=rank, seed=7)
        sampler.set_epoch(epoch)
        draws.append(list(sampler))
    return draws


def test_the_balanced_sampler_draws_classes_equally_and_alike_at_world_sizes_1_and_2():
    labels = torch.tensor([0] * 900 + [1] * 90 + [2] * 10)  # 90% / 9% / 1%
    for epoch in (0, 1):
        (alone,) = sampler_draw(labels, 1, epoch)
        pair = sampler_draw(labels, 2, epoch)
        assert len(alone) == 1000 and [len(part) for part in pair] == [500, 500]
        assert sorted(pair[0] + pair[1]) == sorted(alone)  # the same images, split between the two processes
        counts = torch.bincount(labels[alone], minlength=3).tolist()
        assert all(abs(count - 1000 / 3) < 60 for count in counts), counts  # binomial sd 15: 4 sd
    assert sampler_draw(labels, 1, 0) != sampler_draw(labels, 1, 1)  # a new draw each epoch


def test_the_balanced_sampler_continues_mid_epoch_where_it_stopped():
    labels = torch.tensor([0] * 50 + [1] * 10)
    dataset = loaders.BatchTensorDataset(ImageSet(torch.zeros(60, 3, 2, 2, dtype=torch.uint8), labels))
    sampler = loaders.BalancedSampler(dataset, num_replicas=2, rank=1, seed=3)
    sampler.set_epoch(4)
    whole = list(sampler)
    sampler.start_next_pass_at(12)
    assert list(sampler) == whole[12:]
    assert list(sampler) == whole  # the skip is for one pass only


def evaluations(engine: Engine, values: list[tuple[float, float]], trainer: Engine) -> None:
    """Fire the evaluator's COMPLETED with these (accuracy, macro_f1) pairs, one per trainer epoch."""
    from ignite.engine import Events

    for epoch, (accuracy, f1) in enumerate(values, start=1):
        trainer.state.epoch = epoch
        engine.state.metrics = {"accuracy": accuracy, "macro_f1": f1}
        engine.fire_event(Events.COMPLETED)


def test_best_metric_chooses_the_best_model_file_and_the_summary_by_itself(tmp_path):
    values = [(0.80, 0.40), (0.70, 0.65), (0.75, 0.50)]  # accuracy peaks at epoch 1, macro-F1 at epoch 2
    chosen = {}
    for metric in ("accuracy", "macro_f1"):
        run_dir = tmp_path / metric
        run_dir.mkdir()
        trainer, evaluator = Engine(lambda e, b: None), Engine(lambda e, b: None)
        trainer.state.iteration = 1
        checkpointing.attach_best_model_checkpoints(
            evaluator, trainer, {"model": torch.nn.Linear(2, 2)}, run_dir, "val", metric=metric
        )
        evaluations(evaluator, values, trainer)
        chosen[metric] = checkpoint_files.best_model_file(run_dir).name
        lines = [
            {
                "event": "evaluation",
                "split": "val",
                "epoch": epoch,
                "iteration": epoch,
                "accuracy": accuracy,
                "macro_f1": f1,
                "loss": 1.0,
                "num_samples": 10,
                "duration": 0.1,
            }
            for epoch, (accuracy, f1) in enumerate(values, start=1)
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        result = RunResult(
            run_dir=str(run_dir),
            epochs=3,
            iterations=3,
            test=SplitMetrics(0.7, 1.1, 10),
            val=SplitMetrics(0.75, 1.0, 10),
        )
        best = summary_file.summarize(run_dir, result, None, 1.0, metric).best
        assert (best.epoch, best.metric, best.value) == (
            (1, "accuracy", 0.80) if metric == "accuracy" else (2, "macro_f1", 0.65)
        )
    assert chosen == {
        "accuracy": "best_model_1_val_accuracy=0.8000.pt",
        "macro_f1": "best_model_2_val_macro_f1=0.6500.pt",
    }


def test_the_tuning_objective_is_the_best_metric(tmp_path):
    from cifar10_dist.tuning.studies import best_accuracy

    summary = {
        "run_dir": str(tmp_path),
        "best": {"split": "val", "accuracy": 0.7, "epoch": 2, "metric": "macro_f1", "value": 0.65},
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert best_accuracy(tmp_path) == 0.65
    del summary["best"]["metric"], summary["best"]["value"]  # a summary written before best_metric existed
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert best_accuracy(tmp_path) == 0.7


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--class_weights=auto", "--sampler=balanced"],
            "class_weights=auto with sampler=balanced corrects the same imbalance twice: choose one",
        ),
        (
            ["--class_weights=1,2"],
            "class_weights=1,2 gives 2 weights for the 10 classes airplane, automobile, bird, cat, "
            "deer, dog...: give one per class",
        ),
        (["--class_weights=1,-2"], "class_weights='1,-2' must be auto or one weight per class"),
        (["--best_metric=f1"], "best_metric='f1' is unknown: choose one of accuracy, balanced_accuracy, macro_f1"),
    ],
)
def test_bad_imbalance_settings_are_one_line(imbalanced_data, tmp_path, flags, message):
    result = run_in_this_process("run", *RUN, *flags, f"--data_path={imbalanced_data}", f"--output_path={tmp_path}")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not any(tmp_path.iterdir())  # nothing written

"""One-process training through the real CLI: outputs on disk, learning, validation schedule, resume, evaluate."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys

import pytest
import torch
import yaml

from cifar10_dist import checkpoint_layout
from cifar10_dist.data import cifar
from tests.conftest import TINY, cli_env, run_forked, run_in_this_process


def final_test_accuracy(stdout: str) -> float:
    match = re.search(r"final test: accuracy ([0-9.]+)(?:, top-5 [0-9.]+)?, loss ([0-9.]+) \((\d+) images\)", stdout)
    assert match, stdout
    return float(match.group(1))


@pytest.fixture(scope="module")
def trained_run(small_dataset, tmp_path_factory):
    """One 3-epoch run shared by the tests that only read its outputs."""
    output = tmp_path_factory.mktemp("out")
    result = run_forked(
        "run",
        *TINY,
        "--num_epochs=3",
        "--validate_every=2",
        "--checkpoint_every=10",
        f"--data_path={small_dataset}",
        f"--output_path={output}",
        "--run_name=first",
    )
    return result, output / "first"


def test_training_exits_zero_and_prints_final_metrics_and_run_folder(trained_run):
    result, run_dir = trained_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"run folder: {run_dir}" in result.stdout
    assert "(301 images)" in result.stdout  # the whole test set, once
    assert "final train subset: accuracy" in result.stdout
    assert "reuse_freed_memory: freed memory stays in this process for reuse (glibc)" in result.stderr  # the default


def test_validation_accuracy_rises_well_above_chance(trained_run):
    result, _ = trained_run
    assert final_test_accuracy(result.stdout) > 0.4  # chance is 0.1


def test_run_folder_holds_config_checkpoints_best_models_and_tensorboard(trained_run):
    result, run_dir = trained_run
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"] == "simple_cnn" and config["batch_size"] == 32 and config["num_epochs"] == 3
    # 600 images / 32 = 18 iterations per epoch (drop_last); every 10 iterations and at the end, keep 2
    assert sorted(p.name for p in run_dir.glob("training_checkpoint_*.pt")) == [
        "training_checkpoint_50.pt",
        "training_checkpoint_54.pt",
    ]
    checkpoint = torch.load(run_dir / "training_checkpoint_54.pt", weights_only=True)
    assert {"trainer", "model", "optimizer", "lr_scheduler", "meta"} <= checkpoint.keys()
    assert checkpoint["trainer"]["iteration"] == 54
    assert checkpoint["meta"]["world_size"] == 1 and checkpoint["meta"]["config"]["model"] == "simple_cnn"
    best = sorted(p.name for p in run_dir.glob("best_model_*.pt"))
    assert len(best) == 2 and best[0].startswith("best_model_2_test_accuracy=")
    # each best-model file says where training was when its model was chosen (epochs 2 and 3: 18 iterations each)
    assert [checkpoint_layout.progress(torch.load(run_dir / name, weights_only=True)) for name in best] == [
        {"epoch": 2, "iteration": 36},
        {"epoch": 3, "iteration": 54},
    ]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["iterations"] == 54 and metrics["test"]["num_samples"] == 301


def test_tensorboard_has_loss_lr_and_validation_scalars(trained_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir = trained_run
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"training/batch_loss", "training/lr", "test/accuracy", "test/loss", "train_subset/accuracy"} <= tags
    assert [event.step for event in events.Scalars("test/accuracy")] == [2, 3]
    last = json.loads((run_dir / "summary.json").read_text())["iterations"]
    for name in ("final/test_accuracy", "final/test_loss", "final/train_accuracy", "best/test_accuracy"):
        assert [event.step for event in events.Scalars(name)] == [last], name  # at the right end of the charts


def test_validation_runs_every_n_epochs_and_once_at_the_end(trained_run):
    result, _ = trained_run
    validated = re.findall(r"epoch (\d+) test: accuracy", result.stderr)
    assert validated == ["2", "3"]


def test_lr_warms_up_then_decays_to_zero(trained_run):
    _, run_dir = trained_run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    lrs = {event.step: event.value for event in events.Scalars("training/lr")}
    assert lrs[5] == pytest.approx(0.1 * 4 / 18, rel=1e-4)  # set at iteration start: (5 - 1) / 18 of warmup
    assert max(lrs.values()) <= 0.1
    assert lrs[50] == pytest.approx(0.1 * (54 - 49) / 36, rel=1e-4)


def test_resume_continues_at_the_saved_iteration(trained_run, small_dataset, tmp_path):
    _, first_dir = trained_run
    result = run_in_this_process(
        "run",
        *TINY,
        "--num_epochs=3",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=resumed",
        f"--resume_from={first_dir / 'training_checkpoint_50.pt'}",
        "--reuse_freed_memory=False",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "INFO reuse_freed_memory" not in result.stderr  # off: nothing said of it (the resume's note names it)
    assert "at iteration 50" in result.stderr
    assert "epoch 3 done" in result.stderr
    assert "epoch 1/3" not in result.stderr and "epoch 2 done" not in result.stderr  # nothing trained twice
    assert json.loads((tmp_path / "resumed" / "metrics.json").read_text())["iterations"] == 54


KEPT_BLOCKS = """
import ctypes, sys, torch
from cifar10_dist.system import cpu
class MallocInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallocInfo
def mapped_blocks_of_a_64_mib_tensor():
    before = mallinfo2().hblks
    tensor = torch.empty(64 * 2**20, dtype=torch.uint8)
    return mallinfo2().hblks - before
print(mapped_blocks_of_a_64_mib_tensor(), cpu.keep_freed_memory(), mapped_blocks_of_a_64_mib_tensor())
"""


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_keep_freed_memory_puts_a_big_tensor_on_the_heap_instead_of_its_own_mapping():
    result = subprocess.run([sys.executable, "-c", KEPT_BLOCKS], capture_output=True, text=True, env=cli_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "True", "0"]


def test_evaluate_json_counts_every_test_image(trained_run, small_dataset, capsys):
    from cifar10_dist import cli

    _, run_dir = trained_run
    best = sorted(run_dir.glob("best_model_*.pt"))[-1]
    for checkpoint in (best, run_dir / "training_checkpoint_54.pt"):  # in-process: the CLI's own entry point
        code = cli.main(
            ["evaluate", f"--checkpoint={checkpoint}", f"--data_path={small_dataset}", "--json", "--num_workers=0"]
        )
        output = capsys.readouterr()
        assert code == 0, output.err[-3000:]
        metrics = json.loads(output.out.strip().splitlines()[-1])
        assert set(metrics) == {
            "accuracy",
            "loss",
            "num_samples",
            "per_class_accuracy",
            "confusion_matrix",
            "classes",
            "top5_accuracy",
            "balanced_accuracy",
            "macro_f1",
            "per_class_precision",
            "per_class_f1",
            "mistakes",
            "ece",
            "reliability",
        }
        assert metrics["classes"] == list(cifar.CLASSES)
        assert metrics["mistakes"] and all(m["true"] != m["predicted"] for m in metrics["mistakes"])
        assert metrics["num_samples"] == 301 and 0.4 < metrics["accuracy"] <= 1.0
        matrix = metrics["confusion_matrix"]  # rows: true class; the means by hand, as sklearn defines them
        recalls = [row[c] / sum(row) for c, row in enumerate(matrix)]
        precisions = [matrix[c][c] / max(sum(row[c] for row in matrix), 1) for c in range(len(matrix))]
        f1s = [2 * p * r / (p + r) if p + r else 0.0 for p, r in zip(precisions, recalls)]
        assert metrics["per_class_accuracy"] == pytest.approx(recalls)
        assert metrics["per_class_precision"] == pytest.approx(precisions)
        assert metrics["per_class_f1"] == pytest.approx(f1s)
        assert metrics["balanced_accuracy"] == pytest.approx(sum(recalls) / len(recalls))
        assert metrics["macro_f1"] == pytest.approx(sum(f1s) / len(f1s))

"""Held-out validation, a test set used once, determinism, repeated seeds, provenance, and the uv install."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from cifar10_dist.data import loaders
from cifar10_dist.data.datasets import ImageSet
from tests.conftest import REPO, TINY, assert_same_training_state, run_in_this_process, run_log

HELD_OUT = ["--val_split=0.1", "--validate_every=1", "--deterministic=True"]
LAUNCHES = {1: [], 3: ["--backend=gloo", "--nproc_per_node=3"]}
FINAL = "training_checkpoint_32.pt"  # 540 training images left, batch 32: 16 iterations x 2 epochs (1 process)


@pytest.fixture(scope="module")
def held_out_runs(small_dataset, tmp_path_factory):
    """The same held-out training at world sizes 1 and 3 (600 images, 60 held out)."""
    output = tmp_path_factory.mktemp("held-out")
    results = {}
    for world_size, launch in LAUNCHES.items():
        result = run_in_this_process(
            "run",
            *TINY,
            *HELD_OUT,
            *launch,
            f"--data_path={small_dataset}",
            f"--output_path={output}",
            f"--run_name=ws{world_size}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        results[world_size] = (result, output / f"ws{world_size}")
    return results


def test_held_out_images_are_the_same_at_world_sizes_1_and_3(held_out_runs):
    chosen = {
        ws: json.loads((run_dir / "held_out_indices.json").read_text()) for ws, (_, run_dir) in held_out_runs.items()
    }
    assert len(chosen[1]) == 60 and chosen[1] == sorted(set(chosen[1]))
    assert chosen[1] == chosen[3]
    full = ImageSet(torch.zeros(600, 1, 1, 1, dtype=torch.uint8), torch.zeros(600, dtype=torch.long))
    assert loaders.hold_out(full, 0.1, seed=0).indices.tolist() == chosen[1]  # training seed plays no part
    assert loaders.hold_out(full, 0.1, seed=1).indices.tolist() != chosen[1]


def test_the_test_set_is_evaluated_once_with_the_model_chosen_on_val(held_out_runs):
    for world_size, (result, run_dir) in held_out_runs.items():
        log = run_log(result, run_dir)  # rank 0's log lines, once (in-process: stderr; spawned: run.log)
        if world_size == 1:
            log = result.stderr
        assert len(re.findall(r"epoch \d+ test: accuracy", log)) == 1, world_size
        assert (
            len(re.findall(r"epoch \d+ val: accuracy [0-9.]+(?:, top-5 [0-9.]+)?, loss [0-9.]+ on 60 images", log)) == 2
        )
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["val"]["num_samples"] == 60 and metrics["test"]["num_samples"] == 301
        best = metrics["test"]["model"]
        assert re.fullmatch(r"best_model_\d_val_accuracy=[0-9.]+\.pt", best) and (run_dir / best).is_file()
        assert f"final test: accuracy {metrics['test']['accuracy']:.4f}" in result.stdout
        assert best in log  # "test set, used once: best_model_..."


def test_no_held_out_image_is_ever_in_a_training_batch():
    count = 700
    images = torch.zeros(count, 3, 32, 32, dtype=torch.uint8)
    images[:, 0, 0, 0] = torch.arange(count) % 256  # each image carries its index
    images[:, 0, 0, 1] = torch.arange(count) // 256
    split = loaders.hold_out(ImageSet(images, torch.zeros(count, dtype=torch.long)), 0.1, seed=0)
    made = loaders.make_loaders(
        split.train, split.val, val=split.val, batch_size=32, num_workers=0, train_eval_size=100, seed=5
    )
    seen = set()
    for epoch in range(3):
        loaders.batch_sampler_of(made.train).sampler.set_epoch(epoch)
        for batch, _ in made.train:
            seen.update((batch[:, 0, 0, 0].long() + 256 * batch[:, 0, 0, 1].long()).tolist())
    held = set(split.indices.tolist())
    assert len(held) == 70 and not seen & held
    assert len(seen) >= 600  # the other 630 images are trained on (drop_last leaves out up to 31 per epoch)
    train_subset = {int(a) + 256 * int(b) for a, b in next(iter(made.train_eval))[0][:, 0, 0, :2].tolist()}
    assert not train_subset & held


@pytest.fixture(scope="module")
def seed_runs(held_out_runs, small_dataset, tmp_path_factory):
    output = tmp_path_factory.mktemp("seeds")
    result = run_in_this_process(
        "run",
        *TINY,
        *HELD_OUT,
        "--seeds=2",
        f"--data_path={small_dataset}",
        f"--output_path={output}",
        "--run_name=rep",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, output


def test_deterministic_runs_with_one_seed_are_bit_identical_and_another_seed_differs(held_out_runs, seed_runs):
    _, output = seed_runs
    first = held_out_runs[1][1] / FINAL
    assert_same_training_state(first, output / "rep-seed543" / FINAL)
    other = torch.load(output / "rep-seed544" / FINAL, weights_only=True)["model"]
    same = torch.load(first, weights_only=True)["model"]
    assert any(not torch.equal(same[key], other[key]) for key in same)
    assert "deterministic algorithms: on (CUBLAS_WORKSPACE_CONFIG=:4096:8)" in held_out_runs[1][0].stderr


def test_seeds_are_summarised_in_a_table_and_a_json_file(seed_runs):
    result, output = seed_runs
    summary = json.loads((output / "seeds_rep.json").read_text())
    runs = {run["seed"]: run for run in summary["runs"]}
    assert sorted(runs) == [543, 544]
    accuracies = [runs[seed]["test"]["accuracy"] for seed in (543, 544)]
    stats = summary["summary"]["test_accuracy"]
    assert stats["mean"] == pytest.approx(sum(accuracies) / 2)
    assert stats["std"] == pytest.approx(abs(accuracies[0] - accuracies[1]) / 2**0.5)
    assert (stats["min"], stats["max"]) == (min(accuracies), max(accuracies))
    row = re.search(r"^test_accuracy\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", result.stdout, re.M)
    assert row and float(row.group(1)) == pytest.approx(stats["mean"], abs=5e-5)
    assert "summary: " in result.stdout and "val_accuracy" in result.stdout


def test_run_folder_and_checkpoints_record_provenance(held_out_runs):
    _, run_dir = held_out_runs[3]
    record = json.loads((run_dir / "provenance.json").read_text())
    assert record["package"]["name"] == "cifar10-dist" and record["package"]["version"]
    assert record["backend"] == "gloo" and record["world_size"] == 3 and sum(record["devices"].values()) == 3
    assert set(record["versions"]) == {"python", "torch", "torchvision", "pytorch-ignite"}
    assert re.fullmatch(r"[0-9a-f]{64}", record["dataset"]["sha256"])
    if shutil.which("git") and (REPO / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", record["package"]["git_commit"])
        assert isinstance(record["package"]["git_dirty"], bool)
    final = max(run_dir.glob("training_checkpoint_*.pt"), key=lambda path: int(path.stem.rsplit("_", 1)[1]))
    assert torch.load(final, weights_only=True)["meta"]["provenance"] == record
    # the same data gives the same checksum at another world size
    assert json.loads((held_out_runs[1][1] / "provenance.json").read_text())["dataset"] == record["dataset"]


def test_evaluate_warns_when_the_data_differs_from_the_checkpoints(held_out_runs, tmp_path, capsys):
    from cifar10_dist import cli
    from tests.conftest import write_dataset

    other = write_dataset(tmp_path / "other", 600, 301, seed=1)
    checkpoint = held_out_runs[1][1] / FINAL
    code = cli.main(["evaluate", f"--checkpoint={checkpoint}", f"--data_path={other}", "--num_workers=0"])
    stderr = capsys.readouterr().err
    assert code == 0, stderr[-2000:]
    assert "it was made with other data (sha256" in stderr
    code = cli.main(["evaluate", f"--checkpoint={checkpoint}", "--num_workers=0"])  # data_path from the checkpoint
    stderr = capsys.readouterr().err
    assert code == 0 and "WARNING" not in stderr


def test_uv_installs_the_project_into_an_environment_that_has_torch():
    uv = shutil.which("uv") or shutil.which("uv", path=str(__import__("pathlib").Path(sys.executable).parent))
    if uv is None:
        pytest.fail("uv is missing: it is in the dev extra (pip install -e '.[dev]')")
    plan = subprocess.run(
        [uv, "pip", "install", "--dry-run", "--python", sys.executable, "-e", str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stderr
    changes = [line for line in plan.stderr.splitlines() if line.startswith((" + ", " - "))]
    assert changes and all("cifar10-dist" in line for line in changes), plan.stderr  # torch & co. already satisfied

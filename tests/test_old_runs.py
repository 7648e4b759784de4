"""Run folders and checkpoints written before the package move (issue 38) still evaluate, resume and report:
``tests/fixtures/run_before_packages`` was written by main before the move (see tests/fixtures/README.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from cifar10_dist import api
from tests.conftest import run_in_this_process

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BEST = "best_model_2_val_accuracy=0.3250.pt"


@pytest.fixture()
def old_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "before-packages"
    shutil.copytree(FIXTURES / "run_before_packages", run_dir)
    return run_dir


def test_an_old_best_model_evaluates_to_the_accuracy_its_run_recorded(old_run):
    recorded = json.loads((old_run / "summary.json").read_text())["final"]["test"]
    result = api.evaluate(old_run / BEST, num_workers=0)
    # the fixture was computed on one CPU; another CPU's fp32 kernels may round a near tie the other way
    assert result.num_samples == recorded["num_samples"] == 40
    assert abs(result.accuracy - recorded["accuracy"]) <= 1 / 40
    assert result.loss == pytest.approx(recorded["loss"], rel=1e-3)


def test_an_old_training_checkpoint_resumes_to_the_end_the_old_code_reached(old_run, tmp_path):
    result = run_in_this_process(
        "run",
        f"--config={old_run / 'config.yaml'}",
        "--resume_from=auto",
        f"--output_path={tmp_path}",
        "--run_name=before-packages",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resume_from=auto: continuing from {old_run / 'training_checkpoint_10.pt'}" in result.stderr
    ours = torch.load(old_run / "training_checkpoint_12.pt", weights_only=True)
    theirs = torch.load(FIXTURES / "expected_checkpoint_12_before_packages.pt", weights_only=True)
    assert ours["trainer"]["iteration"] == theirs["trainer"]["iteration"] == 12
    for name, expected in theirs["model"].items():  # bit-exact on the fixture's CPU; rounding apart elsewhere
        assert torch.allclose(ours["model"][name].float(), expected.float(), rtol=1e-4, atol=1e-6), name
    # its epochs' orders drawn as the old code drew them (seed + epoch), and recorded so for a later resume
    assert json.loads((old_run / "provenance.json").read_text())["shuffle"] == "seed+epoch"


def test_an_old_run_folder_is_reported(old_run, tmp_path):
    result = run_in_this_process("report", str(old_run), f"--output={tmp_path / 'report.png'}")
    assert result.returncode == 0, result.stderr
    assert "before-packages" in result.stdout and (tmp_path / "report.png").is_file()


def test_the_run_record_reads_an_old_provenance_back_whole_and_refuses_a_field_it_does_not_have():
    """provenance.json is one typed record: an old file (and one with keys that are no longer provenance, such as
    learning_rate_found) reads back and writes out as it was; a writer's misspelt field fails at once."""
    from cifar10_dist.outputs.provenance import Provenance

    old = json.loads((FIXTURES / "run_before_packages" / "provenance.json").read_text())
    record = Provenance.from_dict(old)
    assert record.to_dict() == old and record.dataset.sha256 == old["dataset"]["sha256"]
    with_found = {**old, "learning_rate_found": {"suggestion": 0.1}, "memory_format": "channels_last: faster"}
    again = Provenance.from_dict(with_found)
    assert again.memory_format == "channels_last: faster"
    assert again.extra == {"learning_rate_found": {"suggestion": 0.1}}
    assert again.to_dict() == with_found
    with pytest.raises(AttributeError):
        record.memory_fromat = "a misspelt fact"

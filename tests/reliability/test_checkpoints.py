"""Checkpoints you can trust: atomic writes, safe loading, clear errors for damaged or foreign files."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from ignite.engine import Engine

from cifar10_dist import cli
from cifar10_dist.errors import UserError
from cifar10_dist.outputs import checkpoint_files
from cifar10_dist.training.loop import checkpointing
from tests.conftest import TINY, run_forked, run_in_this_process


@pytest.fixture(scope="module")
def finished_run(small_dataset, tmp_path_factory):
    output = tmp_path_factory.mktemp("run")
    result = run_in_this_process(
        "run", *TINY, f"--data_path={small_dataset}", f"--output_path={output}", "--run_name=r"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output / "r"


def test_a_save_interrupted_midway_leaves_no_file_under_the_final_name(tmp_path, monkeypatch):
    model = torch.nn.Linear(200, 200)
    handler = checkpointing.create_training_checkpoint({"model": model, "other": torch.nn.Linear(2, 2)}, tmp_path)
    engine = Engine(lambda engine, batch: None)
    engine.state.iteration = 7
    real_save = torch.save

    def dying_save(obj, file, **kwargs):
        real_save(obj, file, **kwargs)
        file.flush()
        file.truncate(100)  # half-written, as if killed while writing
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        handler(engine)
    assert not (tmp_path / "training_checkpoint_7.pt").exists()
    assert not list(tmp_path.glob("*.pt"))


def test_checkpoints_record_config_versions_and_world_size(finished_run):
    checkpoint = checkpoint_files.load_checkpoint(finished_run / "training_checkpoint_36.pt")
    meta = checkpoint["meta"]
    assert meta["config"]["model"] == "simple_cnn" and meta["world_size"] == 1
    assert meta["versions"]["torch"] == str(torch.__version__) and "pytorch-ignite" in meta["versions"]


def test_a_truncated_checkpoint_named_explicitly_is_a_clear_error(finished_run, small_dataset, tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes((finished_run / "training_checkpoint_36.pt").read_bytes()[:5000])
    result = run_forked(
        "run", *TINY, f"--data_path={small_dataset}", f"--output_path={tmp_path / 'out'}", f"--resume_from={broken}"
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: checkpoint '{broken}' cannot be loaded: the file is truncated or damaged")
    )


def test_a_file_that_is_no_checkpoint_is_refused_saying_so_without_a_bare_number(small_dataset, tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("hello world\n")  # torch.load raises KeyError(104): the first byte, nothing a user can read
    result = run_forked(
        "run", *TINY, f"--data_path={small_dataset}", f"--output_path={tmp_path / 'out'}", f"--teacher={text}"
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint '{text}' cannot be loaded: it is not a PyTorch checkpoint: torch.save writes a zip "
        "archive and this file is not one (give a training_checkpoint_*.pt or best_model_*.pt of a run)"
    )


def test_a_checkpoint_that_would_run_code_is_refused(small_dataset, tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    hostile = tmp_path / "hostile.pt"
    torch.save({"model": Exploit()}, hostile, pickle_module=pickle)
    for command in (
        ["evaluate", f"--checkpoint={hostile}", "--json"],
        ["run", *TINY, f"--resume_from={hostile}", f"--output_path={tmp_path / 'out'}"],
    ):
        code = cli.main([*command, f"--data_path={small_dataset}"])  # in-process: the CLI's own entry point
        stderr = capsys.readouterr().err
        assert code == 2, stderr[-2000:]
        assert "it asks to import posix.system, refused" in stderr.strip().splitlines()[-1]
        assert not marker.exists()
    with pytest.raises(UserError, match="refused"):
        checkpoint_files.load_checkpoint(hostile)
    assert not marker.exists()


def test_a_checkpoint_of_another_model_is_one_short_line_naming_both(finished_run, small_dataset, tmp_path, capsys):
    checkpoint = finished_run / "training_checkpoint_36.pt"
    code = cli.main(
        [
            "run",
            *TINY,
            f"--data_path={small_dataset}",
            f"--output_path={tmp_path}",
            "--run_name=other",
            "--model=cifar_resnet18",
            "--model_kwargs=None",
            f"--resume_from={checkpoint}",
        ]
    )
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: checkpoint '{checkpoint}' was made by model=simple_cnn, and this run builds model=cifar_resnet18: "
        "use --model=simple_cnn, or a checkpoint of cifar_resnet18"
    )
    code = cli.main(
        ["evaluate", f"--checkpoint={checkpoint}", f"--data_path={small_dataset}", "--model=cifar_resnet18"]
    )
    assert code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "was made by model=simple_cnn, and this run builds model=cifar_resnet18: use --model=simple_cnn, or a "
        "checkpoint of cifar_resnet18"
    )
    bare = tmp_path / "weights.pt"  # a bare state dict records no model: its tensors are compared
    torch.save(torch.load(checkpoint, weights_only=True)["model"], bare)
    code = cli.main(["evaluate", f"--checkpoint={bare}", "--model=cifar_resnet18", f"--data_path={small_dataset}"])
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and len(last_line) < 400, last_line
    assert last_line == (
        f"error: checkpoint '{bare}' does not fit the model this run builds: 122 tensor(s) of the "
        "model missing (e.g. conv1.weight); 20 tensor(s) the model does not have (e.g. 0.0.weight)"
    )


def test_resuming_from_a_model_only_file_says_how_to_start_from_it_and_writes_nothing(
    finished_run, small_dataset, tmp_path, capsys
):
    best = sorted(finished_run.glob("best_model_*.pt"))[-1]
    code = cli.main(
        ["run", *TINY, f"--data_path={small_dataset}", f"--output_path={tmp_path / 'out'}", f"--resume_from={best}"]
    )
    assert code == 2
    error = capsys.readouterr().err
    assert "is a best-model file (one epoch's weights, no optimizer or trainer state)" in error
    assert error.strip().endswith(f"give --pretrained={best}") and not (tmp_path / "out").exists()
    partial = tmp_path / "partial.pt"
    torch.save({"model": {}, "trainer": {}}, partial)
    assert cli.main(["run", *TINY, f"--data_path={small_dataset}", f"--resume_from={partial}"]) == 2
    assert "is not a training checkpoint (missing optimizer, lr_scheduler)" in capsys.readouterr().err

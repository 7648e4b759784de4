"""The command line as a user meets it: help, exit codes, one-line errors, nothing left behind."""

from __future__ import annotations

import dataclasses

import pytest

from cifar10_dist.config import Config
from tests.conftest import TINY, run_cli


@pytest.mark.parametrize("command", ["run", "evaluate"])
def test_help_lists_every_option_with_default_and_meaning(command):
    result = run_cli(command, "--help")
    assert result.returncode == 0
    for field in dataclasses.fields(Config):
        assert f"--{field.name}={field.default}" in result.stdout
        assert field.metadata["help"] in result.stdout


def test_prepare_data_and_top_level_help():
    top = run_cli("--help")
    assert top.returncode == 0 and "prepare-data" in top.stdout and "evaluate" in top.stdout
    prepare = run_cli("prepare-data", "--help")
    assert prepare.returncode == 0 and "--synthetic=None" in prepare.stdout and "--data_path=cifar10" in prepare.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--bacth_size=8"], "error: unknown config key 'bacth_size': did you mean 'batch_size'?"),
        (["run", "--batch_size=abc"], "error: batch_size='abc' has the wrong type: expected int"),
        (["run", "--num_warmup_epochs=3", "--num_epochs=3"], "error: num_warmup_epochs=3.0 must be at least 0 and less"),
        (["run", "--model=resnet19"], "error: model='resnet19' is unknown (did you mean 'resnet18'?)"),
        (["run", "--backend=nccl"], "error: backend='nccl' needs CUDA GPUs, but none is available here"),
        (["run", "--backend=xla-tpu"], "error: backend='xla-tpu' needs torch_xla, which is not installed"),
        (["run", "--resume_from=nope.pt"], "error: resume_from='nope.pt' does not exist"),
        (["run", "--config=nope.yaml"], "error: config file 'nope.yaml' does not exist"),
        (["evaluate"], "error: evaluate needs --checkpoint=PATH"),
        (["evaluate", "--checkpoint=nope.pt"], "error: checkpoint 'nope.pt' does not exist"),
        (["fly"], "error: unknown command 'fly': choose one of run, evaluate, prepare-data"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_leaves_no_output_folder(tmp_path, args, message):
    result = run_cli(*args, f"--output_path={tmp_path / 'out'}" if args[0] == "run" else "--json", cwd=tmp_path)
    if args[0] == "fly":
        result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli("run", "--bacth_size=8", "--debug", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "UserError: unknown config key 'bacth_size'" in result.stderr


def test_missing_data_is_explained_and_no_run_folder_is_created(tmp_path):
    result = run_cli("run", *TINY, f"--data_path={tmp_path / 'nowhere'}", f"--output_path={tmp_path / 'out'}")
    assert result.returncode == 2
    assert "put cifar-10-python.tar.gz or its extracted cifar-10-batches-py/ folder there" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "nowhere").exists()


def test_unwritable_output_path_is_reported(small_dataset, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = run_cli("run", *TINY, f"--data_path={small_dataset}", f"--output_path={blocker}")
    assert result.returncode == 2
    assert f"error: output_path='{blocker}' is not writable" in result.stderr


def test_a_corrupt_checkpoint_is_refused_with_its_name(small_dataset, tmp_path):
    bad = tmp_path / "broken.pt"
    bad.write_bytes(b"\x80\x02garbage")
    result = run_cli("evaluate", f"--checkpoint={bad}", f"--data_path={small_dataset}")
    assert result.returncode == 2
    assert f"error: checkpoint '{bad}' cannot be loaded" in result.stderr


def test_a_checkpoint_that_would_run_code_is_refused(small_dataset, tmp_path):
    import os
    import pickle

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    hostile = tmp_path / "hostile.pt"
    import torch

    torch.save({"model": Exploit()}, hostile, pickle_module=pickle)
    result = run_cli("evaluate", f"--checkpoint={hostile}", f"--data_path={small_dataset}")
    assert result.returncode == 2
    assert "refused" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()

"""The command line as a user meets it: help, exit codes, one-line errors, nothing left behind."""

from __future__ import annotations

import dataclasses

import pytest

from cifar10_dist.config import Config
from tests.conftest import run_cli


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


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli("run", "--bacth_size=8", "--debug", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "UserError: unknown config key 'bacth_size'" in result.stderr

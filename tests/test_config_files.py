"""Config files as users write and name them (issue 73): a file that is not valid YAML, names a key twice, is not
UTF-8 or is empty is one line naming the file, the line and what is wrong (exit 2, nothing written); a mistyped
name gets a "did you mean"; and a run says which file it read, shipped or not, in its log and provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cifar10_dist.config import shipped_configs
from tests.conftest import run_in_this_process

BAD_FILES = [
    (
        b"learning_rate: 0.1\n\tnum_epochs: 2\n",
        "is not valid YAML at line 2, column 1: a tab indents or separates "
        "this line, and YAML takes spaces only (replace the tab)",
    ),
    (
        b"learning_rate: 0.1\nnum_epochs: 2\nlearning_rate: 0.5\n",
        "gives 'learning_rate' twice (lines 1 and 3): keep one",
    ),
    (
        b"run_name: caf\xe9\n",
        "is not UTF-8 text at line 1, column 14: byte 0xe9 (saved as Latin-1 or Windows-1252?): save it as UTF-8",
    ),
    (b"model: simple_cnn\nmodel_kwargs: {width: 8, width: 16}\n", "gives 'width' twice (lines 2 and 2): keep one"),
]


@pytest.mark.parametrize("command", ["run", "config"])
@pytest.mark.parametrize("content, problem", BAD_FILES, ids=["tab", "twice", "latin-1", "twice-nested"])
def test_a_bad_config_file_is_one_line_naming_the_file_and_line_and_writes_nothing(tmp_path, command, content, problem):
    config = tmp_path / "my.yaml"
    config.write_bytes(content)
    result = run_in_this_process(command, f"--config={config}", f"--output_path={tmp_path / 'out'}")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: config file '{config}' {problem}\n"
    assert not (tmp_path / "out").exists()


def test_an_empty_config_and_dev_null_both_give_the_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert run_in_this_process("config", f"--config={empty}").stdout.replace(str(empty), "F") == run_in_this_process(
        "config", "--config=/dev/null"
    ).stdout.replace("/dev/null", "F")
    assert run_in_this_process("config", "--config=/dev/null").returncode == 0


@pytest.mark.parametrize(
    "given, suggestion",
    [("fats", "fast"), ("demo.yml", "demo"), ("fast_muno", "fast_muon"), ("configs/fsat.yaml", "configs/fast.yaml")],
)
def test_a_mistyped_config_name_gets_the_shipped_name_it_is_closest_to(given, suggestion):
    result = run_in_this_process("config", f"--config={given}")
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"error: config file '{given}' does not exist: did you mean '{suggestion}'? "
        "give a path to a YAML file, or the name of a shipped one"
    ), result.stderr
    assert run_in_this_process("config", f"--config={suggestion}").returncode == 0  # the advice works


def test_a_mistyped_file_name_gets_the_file_beside_it(tmp_path):
    (tmp_path / "my_experiment.yaml").write_text("num_epochs: 3\n")
    result = run_in_this_process("config", f"--config={tmp_path / 'my_experimnet.yaml'}")
    assert f"does not exist: did you mean '{tmp_path / 'my_experiment.yaml'}'? " in result.stderr


def test_a_run_names_the_config_file_it_read_in_its_log_and_provenance_and_warns_of_an_unread_namesake(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    Path("demo.yaml").write_text("num_epochs: 7\n")  # the user's own demo.yaml: --config=demo is the shipped one
    result = run_in_this_process(
        "run",
        "--config=demo",
        "--num_epochs=1",
        "--synthetic_size=64",
        "--batch_size=32",
        "--train_eval_size=0",
        "--output_path=out",
        "--run_name=shipped",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shipped = shipped_configs()["demo"]
    assert (
        "--config=demo is the shipped config of that name; the demo.yaml in this folder is not read "
        "(--config=./demo.yaml reads it)"
    ) in result.stderr
    log = (tmp_path / "out" / "shipped" / "run.log").read_text()
    assert f"INFO config file: demo (shipped: {shipped})" in log
    recorded = json.loads((tmp_path / "out" / "shipped" / "provenance.json").read_text())["config_file"]
    assert recorded == {"path": str(shipped), "shipped": True}
    assert "config_source" not in (tmp_path / "out" / "shipped" / "config.yaml").read_text()

    own = run_in_this_process("config", "--config=./demo.yaml")
    assert "num_epochs: 7\n" in own.stdout and f"path: {tmp_path / 'demo.yaml'}\n  shipped: false" in own.stdout

"""Config files as untrusted data (issue 84): an alias bomb anywhere ends in one line and exit 2 within a second and
within a few MB; merge keys work; a non-finite number is refused as its flag is; every error about a file's value
names the file and the line; a file's num_epochs settles the warmup as the flag does; a misspelt model_kwargs key
gets the factory's closest parameter; a bare or repeated --config is one line."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest

from cifar10_dist.config import load_config
from cifar10_dist.errors import UserError
from cifar10_dist.runs import resolve
from tests.conftest import cli_env, run_in_this_process

# 9 levels of 9 references to the level below: 9^9 (387 million) strings once the aliases are followed
BOMB_LEVELS = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]'] + [
    f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]" for level in range(1, 9)
]


def bomb_under(key: str) -> str:
    """The bomb as the value of ``key`` (indented under it), after two ordinary lines."""
    return "model: simple_cnn\nbatch_size: 32\n" + f"{key}:\n" + "".join(f"  {line}\n" for line in BOMB_LEVELS)


@pytest.mark.parametrize("key", ["model_kwargs", "num_epochs", "bomb"])
def test_an_alias_bomb_under_any_key_is_one_line_within_a_second_and_nothing_is_written(tmp_path, key):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb_under(key))
    started = time.perf_counter()
    result = run_in_this_process("run", f"--config={path}", f"--output_path={tmp_path / 'out'}")
    assert time.perf_counter() - started < 1.0
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"error: config file '{path}' line 3: the value there holds more than 100,000 values once its aliases "
        "(*name) are followed: a config holds a few hundred; write the values out\n"
    )
    assert not (tmp_path / "out").exists()


def test_an_alias_bomb_costs_the_cli_a_few_mb_at_most(tmp_path):
    """In a new interpreter (its peak memory its own): the bomb's against an empty file's, both refused or read."""
    bomb, empty = tmp_path / "bomb.yaml", tmp_path / "empty.yaml"
    bomb.write_text(bomb_under("model_kwargs"))
    empty.write_text("")
    peaks = []
    for path in (empty, bomb):
        code = (
            "import resource, sys\nfrom cifar10_dist.cli import main\n"
            f"code = main(['config', '--config={path}'])\n"
            "print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)"
        )
        result = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=60)
        code_and_peak = result.stderr.split()[-2:]
        peaks.append(int(code_and_peak[1]))
    assert code_and_peak[0] == "2"
    assert peaks[1] - peaks[0] < 20_000  # KiB: the bomb's parse, never its expansion
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0


def test_an_alias_that_holds_itself_is_one_line(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("model: simple_cnn\nmodel_kwargs: &self\n  inner: *self\n")
    with pytest.raises(
        UserError, match=rf"^config file '{path}' line 2: an alias \(\*name\) in the value there refers to the value"
    ):
        load_config(path)


def test_merge_keys_work_as_yaml_defines_them(tmp_path):
    path = tmp_path / "merged.yaml"
    path.write_text("model: simple_cnn\nmodel_kwargs:\n  <<: {width: 8}\n")
    assert load_config(path).model_kwargs == {"width": 8}
    path.write_text("model: simple_cnn\nmodel_kwargs: &wide\n  width: 64\nteacher_kwargs:\n  <<: *wide\n  width: 8\n")
    with pytest.raises(UserError, match=rf"^{path} line 4: unknown config key 'teacher_kwargs'"):
        load_config(path)  # (the merge itself read: the refusal is the key's)
    path.write_text("model: simple_cnn\nmodel_kwargs:\n  <<: {width: 64}\n  width: 8\n")
    assert load_config(path).model_kwargs == {"width": 8}  # a key of its own overrides the merged one


@pytest.mark.parametrize(
    "key, value",
    [
        ("learning_rate", ".inf"),
        ("weight_decay", ".nan"),
        ("lr_end", "-.inf"),
        ("adam_eps", ".inf"),
        ("muon_lr", ".inf"),
        ("distill_temperature", ".inf"),
    ],
)
def test_a_non_finite_number_in_a_file_is_refused_naming_the_file_and_line(tmp_path, key, value):
    path = tmp_path / "inf.yaml"
    path.write_text(f"model: simple_cnn\n{key}: {value}\n")
    result = run_in_this_process("run", f"--config={path}", f"--output_path={tmp_path / 'out'}")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {path} line 2: {key}=") and "is not a finite number" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_non_finite_flag_and_model_kwargs_value_are_refused_too():
    with pytest.raises(UserError, match=r"^learning_rate=inf is not a finite number: give one such as 0.4$"):
        load_config(None, learning_rate=float("1e999"))  # what fire makes of --learning_rate=1e999
    with pytest.raises(UserError, match="model_kwargs=.* holds a value JSON cannot carry"):
        load_config(None, model_kwargs={"width": float("inf")})


@pytest.mark.parametrize(
    "content, line, problem",
    [
        (
            "num_epochs: 1e3\n",
            2,
            "num_epochs='1e3' has the wrong type: expected int (YAML reads 1e3 as text; write 1000)",
        ),
        (
            "learning_rate: 1e-3\n",
            2,
            "learning_rate='1e-3' has the wrong type: expected float or find (YAML reads 1e-3 as text; write 0.001)",
        ),
        ("batch_size: 0\n", 2, "batch_size=0 must be"),
        ("optimizer: adamm\n", 2, "optimizer='adamm' is unknown: did you mean 'adamw'? choose"),
        ("num_epochs: 3\nnum_warmup_epochs: 5\n", "2 and 3", "num_warmup_epochs=5.0 must be at least 0"),
    ],
)
def test_every_error_about_a_value_of_the_file_names_the_file_and_line(tmp_path, content, line, problem):
    path = tmp_path / "my.yaml"
    path.write_text("model: simple_cnn\n" + content)
    lines = f"line {line}" if isinstance(line, int) else f"lines {line}"
    with pytest.raises(UserError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"{path} {lines}: {problem}")


def test_a_flag_that_replaces_the_files_value_is_its_own_error_without_the_files_line(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("model: simple_cnn\nbatch_size: 32\n")
    with pytest.raises(UserError, match=r"^batch_size=0 must be"):
        load_config(path, batch_size=0)


def test_num_epochs_1_in_a_file_settles_the_warmup_as_the_flag_does(tmp_path, capsys):
    path = tmp_path / "short.yaml"
    path.write_text("model: simple_cnn\nbatch_size: 32\nnum_epochs: 1\n")
    from_file = resolve(path)
    from_flag = resolve(None, model="simple_cnn", batch_size=32, num_epochs=1)
    assert from_file.num_warmup_epochs == from_flag.num_warmup_epochs == 0.2
    assert "num_warmup_epochs=1.0 (the default) scaled to 0.2 for num_epochs=1" in capsys.readouterr().err
    path.write_text("num_epochs: 1\nnum_warmup_epochs: 1\n")  # both in the file: at odds with itself, refused
    with pytest.raises(UserError, match=rf"^{path} lines 1 and 2: num_warmup_epochs=1.0 must be"):
        load_config(path)


def test_a_misspelt_model_kwargs_key_gets_the_factorys_closest_parameter_and_the_files_line(tmp_path, small_dataset):
    path = tmp_path / "kw.yaml"
    path.write_text("model: simple_cnn\nnum_epochs: 2\nmodel_kwargs:\n  widht: 8\n")
    result = run_in_this_process(
        "run", f"--config={path}", f"--data_path={small_dataset}", f"--output_path={tmp_path / 'out'}"
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {path} lines 1 and 3: model_kwargs={{'widht': 8}}: 'widht' is not a parameter of "
        "model='simple_cnn': did you mean 'width'? it takes width, num_classes\n"
    )
    assert not (tmp_path / "out").exists()
    flagged = run_in_this_process(
        "run", "--model=simple_cnn", '--model_kwargs={"widht": 8}', f"--data_path={small_dataset}"
    )
    assert flagged.stderr.startswith(
        "error: model_kwargs={'widht': 8}: 'widht' is not a parameter of model='simple_cnn'"
    )


@pytest.mark.parametrize("command", ["run", "config", "lr-find", "batch-size"])
def test_a_bare_config_flag_is_one_line(command):
    result = run_in_this_process(command, "--config")
    assert result.returncode == 2
    assert result.stderr.startswith("error: --config needs a value: the name of a shipped config (default, demo,")
    assert result.stderr.endswith(" or the path of a YAML file, e.g. --config=demo\n")


def test_config_given_twice_is_one_line_and_a_name_in_capitals_gets_its_suggestion():
    twice = run_in_this_process("config", "--config=demo", "--config=fast")
    assert (twice.returncode, twice.stderr) == (
        2,
        "error: --config is given twice (demo, then fast): give one config file (flags change its keys)\n",
    )
    capitals = run_in_this_process("config", "--config=DEMO")
    assert capitals.returncode == 2 and "does not exist: did you mean 'demo'? " in capitals.stderr
    assert (
        run_in_this_process("config", "--config=demo", "--num_epochs=3", "--num_epochs=2").returncode == 0
    )  # last wins

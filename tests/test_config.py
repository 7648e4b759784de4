"""The config: precedence, type coercion, and a clear error for every impossible value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from cifar10_dist.cli.help_pages import options_reference
from cifar10_dist.config import FIELDS, Config, load_config
from cifar10_dist.data import loader_workers
from cifar10_dist.errors import UserError
from cifar10_dist.runs import resolve
from tests.conftest import REPO, TINY, run_in_this_process


def test_defaults_are_the_ignite_tutorials():
    config = load_config()
    assert (config.seed, config.data_path, config.output_path, config.model) == (
        543,
        "cifar10",
        "output-cifar10/",
        "resnet18",
    )
    assert (config.batch_size, config.momentum, config.nesterov, config.weight_decay) == (512, 0.9, True, 1e-4)
    assert (config.learning_rate, config.num_epochs, config.num_warmup_epochs, config.validate_every) == (0.4, 5, 1, 3)
    assert (config.checkpoint_every, config.log_every_iters) == (200, 15)
    # the tutorial's 2 DataLoader workers where it trains (a GPU); none on a CPU, where reading in the training
    # process is faster (the batches are the same either way)
    assert config.num_workers == "auto"
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (loader_workers.workers_for("auto", cuda, None, 3, 1), loader_workers.workers_for("auto", cpu)) == (2, 0)
    assert loader_workers.workers_for(3, cpu) == 3 and load_config(None, num_workers="AUTO").num_workers == "auto"
    assert (config.with_amp, config.backend, config.resume_from, config.epoch_length) == (False, None, None, None)


def test_command_line_overrides_yaml_which_overrides_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"batch_size": 64, "num_epochs": 7}))
    config = load_config(path, num_epochs=9)
    assert config.batch_size == 64  # from the file
    assert config.num_epochs == 9  # the override wins
    assert config.learning_rate == 0.4  # default


def test_values_are_coerced_to_the_field_type():
    config = load_config(learning_rate=1, run_name=7, nesterov="false", epoch_length="None")
    assert config.learning_rate == 1.0 and isinstance(config.learning_rate, float)
    assert config.run_name == "7"
    assert config.nesterov is False
    assert config.epoch_length is None


def test_shipped_configs_are_valid():
    from pathlib import Path

    configs = [
        path
        for path in sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
        if not path.name.startswith("space_")
    ]  # search spaces: tests/test_tuning.py
    assert configs, "configs/ is empty"
    for path in configs:
        load_config(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"bacth_size": 4}, "unknown config key 'bacth_size': did you mean 'batch_size'?"),
        ({"zzz": 1}, "unknown config key 'zzz': run with --help"),
        ({"batch_size": "big"}, "batch_size='big' has the wrong type: expected int"),
        ({"batch_size": 2.5}, "batch_size=2.5 has the wrong type: expected int"),
        ({"nesterov": "maybe"}, "nesterov='maybe' has the wrong type: expected bool"),
        ({"learning_rate": None}, "learning_rate=None is not accepted: expected float"),
        ({"batch_size": 0}, "batch_size=0 must be at least 1"),
        ({"learning_rate": -0.1}, "learning_rate=-0.1 must be greater than 0"),
        ({"momentum": 1.5}, "momentum=1.5 must be in [0, 1)"),
        ({"weight_decay": -1}, "weight_decay=-1.0 must be 0 or more"),
        ({"num_epochs": 0}, "num_epochs=0 must be at least 1"),
        ({"num_warmup_epochs": 5}, "num_warmup_epochs=5.0 must be at least 0 and less than num_epochs=5"),
        ({"num_warmup_epochs": -1}, "num_warmup_epochs=-1.0 must be at least 0"),
        ({"epoch_length": 0}, "epoch_length=0 must be at least 1"),
        ({"validate_every": 0}, "validate_every=0 must be at least 1"),
        ({"checkpoint_every": 0}, "checkpoint_every=0 must be at least 1"),
        ({"num_workers": -1}, "num_workers=-1 must be 0 or more"),
        ({"dataset": "mnist"}, "dataset='mnist' is unknown: choose one of cifar10, cifar100, synthetic"),
        ({"label_mode": "super"}, "label_mode='super' is unknown: choose fine or coarse"),
        ({"label_mode": "coarse"}, "label_mode='coarse' is for dataset=cifar100 (its 20 superclasses)"),
        ({"ema_decay": 1.0}, "ema_decay=1.0 must be in (0, 1), e.g. 0.999"),
        ({"backend": "mpi"}, "backend='mpi' is unknown: choose one of gloo, nccl, xla-tpu, horovod"),
        ({"nproc_per_node": 2}, "nproc_per_node=2 needs a distributed backend: add --backend=gloo"),
        ({"backend": "gloo", "nproc_per_node": 0}, "nproc_per_node=0 must be >= 1"),
        ({"backend": "gloo", "nproc_per_node": 1, "nnodes": 2}, "node_rank=None must be given and in 0..1"),
        ({"backend": "gloo", "nproc_per_node": 1, "nnodes": 2, "node_rank": 1}, "nnodes=2 needs master_addr"),
        ({"backend": "gloo", "master_port": 70000}, "master_port=70000 must be in 1..65535"),
        ({"run_name": "a/b"}, "run_name='a/b' must be a plain folder name"),
        ({"flip": "sometimes"}, "flip='sometimes' is unknown: choose one of random, alternating, none"),
        ({"crop_pad_mode": "wrap"}, "crop_pad_mode='wrap' is unknown: choose zeros or reflect"),
        ({"crop_padding": 20}, "crop_padding=20 must be in 0..16 pixels"),
        ({"tta": 3}, "tta=3 is not accepted: choose 0 (none), 1 (mirror) or 2 (mirror + shifts)"),
        ({"label_smoothing": 1.0}, "label_smoothing=1.0 must be in [0, 1)"),
        ({"bias_lr_scale": 0}, "bias_lr_scale=0.0 must be greater than 0"),
        ({"whitening_bias_epochs": -1}, "whitening_bias_epochs=-1.0 must be greater than 0"),
        ({"lr_end": -0.1}, "lr_start=0.0 and lr_end=-0.1 must be 0 or more"),
        ({"compile": True, "backend": "xla-tpu"}, "compile=True is not supported with backend xla-tpu"),
        ({"accumulation_steps": 0}, "accumulation_steps=0 must be at least 1"),
        (
            {"accumulation_steps": 3, "checkpoint_every": 200},
            "checkpoint_every=200 must be a multiple of accumulation_steps=3: checkpoints are taken after",
        ),
        (
            {"accumulation_steps": 2, "periodic_averaging": True},
            "periodic_averaging=True counts iterations as optimizer steps",
        ),
        ({"early_stopping_patience": 0, "val_split": 0.1}, "early_stopping_patience=0 must be at least 1"),
        (
            {"early_stopping_patience": 3},
            "early_stopping_patience=3 needs val_split > 0 (e.g. --val_split=0.1): "
            "with val_split=0 it would stop on test accuracy",
        ),
        (
            {"early_stopping_patience": 3, "val_split": 0.1, "early_stopping_min_delta": -0.01},
            "early_stopping_min_delta=-0.01 must be 0 or more",
        ),
    ],
)
def test_bad_values_are_rejected_with_a_message_naming_them(overrides, message):
    with pytest.raises(UserError) as error:
        load_config(**overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_key_in_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("# my run\nmodel: simple_cnn\nlearning_rat: 0.1\n")
    with pytest.raises(
        UserError, match=rf"^{path} line 3: unknown config key 'learning_rat': did you mean 'learning_rate'\?$"
    ):
        load_config(path)


@pytest.mark.parametrize(
    ("content", "message"), [("- a\n- b\n", "must hold a mapping"), ("a: [1\n", "is not valid YAML")]
)
def test_malformed_yaml_is_rejected(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_config(path)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(UserError, match="config file '.*nope.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_the_reference_lists_every_key_with_default_and_meaning_but_the_internal_ones():
    text = options_reference()
    # set by tune and by learning_rate=find themselves, never by a user
    assert "`trial`" not in text and "`mlflow_parent_run`" not in text and "`lr_found`" not in text
    for field in dataclasses.fields(Config):
        if field.metadata["internal"]:
            continue
        row = next(line for line in text.splitlines() if line.startswith(f"| `{field.name}` |"))
        assert f"| `{field.default}` |" in row.replace("`None`", "`None`")
        assert field.metadata["help"].replace("|", "/") in row
        assert len(field.metadata["short"]) <= 45, field.name  # a few words, on a line of --help


def test_docs_list_the_options_exactly_as_the_declarations_say():
    page = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert options_reference() in page, (
        "regenerate the reference in docs/configuration.md from cifar10_dist.cli.help_pages.options_reference()"
    )


def test_a_checkpoint_interval_not_given_explicitly_is_rounded_up_to_whole_optimizer_steps(capsys):
    """Loading notes the value and leaves it; the planner (config_fitting, as the config resolves) rounds it."""
    loaded = load_config("configs/demo.yaml", accumulation_steps=3)
    assert loaded.checkpoint_every == 50
    assert loaded.fit_to_the_run == {"checkpoint_every": {"source": "from configs/demo.yaml"}}
    assert capsys.readouterr().err == ""  # loading decides nothing and says nothing
    assert resolve("configs/demo.yaml", accumulation_steps=3).checkpoint_every == 51
    assert capsys.readouterr().err.endswith(
        " INFO checkpoint_every=50 (from configs/demo.yaml) rounded up to 51, a multiple of accumulation_steps=3: "
        "checkpoints are taken after optimizer steps\n"
    )
    assert resolve(None, accumulation_steps=4).checkpoint_every == 200  # already a multiple: no line
    assert capsys.readouterr().err == ""
    assert resolve(None, accumulation_steps=3).checkpoint_every == 201
    assert "checkpoint_every=200 (the default) rounded up to 201" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"^checkpoint_every=50 must be a multiple of accumulation_steps=3: "):
        resolve("configs/demo.yaml", accumulation_steps=3, checkpoint_every=50)  # given: refused as before


def test_the_rounded_checkpoint_interval_is_what_a_run_uses(tmp_path):
    config = tmp_path / "every4.yaml"
    config.write_text("checkpoint_every: 4\n")
    result = run_in_this_process(
        "run",
        f"--config={config}",
        *TINY,
        "--dataset=synthetic",
        "--synthetic_size=320",
        "--accumulation_steps=3",
        "--epoch_length=6",
        "--train_eval_size=0",
        f"--output_path={tmp_path}",
        "--run_name=acc",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rounded = f"INFO checkpoint_every=4 (from {config}) rounded up to 6, a multiple of accumulation_steps=3"
    assert rounded in result.stderr
    assert sorted(path.name for path in (tmp_path / "acc").glob("training_checkpoint_*.pt")) == [
        "training_checkpoint_12.pt",
        "training_checkpoint_6.pt",
    ]


SHIPPED_CONFIGS = sorted(
    f"configs/{path.name}"
    for path in (Path(__file__).resolve().parents[1] / "configs").glob("*.yaml")
    if not path.name.startswith("space_")
)


@pytest.mark.parametrize("config", SHIPPED_CONFIGS)
def test_every_shipped_config_takes_num_epochs_1_with_its_warmup_scaled(config):
    """A smoke test's --num_epochs=1 on any shipped config: the file's warmup becomes the same share of the run."""
    planned = yaml.safe_load(Path(config).read_text())
    warmup, epochs = planned.get("num_warmup_epochs", 1.0), planned.get("num_epochs", 5)
    result = run_in_this_process("config", f"--config={config}", "--num_epochs=1")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["num_epochs"] == 1 and resolved["num_warmup_epochs"] == pytest.approx(round(warmup / epochs, 4))
    assert resolved["num_warmup_epochs"] < 1


def test_a_warmup_not_given_explicitly_is_scaled_into_a_shorter_run_and_a_given_one_is_refused(capsys, tmp_path):
    loaded = load_config("configs/fast.yaml", num_epochs=1)
    assert loaded.num_warmup_epochs == 2.3  # loading notes it for the planner and leaves it
    assert loaded.fit_to_the_run == {"num_warmup_epochs": {"source": "from configs/fast.yaml", "planned_epochs": 10}}
    assert resolve("configs/fast.yaml", num_epochs=1).num_warmup_epochs == 0.23
    assert capsys.readouterr().err.endswith(
        " INFO num_warmup_epochs=2.3 (from configs/fast.yaml) scaled to 0.23 for num_epochs=1: the same share of the "
        "run as 2.3 of 10 epochs\n"
    )
    assert resolve(loaded, seed=3).num_warmup_epochs == 0.23  # a loaded config changed by keyword, as train(...)
    assert "(from configs/fast.yaml) scaled to 0.23" in capsys.readouterr().err
    assert resolve(None, num_epochs=2).num_warmup_epochs == 1.0  # fits: left as it is, no line
    assert capsys.readouterr().err == ""
    assert resolve(None, num_epochs=1).num_warmup_epochs == 0.2
    assert "num_warmup_epochs=1.0 (the default) scaled to 0.2 for num_epochs=1" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"^num_warmup_epochs=1.0 must be at least 0 and less than num_epochs=1$"):
        resolve("configs/fast.yaml", num_epochs=1, num_warmup_epochs=1.0)  # both given: refused as before
    broken = tmp_path / "broken.yaml"
    broken.write_text("num_epochs: 2\nnum_warmup_epochs: 3\n")
    with pytest.raises(
        UserError,
        match=rf"^{broken} lines 1 and 2: num_warmup_epochs=3.0 must be at least 0 and less than num_epochs=2$",
    ):
        load_config(broken)  # a file at odds with itself: refused, naming the lines


def test_a_shipped_config_shortened_to_one_epoch_trains(tmp_path):
    result = run_in_this_process(
        "run",
        "--config=configs/fast.yaml",
        "--num_epochs=1",
        "--dataset=synthetic",
        "--synthetic_size=256",
        "--batch_size=64",
        "--epoch_length=3",
        "--num_workers=0",
        "--train_eval_size=0",
        "--tta=0",
        "--with_amp=False",
        f"--output_path={tmp_path}",
        "--run_name=smoke",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "num_warmup_epochs=2.3 (from configs/fast.yaml) scaled to 0.23 for num_epochs=1" in result.stderr
    assert yaml.safe_load((tmp_path / "smoke" / "config.yaml").read_text())["num_warmup_epochs"] == 0.23


def test_a_trial_spec_is_typed_and_survives_config_yaml(tmp_path):
    """tune's trial key: a TrialSpec with its PrunerSpec, written to config.yaml as a mapping and read back equal;
    a mapping that is not a trial is refused in one line naming the key."""
    from cifar10_dist.config import PrunerSpec, TrialSpec

    spec = TrialSpec(
        study="s",
        storage="sqlite:///x.db",
        number=3,
        params={"learning_rate": 0.1},
        pruner=PrunerSpec(name="hyperband", max_epochs=4),
    )
    config = load_config(None, val_split=0.1, trial=spec)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config.to_dict()))
    again = load_config(tmp_path / "config.yaml")
    assert again.trial == spec and isinstance(again.trial.pruner, PrunerSpec) and again.trial.pruner.max_epochs == 4
    with pytest.raises(UserError, match=r"^trial=\{'study': 's'\} is not a tuning trial: expected study, storage"):
        load_config(None, val_split=0.1, trial={"study": "s"})


def test_a_recorded_config_reads_back_as_a_config_whatever_release_wrote_it():
    """A checkpoint's meta holds ``Config.replayable()``; ``Config.from_record`` reads it back typed: this release's
    record as it was, an older release's (a key added since missing, a key since removed present) with the new key
    at its default, a trial's spec as a TrialSpec again."""
    import dataclasses

    from cifar10_dist.config import PrunerSpec, TrialSpec

    trial = TrialSpec("s", "sqlite:///s.db", 3, {"learning_rate": 0.1}, PrunerSpec("hyperband", 2, 1, 4))
    now = dataclasses.replace(
        load_config(None, model="simple_cnn", num_epochs=3, grad_compression="bf16", backend="gloo", nproc_per_node=2),
        trial=trial,
    )
    assert Config.from_record(now.replayable()) == dataclasses.replace(now, resume_from=None)
    older = {key: value for key, value in now.replayable().items() if key != "grad_compression"}
    read = Config.from_record({**older, "a_key_since_removed": 1})
    assert read.grad_compression == Config().grad_compression and read.num_epochs == 3
    assert read.trial == trial and isinstance(read.trial.pruner, PrunerSpec)


def test_an_older_runs_config_with_keys_since_renamed_loads_and_says_so_once(capsys):
    """tests/fixtures/run_before_packages/config.yaml names lookahead and keep_freed_memory (renamed since:
    periodic_averaging, reuse_freed_memory): it loads with their values, a line for each old name, once."""
    from cifar10_dist.config import RENAMED, loading

    loading._SAID_RENAMED.clear()
    old = REPO / "tests" / "fixtures" / "run_before_packages" / "config.yaml"
    written = old.read_text()
    assert "lookahead: false" in written and "keep_freed_memory: true" in written
    config = load_config(old)
    assert (config.periodic_averaging, config.reuse_freed_memory) == (False, True)
    said = capsys.readouterr().err
    assert "config key 'lookahead' is now 'periodic_averaging': the old name still works" in said
    assert "config key 'keep_freed_memory' is now 'reuse_freed_memory'" in said
    load_config(old)
    assert "is now" not in capsys.readouterr().err  # once a process
    assert load_config(None, half_weights=False, select_fraction=0.5).select_hardest_fraction == 0.5
    with pytest.raises(UserError, match="^'lookahead' and 'periodic_averaging' are the same key"):
        load_config(None, lookahead=True, periodic_averaging=True)
    assert set(RENAMED.values()) <= set(FIELDS)


def test_a_key_declared_only_with_another_names_a_key_and_one_of_its_values():
    """A mistyped ``only_with`` would turn its key's resume check off without a word."""
    from cifar10_dist.config import ONLY_WITH, choices

    assert ONLY_WITH == {
        "powersgd_rank": ("grad_compression", "powersgd"),
        "powersgd_start_step": ("grad_compression", "powersgd"),
    }
    for needed, value in ONLY_WITH.values():
        assert needed in FIELDS and value in choices(needed)


def test_a_key_takes_effect_only_where_the_key_it_needs_has_its_value():
    from cifar10_dist.config import takes_effect

    assert takes_effect("powersgd_rank", {"grad_compression": "powersgd"})
    assert not takes_effect("powersgd_rank", {"grad_compression": "bf16"})
    assert not takes_effect("powersgd_rank", {})  # a record from before compression existed
    assert takes_effect("learning_rate", {})  # a key with no condition always does

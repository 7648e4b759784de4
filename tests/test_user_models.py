"""Your own model: ``--model=package.module:factory`` or ``--model=path/to/file.py:factory`` with ``--model_kwargs``,
trained by spawned workers, recorded in config.yaml and checkpoints, rebuilt by evaluate and resume; every bad
reference refused in one line before anything starts."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import SPAWN_2, TINY, run_in_this_process

# A user's module: a small CNN whose width is a factory argument.
USER_MODULE = textwrap.dedent("""\
    from torch import nn


    def small_cnn(width: int = 8) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10),
        )
    """)


def write_user_module(folder: Path, name: str = "mynets.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(USER_MODULE)
    return path


@pytest.mark.slow  # spawned workers
def test_module_reference_trains_in_spawned_workers_and_evaluate_rebuilds_it(small_dataset, tmp_path, monkeypatch):
    """Spawned gloo workers import mynets by name from the current folder (searchable as with python -m); the
    reference and kwargs are in config.yaml and the checkpoint; evaluate needs no --model."""
    code = tmp_path / "code"
    write_user_module(code)
    monkeypatch.chdir(code)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the import may add the current folder
    monkeypatch.delitem(sys.modules, "mynets", raising=False)
    output = tmp_path / "out"
    result = run_in_this_process(
        "run",
        *TINY,
        *SPAWN_2,
        "--model=mynets:small_cnn",
        '--model_kwargs={"width": 6}',
        "--channels_last=True",
        f"--data_path={small_dataset}",
        f"--output_path={output}",
        "--run_name=mine",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = output / "mine"
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert recorded["model"] == "mynets:small_cnn" and recorded["model_kwargs"] == {"width": 6}
    checkpoint = torch.load(run_dir / "training_checkpoint_36.pt", weights_only=True)
    assert checkpoint["meta"]["config"]["model_kwargs"] == {"width": 6}
    assert checkpoint["model"]["0.weight"].shape == (6, 3, 3, 3)  # the factory got width=6
    final = json.loads((run_dir / "metrics.json").read_text())["test"]
    evaluated = run_in_this_process(
        "evaluate", f"--checkpoint={run_dir / 'training_checkpoint_36.pt'}", "--json", "--num_workers=0"
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["accuracy"] == pytest.approx(final["accuracy"])


def test_file_reference_is_recorded_absolute_and_a_run_resumes_from_its_config_elsewhere(
    small_dataset, tmp_path, monkeypatch
):
    """A relative file.py reference is made absolute, so that the run folder's config.yaml continues the run
    from any folder; the resumed run ends with the uninterrupted run's weights."""
    monkeypatch.chdir(tmp_path)
    write_user_module(tmp_path / "models", "net.py")
    whole = run_in_this_process(
        "run",
        *TINY,
        "--model=models/net.py:small_cnn",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path / 'out'}",
        "--checkpoint_every=18",
        "--run_name=whole",
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    config = tmp_path / "out" / "whole" / "config.yaml"
    assert yaml.safe_load(config.read_text())["model"] == f"{tmp_path / 'models' / 'net.py'}:small_cnn"
    monkeypatch.chdir(tmp_path / "out")
    resumed = run_in_this_process(
        "run",
        f"--config={config}",
        "--run_name=resumed",
        f"--resume_from={tmp_path / 'out' / 'whole' / 'training_checkpoint_18.pt'}",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    weights = [
        torch.load(tmp_path / "out" / name / "training_checkpoint_36.pt", weights_only=True)["model"]
        for name in ("whole", "resumed")
    ]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


BAD_MODULE = textwrap.dedent("""\
    from torch import nn

    WIDTH = 3


    def raises():
        raise ValueError("width must be even")


    def not_a_module():
        return {"layers": 3}


    def five_outputs():
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 5))


    def broken_forward():
        return nn.Linear(3, 10)


    def small(width=4):
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    """)


@pytest.mark.parametrize(
    ("model", "extra", "expected"),
    [
        ("nets.py:raises", [], "the factory raised ValueError: width must be even"),
        ("nets.py:not_a_module", [], "the factory returned a dict, not a torch.nn.Module"),
        ("nets.py:five_outputs", [], "returned (2, 5) for a (2, 3, 32, 32) batch: expected a tensor of shape (2, 10)"),
        (
            "nets.py:broken_forward",
            [],
            "the model's forward on a (2, 3, 32, 32) batch raised RuntimeError: mat1 and mat2",
        ),
        ("nets.py:WIDTH", [], "WIDTH is not callable (it is of type int)"),
        ("nets.py:smal", [], "has no attribute 'smal' (did you mean 'small'?)"),
        ("nets.py:small", ['--model_kwargs={"widht": 8}'], "model_kwargs={'widht': 8}: 'widht' is not a parameter of"),
        ("missing.py:small", [], "missing.py does not exist"),
        ("broken.py:small", [], "importing"),
        ("no_such_package.nets:small", [], "cannot import no_such_package.nets: ModuleNotFoundError"),
        ("nets.py:", [], "is not a model reference: write package.module:factory or path/to/file.py:factory"),
        (
            "simple_cnn",
            ['--model_kwargs={"depth": 3}'],
            "model_kwargs={'depth': 3}: 'depth' is not a parameter of model='simple_cnn': it takes width, num_classes",
        ),
        ("simple_cnn", ["--model_kwargs=[3]"], "model_kwargs=[3] must be a JSON object with string keys"),
        ("simple_cnn", ["--model_kwargs={bad json"], "is not valid JSON"),
    ],
)
def test_a_bad_model_is_one_line_before_any_process_starts(tmp_path, monkeypatch, model, extra, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets.py").write_text(BAD_MODULE)
    (tmp_path / "broken.py").write_text("import a_module_that_is_not_there\n")
    result = run_in_this_process("run", f"--model={model}", *extra, *SPAWN_2, f"--output_path={tmp_path / 'out'}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0]
    if ":" in model:
        assert "model='" in lines[0] and Path(model.split(":")[0]).name in lines[0]  # names the reference
    assert not (tmp_path / "out").exists()  # refused before anything was created


def test_the_documented_example_module_is_the_shipped_file_and_passes_the_checks():
    from cifar10_dist import models
    from tests.conftest import REPO

    module = (REPO / "examples" / "my_model.py").read_text()
    assert f"```python\n{module}```" in (REPO / "docs" / "models-in-and-out.md").read_text()
    models.check_model(f"{REPO / 'examples' / 'my_model.py'}:small_cnn", {"width": 16})
    assert models.build_model(f"{REPO / 'examples' / 'my_model.py'}:small_cnn", {"width": 16})[0][0].out_channels == 16


def test_a_network_registered_by_the_decorator_is_a_built_in_name(monkeypatch):
    """The built-in networks are a registry filled by ``@register_model`` (timm's way), not an if-chain: a name
    registered so is checked, listed and built like airbench."""
    from torch import nn

    from cifar10_dist.models import networks

    monkeypatch.setattr(networks, "REGISTRY", dict(networks.REGISTRY))
    assert list(networks.REGISTRY)[:5] == [
        "simple_cnn",
        "airbench",
        "cifar_resnet18",
        "cifar_resnet34",
        "cifar_resnet50",
    ]

    @networks.register_model("tiny_linear")
    def tiny(num_classes: int = 10, width: int = 4) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.Linear(width, num_classes))

    networks.check_model_name("tiny_linear")
    assert "tiny_linear" in networks.available_models()
    built = networks.build_model("tiny_linear", {"width": 6}, num_classes=3)
    assert built[1].out_features == 6 and built[2].out_features == 3


# A user's network that means to be whitened from data but declares its whitening layer as a Linear.
HALF_WHITENED_MODULE = textwrap.dedent("""\
    import torch
    from torch import nn


    class HalfWhitened(nn.Module):
        def __init__(self):
            super().__init__()
            self.whiten = nn.Linear(3 * 32 * 32, 16)
            self.head = nn.Linear(16, 10)
            self.initialised = False

        def init_whitening(self, images: torch.Tensor) -> None:
            self.initialised = True

        def forward(self, x):
            return self.head(torch.relu(self.whiten(x.flatten(1))))
    """)


def test_a_model_declaring_half_the_whitening_trait_trains_plain_and_says_what_it_lacks(small_dataset, tmp_path):
    """init_whitening without a Conv2d ``whiten`` or ``whitening_bias_frozen``: the run trains the model as a plain
    one (no whitening from data, no bias group) and says so in one warning that names both missing parts."""
    from cifar10_dist.recipes import whitened

    whitened.warned_classes.clear()  # (a class warned of in this process before is not warned of again)
    path = tmp_path / "halfnet.py"
    path.write_text(HALF_WHITENED_MODULE)
    result = run_in_this_process(
        "run",
        *TINY,
        f"--model={path}:HalfWhitened",
        "--model_kwargs={}",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path / 'out'}",
        "--run_name=half",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "has init_whitening but lacks" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
    assert (
        "model HalfWhitened has init_whitening but lacks whiten as an nn.Conv2d (it is Linear) and "
        "whitening_bias_frozen: it trains as a plain model" in warnings[0]
    )

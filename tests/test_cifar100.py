"""CIFAR-100: the cifar-100-python layout (fine and coarse labels), the right number of classes in every model,
and its class names in evaluate, predict and export."""

from __future__ import annotations

import json
import pickle
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

from cifar10_dist.data import cifar, cifar_layouts
from cifar10_dist.errors import UserError
from tests.conftest import TINY, TINY_WIDTH, run_in_this_process


@pytest.fixture(scope="module")
def cifar100(tmp_path_factory):
    """600 training and 200 test images written by prepare-data in the CIFAR-100 layout."""
    root = tmp_path_factory.mktemp("cifar100")
    result = run_in_this_process(
        "prepare-data", "--dataset=cifar100", f"--data_path={root}", "--synthetic=600", "--synthetic_test=200"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote 600 synthetic training and 200 test images to {root / 'cifar-100-python'}"
    return root


def test_the_layout_reads_back_with_fine_and_coarse_labels_and_is_checked(cifar100, tmp_path):
    folder = cifar100 / "cifar-100-python"
    assert sorted(path.name for path in folder.iterdir()) == ["meta", "test", "train"]
    fine_train, fine_test = cifar.read_cifar100(folder, "fine")
    coarse_train, _ = cifar.read_cifar100(folder, "coarse")
    assert len(fine_train) == 600 and len(fine_test) == 200 and fine_train.labels.max() < 100
    assert len(set(fine_train.labels.tolist())) > 90  # the synthetic labels cover (nearly) all 100 classes
    assert torch.equal(coarse_train.labels, fine_train.labels // 5) and torch.equal(
        coarse_train.images, fine_train.images
    )
    meta = pickle.loads((folder / "meta").read_bytes())
    assert meta["fine_label_names"] == list(cifar_layouts.class_names("cifar100"))
    assert len(meta["coarse_label_names"]) == 20
    bad = tmp_path / "cifar-100-python"
    bad.mkdir()
    entry = pickle.loads((folder / "train").read_bytes())
    entry["fine_labels"][3] = 100
    (bad / "train").write_bytes(pickle.dumps(entry))
    (bad / "test").write_bytes((folder / "test").read_bytes())
    with pytest.raises(UserError, match=r"train: label 100 is out of range: fine_labels must be 0\.\.99"):
        cifar.read_cifar100(bad, "fine")
    result = run_in_this_process(
        "run",
        "--dataset=cifar100",
        "--download=False",
        f"--data_path={tmp_path / 'nowhere'}",
        f"--output_path={tmp_path / 'out'}",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: CIFAR-100 not found: put cifar-100-python.tar.gz (from https://www.cs.toronto.edu/~kriz/"
        f"cifar-100-python.tar.gz) or its extracted cifar-100-python/ folder in '{tmp_path / 'nowhere'}'"
    )


def test_a_cifar100_run_has_100_classes_and_their_names_reach_evaluate_predict_and_export(cifar100, tmp_path):
    result = run_in_this_process(
        "run",
        *TINY,
        "--num_epochs=1",
        "--num_warmup_epochs=0",
        "--dataset=cifar100",
        f"--data_path={cifar100}",
        f"--output_path={tmp_path}",
        "--run_name=fine",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = tmp_path / "fine" / "training_checkpoint_18.pt"
    assert torch.load(checkpoint, weights_only=True)["model"]["5.weight"].shape == (100, 2 * TINY_WIDTH)

    evaluated = run_in_this_process(
        "evaluate", f"--checkpoint={checkpoint}", "--num_workers=0", f"--output_dir={tmp_path / 'eval'}"
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    rows = evaluated.stdout.splitlines()
    assert rows[1].split()[0] == "apple" and rows[100].split()[0] == "worm"
    confusion = json.loads((tmp_path / "eval" / "confusion_training_checkpoint_18.json").read_text())
    assert confusion["classes"] == list(cifar_layouts.CIFAR100_FINE) and len(confusion["confusion_matrix"]) == 100

    image = tmp_path / "one.png"
    Image.fromarray(np.full((32, 32, 3), 120, dtype=np.uint8)).save(image)
    predicted = run_in_this_process("predict", f"--checkpoint={checkpoint}", str(image), "--json", "--top_k=5")
    assert predicted.returncode == 0, predicted.stderr
    top = json.loads(predicted.stdout)["top_k"]
    assert all(entry["class"] == cifar_layouts.CIFAR100_FINE[entry["index"]] for entry in top)

    exported = run_in_this_process(
        "export", f"--checkpoint={checkpoint}", "--format=safetensors", f"--output={tmp_path / 'model.safetensors'}"
    )
    assert exported.returncode == 0, exported.stderr
    assert "on 64 test images of" in exported.stdout and "cifar-100-python" in exported.stdout
    sidecar = json.loads((tmp_path / "model.safetensors.json").read_text())
    assert sidecar["classes"] == list(cifar_layouts.CIFAR100_FINE)


def test_coarse_labels_give_a_user_model_20_outputs_through_num_classes(cifar100, tmp_path, monkeypatch):
    """A factory that takes num_classes is given it; one that ignores the dataset is refused before training."""
    (tmp_path / "nets.py").write_text(
        textwrap.dedent("""\
        from torch import nn


        def flexible(num_classes=10):
            return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))


        def fixed():
            return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
        """)
    )
    monkeypatch.chdir(tmp_path)
    common = [
        "run",
        *TINY,
        "--model_kwargs=None",
        "--num_epochs=1",
        "--num_warmup_epochs=0",
        "--dataset=cifar100",
        "--label_mode=coarse",
        f"--data_path={cifar100}",
        f"--output_path={tmp_path / 'out'}",
    ]
    result = run_in_this_process(*common, "--model=nets.py:flexible", "--run_name=coarse")
    assert result.returncode == 0, result.stderr[-3000:]
    weights = torch.load(tmp_path / "out" / "coarse" / "training_checkpoint_18.pt", weights_only=True)["model"]
    assert weights["1.weight"].shape == (20, 3072)
    refused = run_in_this_process(*common, "--model=nets.py:fixed", "--run_name=fixed")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"error: model='{tmp_path / 'nets.py'}:fixed' returned (2, 10) for a (2, 3, 32, "
        "32) batch: expected a tensor of shape (2, 20), one logit per class"
    )

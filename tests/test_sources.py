"""Dataset sources: one registry (``cifar10_dist.sources``) that the config, the preflight checks, the run's data
set-up, ``prepare-data`` and ``export`` ask, so that a new source is one module and one ``register`` line. This
module is itself a source (its functions below), registered by the test and trained end to end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from cifar10_dist import api, sources
from cifar10_dist.config import Config, load_config
from cifar10_dist.data.datasets import DatasetInfo, ImageSet, LoadedData
from cifar10_dist.errors import UserError
from cifar10_dist.results import PreparedData

CLASSES = ("vertical", "horizontal")

# ---------------------------------------------------------------- a source of our own: stripes, two classes


def _stripes(count: int, seed: int) -> ImageSet:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (count,), generator=generator)
    stripes = (torch.arange(32) % 8 < 4).to(torch.uint8) * 160 + 40
    vertical, horizontal = stripes.expand(32, 32), stripes[:, None].expand(32, 32)
    images = torch.where(labels[:, None, None] == 0, vertical, horizontal)[:, None].expand(count, 3, 32, 32)
    noise = torch.randint(0, 60, (count, 3, 32, 32), generator=generator, dtype=torch.uint8)
    return ImageSet((images + noise).contiguous(), labels)


def info(config: Config) -> DatasetInfo:
    return DatasetInfo(CLASSES, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))


def load(config: Config) -> LoadedData:
    return LoadedData(_stripes(config.synthetic_size, 1), _stripes(64, 2), info(config))


def preflight(config: Config) -> None:
    if config.synthetic_size % 2:
        raise UserError(f"synthetic_size={config.synthetic_size}: stripes come in pairs, give an even number")


def sample_images(config: Config, limit: int) -> tuple[torch.Tensor, str]:
    return _stripes(limit, 3).images, f"{limit} stripe images"


def prepare(
    config: Config, synthetic: int | None = None, synthetic_test: int | None = None, seed: int = 0
) -> PreparedData:
    return PreparedData("in memory", config.synthetic_size, 64, synthetic=True)


# ---------------------------------------------------------------- the tests


@pytest.fixture()
def stripes_registered():
    sources.register(sources.Source("stripes", __name__))
    yield
    sources.SOURCES.pop("stripes")


def test_no_module_compares_dataset_names_the_registry_decides():
    package = Path(sources.__file__).parent
    found = subprocess.run(["grep", "-rn", "dataset ==", str(package)], capture_output=True, text=True).stdout
    assert found == ""


def test_an_unregistered_name_is_refused_with_the_registered_ones(stripes_registered):
    with pytest.raises(
        UserError,
        match=r"^dataset='stripe' is unknown: choose one of cifar10, cifar100, synthetic, "
        r"folder, stripes$",
    ):
        load_config(dataset="stripe")


def test_a_source_registered_by_a_test_trains_evaluates_and_exports_end_to_end(stripes_registered, tmp_path):
    with pytest.raises(UserError, match="stripes come in pairs"):  # its own preflight, before anything starts
        api.train(dataset="stripes", synthetic_size=321, model="simple_cnn", output_path=str(tmp_path))
    result = api.train(
        dataset="stripes",
        synthetic_size=256,
        model="simple_cnn",
        batch_size=32,
        num_workers=0,
        num_epochs=2,
        num_warmup_epochs=0.5,
        train_eval_size=0,
        output_path=str(tmp_path),
        run_name="stripes",
    )
    assert result.test.num_samples == 64 and result.test.accuracy > 0.9  # two stripe directions: easy
    provenance = json.loads((tmp_path / "stripes" / "provenance.json").read_text())
    assert provenance["dataset"]["name"] == "stripes"
    assert provenance["dataset"]["info"]["classes"] == list(CLASSES)
    best = sorted((tmp_path / "stripes").glob("best_model_*.pt"))[-1]
    evaluated = api.evaluate(best, num_workers=0)
    assert list(evaluated.classes) == list(CLASSES) and evaluated.accuracy == pytest.approx(result.test.accuracy)
    exported = api.export(best, "safetensors", tmp_path / "stripes.safetensors")
    assert exported.images == "64 stripe images" and exported.same_top1 == 64
    assert api.prepare_data("unused", "stripes").train_images == 5000  # its own prepare (the default size)

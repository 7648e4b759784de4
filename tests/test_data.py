"""Data: the on-disk format, its validation, synthetic data, samplers and batch augmentation."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from cifar10_dist import data
from cifar10_dist.errors import UserError
from tests.conftest import run_cli, write_dataset


def test_prepare_data_synthetic_is_read_back_by_the_loader(tmp_path):
    result = run_cli("prepare-data", f"--data_path={tmp_path}", "--synthetic=250", "--synthetic_test=40")
    assert result.returncode == 0, result.stderr
    assert "wrote 250 synthetic training and 40 test images" in result.stdout
    folder = tmp_path / "cifar-10-batches-py"
    assert sorted(p.name for p in folder.iterdir()) == sorted([*data.TRAIN_FILES, data.TEST_FILE, "batches.meta"])
    train, test = data.read_cifar10(folder)
    assert (len(train), len(test)) == (250, 40)
    assert train.images.shape == (250, 3, 32, 32) and train.images.dtype == torch.uint8
    assert set(train.labels.tolist()) <= set(range(10))
    expected_train, _ = data.make_synthetic(250, 40, seed=0)
    assert torch.equal(train.images, expected_train.images)
    assert torch.equal(train.labels, expected_train.labels)


def test_prepare_data_validates_an_existing_copy_and_reports_checksums(tmp_path):
    write_dataset(tmp_path, 50, 10)
    result = run_cli("prepare-data", f"--data_path={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "50 training and 10 test images, valid structure" in result.stdout
    assert "do not match the official release" in result.stdout


def test_files_in_torchvision_layout_are_read_with_bytes_keys_too(tmp_path):
    """The official release was pickled by Python 2 with bytes keys."""
    write_dataset(tmp_path, 20, 5)
    folder = tmp_path / data.FOLDER
    entry = pickle.loads((folder / "test_batch").read_bytes())
    entry = {key.encode(): value for key, value in entry.items()}
    (folder / "test_batch").write_bytes(pickle.dumps(entry, protocol=2))
    _, test = data.read_cifar10(folder)
    assert len(test) == 5


def test_missing_batch_file_is_named(tmp_path):
    write_dataset(tmp_path, 20, 5)
    (tmp_path / data.FOLDER / "data_batch_3").unlink()
    with pytest.raises(UserError, match="is missing data_batch_3"):
        data.read_cifar10(tmp_path / data.FOLDER)


def test_truncated_batch_file_is_reported_with_its_path(tmp_path):
    write_dataset(tmp_path, 20, 5)
    path = tmp_path / data.FOLDER / "data_batch_2"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match="data_batch_2 is not a readable CIFAR-10 batch file"):
        data.read_cifar10(tmp_path / data.FOLDER)


def test_wrong_image_shape_is_rejected(tmp_path):
    write_dataset(tmp_path, 20, 5)
    path = tmp_path / data.FOLDER / "test_batch"
    entry = pickle.loads(path.read_bytes())
    entry["data"] = entry["data"][:, :1000]
    path.write_bytes(pickle.dumps(entry))
    with pytest.raises(UserError, match=r"test_batch: data must be uint8 rows of 3072 values .* \(5, 1000\)"):
        data.read_cifar10(tmp_path / data.FOLDER)


def test_label_out_of_range_is_rejected(tmp_path):
    write_dataset(tmp_path, 20, 5)
    path = tmp_path / data.FOLDER / "test_batch"
    entry = pickle.loads(path.read_bytes())
    entry["labels"][3] = 10
    path.write_bytes(pickle.dumps(entry))
    with pytest.raises(UserError, match="label 10 is out of range: labels must be 0..9"):
        data.read_cifar10(tmp_path / data.FOLDER)


def test_a_batch_file_that_would_run_code_is_refused(tmp_path):
    write_dataset(tmp_path, 20, 5)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / data.FOLDER / "test_batch").write_bytes(pickle.dumps({"data": Exploit(), "labels": []}))
    with pytest.raises(UserError, match="refusing to load"):
        data.read_cifar10(tmp_path / data.FOLDER)
    assert not marker.exists()


def test_missing_folder_without_download_says_where_to_put_the_files(tmp_path):
    with pytest.raises(UserError, match=f"put cifar-10-python.tar.gz .* in '{tmp_path}'"):
        data.ensure_cifar10(tmp_path, download=False)


def test_archive_is_extracted_when_present(tmp_path):
    import tarfile

    source = write_dataset(tmp_path / "source", 20, 5)
    target = tmp_path / "target"
    target.mkdir()
    with tarfile.open(target / data.ARCHIVE, "w:gz") as tar:
        tar.add(source / data.FOLDER, arcname=data.FOLDER)
    folder = data.ensure_cifar10(target, download=False)
    assert folder == target / data.FOLDER
    assert len(data.read_cifar10(folder)[1]) == 5


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shard_sampler_yields_every_index_exactly_once(world_size):
    dataset = list(range(1001))
    shards = [list(data.ShardSampler(dataset, world_size, rank)) for rank in range(world_size)]
    assert sorted(index for shard in shards for index in shard) == list(range(1001))
    assert [len(data.ShardSampler(dataset, world_size, r)) for r in range(world_size)] == [len(s) for s in shards]


def test_augment_is_a_padded_crop_with_optional_flip_of_each_image():
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = data.augment(images, torch.Generator().manual_seed(1))
    assert out.shape == images.shape and out.dtype == torch.uint8
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    for index in range(64):
        candidates = [
            padded[index, :, dy : dy + 32, dx : dx + 32].flip(-1) if flip else padded[index, :, dy : dy + 32, dx : dx + 32]
            for dy in range(9)
            for dx in range(9)
            for flip in (False, True)
        ]
        assert any(torch.equal(out[index], candidate) for candidate in candidates), index
    flipped = sum(
        torch.equal(out[i], padded[i, :, 4:36, 4:36].flip(-1)) for i in range(64)
    )  # sanity: crops vary, so the untouched-centre flip is rare
    assert flipped < 16


def test_augment_is_reproducible_from_the_generator_seed():
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    first = data.augment(images, torch.Generator().manual_seed(5))
    again = data.augment(images, torch.Generator().manual_seed(5))
    other = data.augment(images, torch.Generator().manual_seed(6))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_normalize_uses_the_cifar_channel_statistics():
    images = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    expected = [(1 - m) / s for m, s in zip(data.MEAN, data.STD)]
    assert np.allclose(data.normalize(images)[0, :, 0, 0].numpy(), expected, atol=1e-5)

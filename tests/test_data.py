"""Data: the on-disk format, its validation, synthetic data, samplers and batch augmentation."""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pytest
import torch

from cifar10_dist.data import augmentation, cifar, cifar_layouts, loader_workers, loaders
from cifar10_dist.data.datasets import MEAN, STD
from cifar10_dist.data.synthetic import make_synthetic
from cifar10_dist.errors import UserError
from tests.conftest import run_in_this_process, write_dataset


def test_prepare_data_synthetic_is_read_back_by_the_loader(tmp_path):
    result = run_in_this_process("prepare-data", f"--data_path={tmp_path}", "--synthetic=250", "--synthetic_test=40")
    assert result.returncode == 0, result.stderr
    assert "wrote 250 synthetic training and 40 test images" in result.stdout
    folder = tmp_path / "cifar-10-batches-py"
    expected = [*cifar_layouts.TRAIN_FILES, cifar_layouts.TEST_FILE, "batches.meta"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(expected)
    train, test = cifar.read_cifar10(folder)
    assert (len(train), len(test)) == (250, 40)
    assert train.images.shape == (250, 3, 32, 32) and train.images.dtype == torch.uint8
    assert set(train.labels.tolist()) <= set(range(10))
    expected_train, _ = make_synthetic(250, 40, seed=0)
    assert torch.equal(train.images, expected_train.images)
    assert torch.equal(train.labels, expected_train.labels)


def test_prepare_data_validates_an_existing_copy_and_reports_checksums(tmp_path):
    write_dataset(tmp_path, 50, 10)
    result = run_in_this_process("prepare-data", f"--data_path={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert "50 training and 10 test images, valid structure" in result.stdout
    assert "do not match the official release" in result.stdout


def test_files_in_torchvision_layout_are_read_with_bytes_keys_too(tmp_path):
    """The official release was pickled by Python 2 with bytes keys."""
    write_dataset(tmp_path, 20, 5)
    folder = tmp_path / cifar_layouts.FOLDER
    entry = pickle.loads((folder / "test_batch").read_bytes())
    entry = {key.encode(): value for key, value in entry.items()}
    (folder / "test_batch").write_bytes(pickle.dumps(entry, protocol=2))
    _, test = cifar.read_cifar10(folder)
    assert len(test) == 5


def test_missing_batch_file_is_named(tmp_path):
    write_dataset(tmp_path, 20, 5)
    (tmp_path / cifar_layouts.FOLDER / "data_batch_3").unlink()
    with pytest.raises(UserError, match="is missing data_batch_3"):
        cifar.read_cifar10(tmp_path / cifar_layouts.FOLDER)


def test_truncated_batch_file_is_reported_with_its_path(tmp_path):
    write_dataset(tmp_path, 20, 5)
    path = tmp_path / cifar_layouts.FOLDER / "data_batch_2"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match="data_batch_2 is not a readable CIFAR-10 batch file"):
        cifar.read_cifar10(tmp_path / cifar_layouts.FOLDER)


def test_wrong_image_shape_is_rejected(tmp_path):
    write_dataset(tmp_path, 20, 5)
    path = tmp_path / cifar_layouts.FOLDER / "test_batch"
    entry = pickle.loads(path.read_bytes())
    entry["data"] = entry["data"][:, :1000]
    path.write_bytes(pickle.dumps(entry))
    with pytest.raises(UserError, match=r"test_batch: data must be uint8 rows of 3072 values .* \(5, 1000\)"):
        cifar.read_cifar10(tmp_path / cifar_layouts.FOLDER)


def test_label_out_of_range_is_rejected(tmp_path):
    write_dataset(tmp_path, 20, 5)
    path = tmp_path / cifar_layouts.FOLDER / "test_batch"
    entry = pickle.loads(path.read_bytes())
    entry["labels"][3] = 10
    path.write_bytes(pickle.dumps(entry))
    with pytest.raises(UserError, match="label 10 is out of range: labels must be 0..9"):
        cifar.read_cifar10(tmp_path / cifar_layouts.FOLDER)


def test_a_batch_file_that_would_run_code_is_refused(tmp_path):
    write_dataset(tmp_path, 20, 5)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / cifar_layouts.FOLDER / "test_batch").write_bytes(pickle.dumps({"data": Exploit(), "labels": []}))
    with pytest.raises(UserError, match="refusing to load"):
        cifar.read_cifar10(tmp_path / cifar_layouts.FOLDER)
    assert not marker.exists()


def test_missing_folder_without_download_says_where_to_put_the_files(tmp_path):
    with pytest.raises(UserError, match=f"put cifar-10-python.tar.gz .* in '{tmp_path}'"):
        cifar.ensure_cifar10(tmp_path, download=False)


def test_archive_is_extracted_when_present(tmp_path):
    import tarfile

    source = write_dataset(tmp_path / "source", 20, 5)
    target = tmp_path / "target"
    target.mkdir()
    with tarfile.open(target / cifar_layouts.ARCHIVE, "w:gz") as tar:
        tar.add(source / cifar_layouts.FOLDER, arcname=cifar_layouts.FOLDER)
    folder = cifar.ensure_cifar10(target, download=False)
    assert folder == target / cifar_layouts.FOLDER
    assert len(cifar.read_cifar10(folder)[1]) == 5


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shard_sampler_yields_every_index_exactly_once(world_size):
    dataset = list(range(1001))
    shards = [list(loaders.ShardSampler(dataset, world_size, rank)) for rank in range(world_size)]
    assert sorted(index for shard in shards for index in shard) == list(range(1001))
    assert [len(loaders.ShardSampler(dataset, world_size, r)) for r in range(world_size)] == [len(s) for s in shards]


def test_augment_crops_at_every_offset_uniformly_and_flips_half_the_images():
    """Pixels carry their own coordinates (row + 1 in channel 0, column + 1 in channel 1; 0 is padding), so each
    output tells its crop offset and whether it was mirrored; each output must be exactly that crop."""
    count = 2000
    coordinate = torch.arange(1, 33, dtype=torch.uint8)
    images = (
        torch.stack(
            [
                coordinate.view(32, 1).expand(32, 32),
                coordinate.view(1, 32).expand(32, 32),
                torch.zeros(32, 32, dtype=torch.uint8),
            ]
        )
        .expand(count, 3, 32, 32)
        .contiguous()
    )
    out = augmentation.augment(images, torch.Generator().manual_seed(1))
    flipped = out[:, 1, 16, 17] < out[:, 1, 16, 16]  # columns run backwards in a mirrored crop
    row_offset = out[:, 0, 16, 16].long() - 1 - 12  # output row 16 shows padded row 16 + offset
    column_offset = out[:, 1, 16, 16].long() - 1 - torch.where(flipped, 11, 12)
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    for index in range(count):
        dy, dx = int(row_offset[index]), int(column_offset[index])
        crop = padded[index, :, dy : dy + 32, dx : dx + 32]
        assert torch.equal(out[index], crop.flip(-1) if flipped[index] else crop), index
    for offsets in (row_offset, column_offset):
        counts = torch.bincount(offsets, minlength=9)
        assert len(counts) == 9 and counts.min() > 0.7 * count / 9 and counts.max() < 1.3 * count / 9, counts
    assert 0.45 < flipped.float().mean() < 0.55


def test_augment_is_reproducible_from_the_generator_seed():
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    first = augmentation.augment(images, torch.Generator().manual_seed(5))
    again = augmentation.augment(images, torch.Generator().manual_seed(5))
    other = augmentation.augment(images, torch.Generator().manual_seed(6))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_normalize_uses_the_cifar_channel_statistics():
    images = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    expected = [(1 - m) / s for m, s in zip(MEAN, STD)]
    assert np.allclose(augmentation.normalize(images)[0, :, 0, 0].numpy(), expected, atol=1e-5)


def test_extraction_without_tarfiles_data_filter_still_refuses_paths_outside_the_folder(tmp_path, monkeypatch):
    """Python 3.10.0-3.10.11 and 3.11.0-3.11.3 have no tarfile.data_filter: the fallback checks the members."""
    import io
    import tarfile

    monkeypatch.delattr(tarfile, "data_filter")
    source = write_dataset(tmp_path / "source", 20, 5)
    good = tmp_path / "good"
    good.mkdir()
    with tarfile.open(good / cifar_layouts.ARCHIVE, "w:gz") as tar:
        tar.add(source / cifar_layouts.FOLDER, arcname=cifar_layouts.FOLDER)
    assert len(cifar.read_cifar10(cifar.ensure_cifar10(good, download=False))[1]) == 5

    hostile = tmp_path / "hostile"
    hostile.mkdir()
    with tarfile.open(hostile / cifar_layouts.ARCHIVE, "w:gz") as tar:
        member = tarfile.TarInfo("../escaped.txt")
        member.size = 3
        tar.addfile(member, io.BytesIO(b"bad"))
    with pytest.raises(UserError, match=r"could not be extracted \(refusing to extract '../escaped.txt'"):
        cifar.ensure_cifar10(hostile, download=False)
    assert not (tmp_path / "escaped.txt").exists()


def test_auto_workers_read_in_the_training_process_on_a_cpu_unless_the_cache_outgrows_memory(tmp_path, monkeypatch):
    """num_workers=auto: 0 on a CPU for images in memory or a cache the page cache can hold, 2 for a larger cache
    (the reads then come from disk and overlap the step); on an accelerator each process's cores but one, from 2 to
    8, times the node's processes (Ignite splits the node's number); a number is kept as given."""
    from cifar10_dist.data.datasets import MappedImages

    np.save(tmp_path / "images.npy", np.zeros((10, 3, 8, 8), dtype=np.uint8))
    cache = MappedImages(tmp_path / "images.npy", np.arange(10))
    size = (tmp_path / "images.npy").stat().st_size
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(loader_workers, "free_bytes", lambda device: 10 * size)
    assert [loader_workers.workers_for("auto", cpu, images) for images in (None, torch.zeros(2), cache)] == [0, 0, 0]
    monkeypatch.setattr(loader_workers, "free_bytes", lambda device: size)  # the file over 80% of what is available
    assert (
        loader_workers.workers_for("auto", cpu, cache) == 2
        and loader_workers.workers_for("auto", cpu, torch.zeros(2)) == 0
    )
    assert loader_workers.workers_for(5, cpu, cache) == 5 and loader_workers.workers_for(0, cuda, None) == 0
    on_gpus = [
        loader_workers.workers_for("auto", cuda, None, cores, processes)
        for cores, processes in ((16, 1), (2, 1), (4, 2), (32, 1), (6, 8))
    ]
    assert on_gpus == [8, 2, 6, 8, 40]  # (16 cores: 15 capped at 8; 2 cores: at least 2; 2 GPUs of 4 cores: 3 each)
    assert loader_workers.workers_for("auto", cuda, None) >= 2  # this machine's own count


def test_batches_on_the_device_slice_the_pass_order_sent_once_and_match_the_host_loader(monkeypatch):
    """data_on_device: a pass's order becomes a tensor once (sent to the device once: on CUDA through pinned memory,
    non-blocking) and each batch is a slice of it; no batch makes a tensor from its list of indices (on a GPU each
    did, and each such copy made the host wait). The batches, their numbers and a resumed pass are the host
    loader's."""
    train, test = make_synthetic(200, 40, 0)
    host = loaders.make_loaders(train, test, batch_size=32, num_workers=0, train_eval_size=0, seed=3)
    device = loaders.make_loaders(
        train, test, batch_size=32, num_workers=0, train_eval_size=0, seed=3, device=torch.device("cpu")
    )
    from_lists = []  # the length of each list a tensor is made from
    as_tensor = torch.as_tensor

    def counted(data, *args, **kwargs):
        if isinstance(data, list):
            from_lists.append(len(data))
        return as_tensor(data, *args, **kwargs)

    monkeypatch.setattr(torch, "as_tensor", counted)

    def passes(made, start: int = 0):
        sampler = loaders.batch_sampler_of(made.train)
        seen = []
        for epoch in (0, 1):
            sampler.sampler.set_epoch(epoch)
            sampler.sampler.start_next_pass_at(start if epoch else 0)
            seen += [
                (batch.epoch, batch.iteration, batch, *made.train.dataset.__getitems__(batch)) for batch in sampler
            ]
        return seen

    on_host = passes(host)
    assert from_lists == [32] * 12  # 6 batches a pass, a tensor made from each batch's list
    from_lists.clear()
    on_device = passes(device)
    assert from_lists == [200, 200]  # the pass's order, once a pass
    assert [(e, i, list(b)) for e, i, b, _, _ in on_device] == [(e, i, list(b)) for e, i, b, _, _ in on_host]
    assert all(torch.equal(a[3], b[3]) and torch.equal(a[4], b[4]) for a, b in zip(on_host, on_device))
    assert all(batch.on_device.tolist() == list(batch) for _, _, batch, _, _ in on_device)
    resumed = passes(device, start=64)  # epoch 1 continued after its second batch
    assert [(e, i) for e, i, *_ in resumed] == [(e, i) for e, i, *_ in on_host if e == 0 or i > 8]
    assert all(torch.equal(a[3], b[3]) for a, b in zip(resumed[6:], on_host[8:]))


def test_data_on_device_auto_takes_a_gpu_when_the_images_fit_a_quarter_of_its_free_memory(monkeypatch, caplog):
    """data_on_device=auto: on a CUDA GPU when every split's uint8 images take at most 25% of its free memory,
    logged either way; off on a CPU (batches are sliced in host memory there anyway); True and False as given."""
    from cifar10_dist.data import run_data

    train, test = make_synthetic(1000, 200, 0)  # 3,686,400 bytes of pixels in all
    needed = (1000 + 200) * 3 * 32 * 32
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    free = {}
    monkeypatch.setattr(loader_workers, "free_bytes", lambda device: free.get("bytes"))
    settle = run_data.settle_data_on_device
    caplog.set_level("INFO", logger="cifar10_dist")
    free["bytes"] = 4 * needed
    assert settle("auto", cuda, [train, test, None]) is True
    assert "data_on_device=auto: on (the images take 0.00 GiB, 0.0 GiB free on cuda)" in caplog.text
    free["bytes"] = 4 * needed - 4
    assert settle("auto", cuda, [train, test, None]) is False
    assert "data_on_device=auto: off, more than 25% (the images take" in caplog.text
    free["bytes"] = None  # the device could not be asked
    assert settle("auto", cuda, [train, test]) is False
    free["bytes"] = 100 * needed
    assert settle("auto", cpu, [train, test]) is False
    assert [settle(True, cpu, [train]), settle(False, cuda, [train])] == [True, False]


@pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux only")
def test_loader_workers_are_forked_from_their_process_also_where_its_default_start_method_is_a_forkserver():
    """A spawned worker's default start method is its launcher's forkserver. DataLoader workers started through it
    each imported torch again and were sent the dataset: about 2 s before each loader's first batch (docs/measured.md).
    They are forked from the process itself, as PyTorch does by default on Linux."""
    import multiprocessing
    from pathlib import Path

    previous = multiprocessing.get_start_method(allow_none=True)
    train, test = make_synthetic(64, 16, 0)
    made = None
    try:
        multiprocessing.set_start_method("forkserver", force=True)  # as in a spawned worker
        made = loaders.make_loaders(train, test, batch_size=16, num_workers=2, train_eval_size=0, seed=0)
        images, _ = next(iter(made.train))
        assert images.shape[0] == 16
        workers = made.train._iterator._workers  # (persistent: kept between passes)
        parents = {int(Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for worker in workers}
        assert len(workers) == 2 and parents == {os.getpid()}
    finally:
        if made is not None:
            made.close()
        multiprocessing.set_start_method(previous, force=True)

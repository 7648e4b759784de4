"""Image folders at scale: the splits are read from the memory-mapped cache on demand, so a process's private
memory does not grow with the dataset (measured on a folder of N and of 2N images, read whole by two processes
that share the cache's pages), and the on-demand images behave as the in-memory ones did."""

from __future__ import annotations

import json
import multiprocessing
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cifar10_dist import api
from cifar10_dist.data.datasets import ImageSet, MappedImages
from tests.conftest import cli_env, run_in_this_process, run_log

SIZE = 128  # pixels: 48 KiB an image in the cache


def noise_folder(root: Path, train_per_class: int, test_per_class: int) -> Path:
    """Two classes of smooth random JPEGs at SIZE x SIZE (their decoded pixels differ image by image)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for name, colour in (("red", (200, 60, 60)), ("blue", (60, 60, 200))):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                small = np.clip(rng.normal(colour, 50, (8, 8, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(small).resize((SIZE, SIZE), Image.BILINEAR).save(
                    folder / f"{index:04d}.jpg", quality=90
                )
    return root


def read_everything(root: Path, size: int, barrier: Path, name: str) -> None:
    """In a process of its own: read every image of the folder's cache once, then, while the other reader holds
    the map too, write this process's private memory growth (MiB) and the cache file's resident and proportional
    pages (KiB) to ``barrier``-results/NAME.json, and hold the map until the other reader has written its own."""
    from cifar10_dist.data import folder_source, loaders
    from cifar10_dist.outputs.memory_use import private_memory_mib

    before = private_memory_mib()
    loaded = folder_source.load_folder(root, size)
    batches = loaders.make_loaders(loaded.train, loaded.test, batch_size=50, num_workers=0, train_eval_size=0, seed=0)
    for loader in (batches.train, batches.test):  # every image read once
        for _ in loader:
            pass
    after = private_memory_mib()
    (barrier / name).touch()
    while len(list(barrier.iterdir())) < 2:  # both processes hold the map now
        time.sleep(0.05)
    resident = proportional = 0  # KiB of the cache file's pages in this process: all of them, and its share
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split()[0] and len(line.split()) >= 5:  # a mapping's header: address range, ..., path
            inside = line.endswith("images.npy")
        elif inside and line.startswith(("Rss:", "Pss:")):
            value = int(line.split()[1])
            if line.startswith("Rss"):
                resident += value
            else:
                proportional += value
    results = Path(f"{barrier}-results")
    (results / f"{name}.json").write_text(json.dumps([after - before, resident, proportional]))
    while len(list(results.iterdir())) < 2:  # the map held until the other one has measured too
        time.sleep(0.05)


def read_everything_twice_at_once(root: Path, barrier: Path) -> list[list[float]]:
    """Two processes read every image of the folder's cache at once: each one's private memory growth (MiB), and
    the cache file's resident and proportional pages (KiB: the proportional set splits a shared page among the
    processes that map it) while both hold the map. They are forked by the forkserver that spawned runs use
    (torch and the package imported there once, not by each reader; neither maps the cache before it forks)."""
    from cifar10_dist.launch import start_method

    context = multiprocessing.get_context(start_method.start_method())
    start_method.start_forkserver()
    barrier.mkdir()
    Path(f"{barrier}-results").mkdir()
    readers = [context.Process(target=read_everything, args=(root, SIZE, barrier, name)) for name in ("a", "b")]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(120)
    assert [reader.exitcode for reader in readers] == [0, 0]
    return [json.loads(Path(f"{barrier}-results/{name}.json").read_text()) for name in ("a", "b")]


@pytest.mark.slow
def test_private_memory_stays_flat_when_the_folder_doubles_and_processes_share_the_cache(tmp_path):
    """1,000 and 2,000 images (47 and 94 MiB of cache): two processes reading every image at once each grow their
    private memory by a small fraction of that (an in-memory copy of the splits, as before, grew it by all of
    it), and the cache's pages are shared between them (each one's proportional share about half)."""
    grown = {}
    for images in (1000, 2000):  # 80% train, 20% test, two classes
        root = noise_folder(tmp_path / f"n{images}", images * 2 // 5, images // 10)
        api.prepare_data(root, "folder", image_size=SIZE)  # the cache, built once
        measured = read_everything_twice_at_once(root, tmp_path / f"barrier{images}")
        grown[images] = [growth for growth, _, _ in measured]
        cache = images * 3 * SIZE * SIZE / 2**20
        for growth, resident, proportional in measured:
            assert 0.95 * cache * 1024 < resident < 1.1 * cache * 1024, (images, measured)  # every page read
            assert proportional < 0.6 * resident, (images, measured)  # and shared by the two
    assert all(growth < 0.25 * 94 for growth in grown[2000]), grown  # loaders and buffers, not the images
    assert all(after - before < 0.2 * 47 for before, after in zip(grown[1000], grown[2000])), grown


def test_on_demand_images_index_slice_subset_flip_and_pickle_like_a_tensor(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 255, (6, 3, 40, 40), dtype=np.uint8)  # 28.8 kB
    np.save(tmp_path / "images.npy", pixels)
    mapped = MappedImages(tmp_path / "images.npy", np.array([5, 1, 3, 0]))
    tensor = torch.from_numpy(pixels[[5, 1, 3, 0]])
    assert len(mapped) == 4 and mapped.shape == tensor.shape
    assert torch.equal(mapped[torch.tensor([2, 0, 3])], tensor[[2, 0, 3]])  # any order, read in file order
    assert torch.equal(mapped[1:3], tensor[1:3]) and torch.equal(mapped[3], tensor[3])
    subset = ImageSet(mapped, torch.arange(4)).subset(torch.tensor([3, 1]))
    assert isinstance(subset.images, MappedImages) and torch.equal(subset.images[:], tensor[[3, 1]])
    flipped = mapped.with_flips(np.array([True, False, False, True]))
    assert torch.equal(
        flipped[:],
        torch.where(torch.tensor([1, 0, 0, 1], dtype=torch.bool)[:, None, None, None], tensor.flip(-1), tensor),
    )
    carried = pickle.loads(pickle.dumps(flipped))
    assert len(pickle.dumps(flipped)) < 1000  # path, rows and flips, never the pixels of the file
    assert torch.equal(carried[:], flipped[:])


def test_two_nodes_each_copy_the_cache_beside_the_data_to_their_local_disk_once(tmp_path):
    """Two simulated nodes, each its own cache_dir (its local disk): the first run there copies the finished
    cache built beside the data (no decoding) while the node's other process waits, a later run reuses it, and
    a copy cut short is never read (the next run copies again)."""
    from cifar10_dist.data import folder_scan, folder_source

    root = noise_folder(tmp_path / "shared", 20, 5)
    shared = Path(api.prepare_data(root, "folder", image_size=32).folder)
    for node in ("node-a", "node-b"):
        result = run_in_this_process(
            "run",
            "--dataset=folder",
            f"--data_path={root}",
            f"--cache_dir={tmp_path / node}",
            "--model=simple_cnn",
            "--batch_size=10",
            "--num_workers=0",
            "--num_epochs=1",
            "--num_warmup_epochs=0",
            "--train_eval_size=0",
            "--backend=gloo",
            "--nproc_per_node=2",
            f"--output_path={tmp_path / 'out'}",
            f"--run_name={node}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        (local,) = (path for path in (tmp_path / node).iterdir() if not path.name.startswith("."))  # not its lock
        assert local.name == shared.name and (local / "images.npy").read_bytes() == (shared / "images.npy").read_bytes()
        assert "(cache " + str(local) + ", copied from the data folder's)" in run_log(result, tmp_path / "out" / node)
        assert json.loads((tmp_path / "out" / node / "summary.json").read_text())["data_checks"]["cache"] == str(local)
    again = folder_source.load_folder(root, 32, cache_under=tmp_path / "node-a")
    assert again.how == "reused"
    (tmp_path / "node-a" / shared.name / "meta.json").unlink()  # a copy that never finished
    assert folder_scan.read_meta(tmp_path / "node-a" / shared.name) is None
    copied = folder_source.load_folder(root, 32, cache_under=tmp_path / "node-a")
    assert copied.how == "copied" and len(copied.train) == 40


KILLED_BUILD = """
import os, signal, sys
from pathlib import Path
from cifar10_dist.data import cache_builds

cache_builds.PROGRESS_EVERY = 16
saved = cache_builds._save_progress


def save_then_die(folder, arrays, done, bad):  # killed (as by SIGKILL or a node lost) right after a save
    saved(folder, arrays, done, bad)
    if done >= 48:
        os.kill(os.getpid(), signal.SIGKILL)


cache_builds._save_progress = save_then_die
cache_builds.ensure_cache(Path(sys.argv[1]), 32, workers=1)
"""


def test_a_build_killed_part_way_is_never_read_and_resumes_where_it_stopped(tmp_path, caplog):
    """A cache build killed after 48 of its 70 images leaves no cache (only its temporary folder); the next
    run goes on from image 48 and makes the same cache, byte for byte, as a build from nothing, unreadable
    files included; leftovers of an older version's builds are removed."""
    from cifar10_dist.data import cache_builds, folder_scan

    root = noise_folder(tmp_path / "photos", 25, 10)
    (root / "train" / "red" / "9999.jpg").write_bytes(b"not a jpeg")  # one unreadable file, before the kill
    found = folder_scan.scan(root)
    target = folder_scan.cache_dir(root, 32, folder_scan.fingerprint(found, 32))
    old = target.with_name(f".{target.name}.building4242")  # an older version's leftover (per process id)
    old.mkdir(parents=True)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_BUILD, str(root)], capture_output=True, text=True, env=cli_env(), timeout=120
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not target.exists() and folder_scan.read_meta(target) is None
    (building,) = target.parent.glob(f".{target.name}.building-*")
    assert json.loads((building / "progress.json").read_text())["done"] == 48
    with caplog.at_level("INFO", logger="cifar10_dist"):
        folder, meta, _, how = cache_builds.ensure_cache(root, 32, workers=1)
    assert (folder, how, meta.resumed_at) == (target, "built", 48)
    assert f"{target.name}.building-" in caplog.text and "resuming the build cut short at image 48 of 71" in caplog.text
    assert meta.bad_files == [["train/red/9999.jpg", meta.bad_files[0][1]]]
    assert sorted(path.name for path in target.parent.iterdir() if not path.name.startswith(".")) == [target.name]
    assert not old.exists() and not building.exists() and not (target / "progress.json").exists()
    fresh = cache_builds.build_cache(found, 32, tmp_path / "fresh" / target.name, meta.fingerprint, workers=1)
    for name in ("images.npy", "hashes.npy", "good.npy", "sizes.npy", "labels.npy", "paths.txt"):
        assert (target / name).read_bytes() == (tmp_path / "fresh" / target.name / name).read_bytes(), name
    assert (meta.mean, meta.std, meta.sizes, fresh.resumed_at) == (fresh.mean, fresh.std, fresh.sizes, 0)


def test_a_folders_checksum_is_read_once_per_choice_of_images_then_kept_in_the_cache(tmp_path, monkeypatch):
    """The data checksum of a folder run equals the hash of every image, computed the first time; a later run on
    the same images takes it from the cache folder without reading the images; other rows are hashed anew."""
    import dataclasses

    from cifar10_dist.data import folder_source, run_data
    from cifar10_dist.outputs import provenance

    loaded = folder_source.load_folder(noise_folder(tmp_path / "photos", 12, 4), 32)
    parts = (loaded.train.images, loaded.train.labels, loaded.test.images, loaded.test.labels)
    expected = provenance.dataset_sha256(*parts)
    assert run_data.data_sha256(loaded) == expected
    (kept,) = (loaded.cache / "checksums").iterdir()
    assert kept.read_text() == expected + "\n"

    def no_reading(self, size=4096):
        raise AssertionError("the images were read again")

    monkeypatch.setattr(MappedImages, "chunks", no_reading)
    again = folder_source.load_folder(tmp_path / "photos", 32)
    assert run_data.data_sha256(again) == expected
    fewer = dataclasses.replace(again, train=again.train.subset(torch.arange(20)))
    with pytest.raises(AssertionError, match="read again"):
        run_data.data_sha256(fewer)


def test_data_on_device_is_refused_in_one_line_when_the_images_would_not_fit():
    from cifar10_dist.data import loader_workers, loaders
    from cifar10_dist.errors import UserError

    loaders.check_fits(3 * 2**30, 4 * 2**30, torch.device("cpu"))  # 3 of 4 GiB: 75%, below the 80% share
    with pytest.raises(UserError) as refused:
        loaders.check_fits(7 * 2**30, 8 * 2**30, torch.device("cuda:0"))
    assert str(refused.value) == (
        "data_on_device=True: the images take 7.0 GiB and cuda:0 has 8.0 GiB free (80% "
        "of it may hold data): leave data_on_device off (a folder's cache is read on "
        "demand) or use fewer or smaller images"
    )
    assert loader_workers.free_bytes(torch.device("cpu")) > 2**30  # this machine's MemAvailable, read for real


def test_a_process_that_waited_for_another_ones_build_says_reused_not_built(tmp_path):
    """prepare-data twice at once: the second waits for the machine's lock while the first builds, then reads
    the finished cache; its card must say "reused", not "built now". Here the test holds the lock and puts a
    finished cache in place while a thread's load waits for it."""
    import shutil
    import threading
    import time

    from cifar10_dist.data import cache_builds, folder_scan, folder_source

    root = noise_folder(tmp_path / "data", 10, 2)
    found = folder_scan.scan(root)
    key = folder_scan.fingerprint(found, 32)
    target = folder_scan.cache_dir(root, 32, key)
    elsewhere = cache_builds.build_cache(found, 32, tmp_path / "elsewhere" / target.name, key, workers=1)
    loaded = {}
    with cache_builds._machine_lock(target):
        waiting = threading.Thread(target=lambda: loaded.update(load=folder_source.load_folder(root, 32)))
        waiting.start()
        time.sleep(1.0)  # the thread scans 24 files and finds no cache long before this: it waits for the lock
        assert waiting.is_alive()
        shutil.copytree(tmp_path / "elsewhere" / target.name, target)  # what the other process finished
    waiting.join(timeout=60)
    assert loaded["load"].how == "reused" and loaded["load"].meta.build_seconds == elsewhere.build_seconds
    assert "built now" not in folder_source.card(loaded["load"], root)

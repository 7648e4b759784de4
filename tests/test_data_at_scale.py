"""Image folders at scale: the splits are read from the memory-mapped cache on demand, so a process's private
memory does not grow with the dataset (measured on a folder of N and of 2N images, read whole by two processes
that share the cache's pages), and the on-demand images behave as the in-memory ones did."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cifar10_dist import api
from cifar10_dist.data.records import ImageSet, MappedImages
from tests.conftest import cli_env, run_in_process, run_log

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
                Image.fromarray(small).resize((SIZE, SIZE), Image.BILINEAR).save(folder / f"{index:04d}.jpg",
                                                                                 quality=90)
    return root


READER = """
import sys, time
from pathlib import Path
import ignite.distributed as idist
from cifar10_dist.data import folder_source, loaders
from cifar10_dist.outputs.tracking import private_memory_mib

root, size, barrier, name = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
before = private_memory_mib()
loaded = folder_source.load_folder(root, size)
batches = loaders.make_loaders(loaded.train, loaded.test, batch_size=50, num_workers=0, train_eval_size=0, seed=0)
for loader in (batches.train, batches.test):  # every image read once
    for images, labels in loader:
        pass
after = private_memory_mib()
(barrier / name).touch()
while len(list(barrier.iterdir())) < 2:  # both processes hold the map now
    time.sleep(0.05)
resident = proportional = 0  # KiB of the cache file's pages in this process: all of them, and its share of them
inside = False
for line in Path("/proc/self/smaps").read_text().splitlines():
    if "-" in line.split()[0] and len(line.split()) >= 5:  # a mapping's header: address range, ..., path
        inside = line.endswith("images.npy")
    elif inside and line.startswith(("Rss:", "Pss:")):
        value = int(line.split()[1])
        resident, proportional = (resident + value, proportional) if line.startswith("Rss") else (resident, proportional + value)
print(after - before, resident, proportional)
"""


def read_everything_twice_at_once(root: Path, barrier: Path) -> list[list[float]]:
    """Two processes read every image of the folder's cache at once: each one's private memory growth (MiB), and
    the cache file's resident and proportional pages (KiB: the proportional set splits a shared page among the
    processes that map it) while both hold the map."""
    barrier.mkdir()
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(root), str(SIZE), str(barrier), name],
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name in ("a", "b")]
    outputs = [reader.communicate(timeout=120) for reader in readers]
    assert all(reader.returncode == 0 for reader in readers), [error[-2000:] for _, error in outputs]
    return [[float(value) for value in out.split()] for out, _ in outputs]


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
    assert torch.equal(flipped[:], torch.where(torch.tensor([1, 0, 0, 1], dtype=torch.bool)[:, None, None, None],
                                               tensor.flip(-1), tensor))
    carried = pickle.loads(pickle.dumps(flipped))
    assert len(pickle.dumps(flipped)) < 1000  # path, rows and flips, never the pixels of the file
    assert torch.equal(carried[:], flipped[:])


def test_two_nodes_each_copy_the_cache_beside_the_data_to_their_local_disk_once(tmp_path):
    """Two simulated nodes, each its own cache_dir (its local disk): the first run there copies the finished
    cache built beside the data (no decoding) while the node's other process waits, a later run reuses it, and
    a copy cut short is never read (the next run copies again)."""
    from cifar10_dist.data import folder_cache, folder_source

    root = noise_folder(tmp_path / "shared", 20, 5)
    shared = Path(api.prepare_data(root, "folder", image_size=32).folder)
    for node in ("node-a", "node-b"):
        result = run_in_process("run", "--dataset=folder", f"--data_path={root}", f"--cache_dir={tmp_path / node}",
                                "--model=simple_cnn", "--batch_size=10", "--num_workers=0", "--num_epochs=1",
                                "--num_warmup_epochs=0", "--train_eval_size=0", "--backend=gloo",
                                "--nproc_per_node=2", f"--output_path={tmp_path / 'out'}", f"--run_name={node}")
        assert result.returncode == 0, result.stderr[-3000:]
        (local,) = (tmp_path / node).iterdir()
        assert local.name == shared.name and (local / "images.npy").read_bytes() == (shared / "images.npy").read_bytes()
        assert "(cache " + str(local) + ", copied from the data folder's)" in run_log(result, tmp_path / "out" / node)
        assert json.loads((tmp_path / "out" / node / "summary.json").read_text())["data_checks"]["cache"] == str(local)
    again = folder_source.load_folder(root, 32, cache_under=tmp_path / "node-a")
    assert again.how == "reused"
    (tmp_path / "node-a" / shared.name / "meta.json").unlink()  # a copy that never finished
    assert folder_cache.read_meta(tmp_path / "node-a" / shared.name) is None
    copied = folder_source.load_folder(root, 32, cache_under=tmp_path / "node-a")
    assert copied.how == "copied" and len(copied.train) == 40


def test_data_on_device_is_refused_in_one_line_when_the_images_would_not_fit():
    from cifar10_dist.data import loaders
    from cifar10_dist.errors import UserError

    loaders.check_fits(3 * 2**30, 4 * 2**30, torch.device("cpu"))  # 3 of 4 GiB: 75%, below the 80% share
    with pytest.raises(UserError) as refused:
        loaders.check_fits(7 * 2**30, 8 * 2**30, torch.device("cuda:0"))
    assert str(refused.value) == ("data_on_device=True: the images take 7.0 GiB and cuda:0 has 8.0 GiB free (80% "
                                  "of it may hold data): leave data_on_device off (a folder's cache is read on "
                                  "demand) or use fewer or smaller images")
    assert loaders.free_bytes(torch.device("cpu")) > 2**30  # this machine's MemAvailable, read for real

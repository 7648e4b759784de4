"""dataset=folder: an ImageFolder layout made here (PNG, JPEG, greyscale, alpha, palette, odd sizes), its checks
(each one line), its cache, and runs on it: training, exact resume, evaluation at world sizes 1-3, predict with
its class names, ONNX export with its normalisation."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cifar10_dist import api
from cifar10_dist.errors import UserError
from tests.conftest import run_in_this_process

COLOURS = {"cat": (200, 40, 40), "dog": (40, 200, 40), "eel": (40, 40, 200)}
# a run of seconds on the folder: 90 training images, 18 iterations over 3 epochs
FOLDER_RUN = [
    "--figures=False",
    "--dataset=folder",
    "--model=simple_cnn",
    "--batch_size=15",
    "--num_workers=0",
    "--num_epochs=3",
    "--num_warmup_epochs=1",
    "--train_eval_size=30",
    "--learning_rate=0.1",
]


def write_image(path: Path, colour: tuple[int, int, int], size: tuple[int, int], seed: int, mode: str = "RGB") -> None:
    rng = np.random.default_rng(seed)
    pixels = np.clip(rng.normal(colour, 60, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    if mode != "RGB":
        image = image.convert(mode)
    image.save(path)


def write_image_folder(
    root: Path, train: int = 30, test: int = 8, splits: tuple[str, ...] = ("train", "test"), classes: int = len(COLOURS)
) -> Path:
    """The first ``classes`` of COLOURS' classes, ``train`` and ``test`` images each, in every format and mode the
    reader converts."""
    modes = ("RGB", "L", "RGBA", "P")
    for split in splits:
        for label, (name, colour) in enumerate(list(COLOURS.items())[:classes]):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(train if split == "train" else test):
                suffix = ("png", "jpg", "webp", "bmp")[index % 4]
                mode = modes[index % 4] if suffix == "png" else "RGB"
                seed = 1000 * ("train", "test", "val").index(split) + 100 * label + index
                write_image(folder / f"{index:03d}.{suffix}", colour, (32 + index % 9, 32 + index % 5), seed, mode)
    return root


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("images") / "data")


def test_the_cache_holds_every_format_at_the_image_size_and_is_reused_until_a_file_changes(tmp_path):
    root = write_image_folder(tmp_path / "data", train=12, test=4)
    (root / "train" / "cat" / "notes.txt").write_text("not an image")  # ignored
    (root / "train" / "cat" / ".hidden.png").write_bytes(b"")  # hidden: ignored
    first = api.prepare_data(root, "folder", image_size=24)
    assert (first.train_images, first.test_images) == (36, 12)
    images = np.load(Path(first.folder) / "images.npy", mmap_mode="r")
    assert images.shape == (48, 3, 24, 24) and images.dtype == np.uint8
    assert "built now" in first.card and re.search(r"^cat +12 +4$", first.card, re.M)
    assert "width 32/34/40, height 32/33/36; stored at 24x24" in first.card
    again = api.prepare_data(root, "folder", image_size=24)
    assert again.folder == first.folder and "reused" in again.card
    os.utime(root / "test" / "dog" / "000.png", ns=(1, 1))  # a changed file: another fingerprint
    changed = api.prepare_data(root, "folder", image_size=24)
    assert changed.folder != first.folder and "built now" in changed.card


def test_the_normalisation_comes_from_the_training_images(tmp_path):
    root = write_image_folder(tmp_path / "data", train=6, test=2)
    card = api.prepare_data(root, "folder").card
    from cifar10_dist.data import folder_source

    loaded = folder_source.load_folder(root, 32)
    pixels = loaded.train.images[:].double() / 255
    assert loaded.info.mean == pytest.approx(tuple(pixels.mean(dim=(0, 2, 3)).tolist()), abs=1e-6)
    assert loaded.info.std == pytest.approx(tuple(pixels.std(dim=(0, 2, 3), unbiased=False).tolist()), abs=1e-6)
    assert loaded.info.classes == ("cat", "dog", "eel") and f"mean {loaded.info.mean[0]:.4f}" in card


@pytest.mark.parametrize(
    "arrange, message",
    [
        (lambda root: shutil.rmtree(root / "train"), "has no train/ folder: dataset=folder wants DIR/train/<class>/"),
        (
            lambda root: [shutil.rmtree(root / "train" / name) for name in ("dog", "eel")],
            "holds only 'cat' of the class folders a classifier needs (at least 2)",
        ),
        (lambda root: [p.unlink() for p in (root / "train" / "dog").iterdir()], "train/dog holds no images"),
        (lambda root: (root / "test" / "fox").mkdir(), "test has class folders that train/ lacks: fox"),
    ],
)
def test_a_layout_that_cannot_train_is_refused_in_one_line(tmp_path, arrange, message):
    root = write_image_folder(tmp_path / "data", train=2, test=1)
    arrange(root)
    with pytest.raises(UserError, match=re.escape(message)):
        api.prepare_data(root, "folder")
    result = run_in_this_process("run", *FOLDER_RUN, f"--data_path={root}", f"--output_path={tmp_path / 'out'}")
    assert result.returncode == 2 and message.split(":")[0] in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_folder_decoded_by_a_pool_of_processes_caches_what_one_process_decodes(tmp_path, monkeypatch):
    """Small folders are decoded in the building process (a spawned pool takes seconds to start); where the first
    images say a pool saves time, the rest go to one: the same pixels, hashes and unreadable files either way."""
    from cifar10_dist.data import cache_builds

    root = write_image_folder(tmp_path / "data", train=12, test=4)
    (root / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    here = api.prepare_data(root, "folder", image_size=24, skip_bad_images=True, cache_dir=tmp_path / "here")
    monkeypatch.setattr(cache_builds, "PROBE_IMAGES", 4)
    monkeypatch.setattr(cache_builds, "POOL_START_SECONDS", 0.0)  # any saving is worth a pool
    pooled = api.prepare_data(root, "folder", image_size=24, skip_bad_images=True, cache_dir=tmp_path / "pool")
    for name in ("images.npy", "hashes.npy"):
        assert (Path(pooled.folder) / name).read_bytes() == (Path(here.folder) / name).read_bytes(), name
    assert "unreadable files: 1" in here.card and "unreadable files: 1" in pooled.card


def test_unreadable_images_are_named_and_refused_unless_skipped(tmp_path):
    root = write_image_folder(tmp_path / "data", train=4, test=2)
    (root / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    jpeg = (root / "train" / "dog" / "001.jpg").read_bytes()
    (root / "train" / "dog" / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    with pytest.raises(
        UserError,
        match=r"^2 image file\(s\) in .* cannot be read: train/cat/broken.png \(.*\), "
        r"train/dog/truncated.jpg \(.*\): fix or remove them, or give "
        r"--skip_bad_images=True",
    ):
        api.prepare_data(root, "folder")
    skipped = api.prepare_data(root, "folder", skip_bad_images=True)
    assert skipped.train_images == 12 and "unreadable files: 2" in skipped.card
    assert "warning: 2 unreadable image file(s) skipped: train/cat/broken.png" in skipped.card


def test_duplicates_across_splits_are_found_counted_and_dropped_on_request(tmp_path):
    root = write_image_folder(tmp_path / "data", train=6, test=3, splits=("train", "test", "val"))
    shutil.copy(root / "train" / "cat" / "002.webp", root / "test" / "cat" / "copy.webp")
    Image.open(root / "train" / "dog" / "001.jpg").save(root / "val" / "dog" / "copy.png")  # same pixels, other file
    prepared = api.prepare_data(root, "folder")
    assert "duplicates across splits: 2 (dropped 0)" in prepared.card
    assert "warning: 2 image(s) of test/val are exact copies" in prepared.card
    assert (
        "val/dog/copy.png = train/dog/001.jpg" in prepared.card
        and "test/cat/copy.webp = train/cat/002.webp" in prepared.card
        and "--drop_test_duplicates=True removes them" in prepared.card
    )
    dropped = api.prepare_data(root, "folder", drop_test_duplicates=True)
    assert dropped.test_images == prepared.test_images - 1 and "(dropped 2)" in dropped.card


def test_imbalanced_classes_are_a_warning_with_the_counts(tmp_path):
    root = write_image_folder(tmp_path / "data", train=22, test=2)
    for path in sorted((root / "train" / "eel").iterdir())[2:]:
        path.unlink()
    card = api.prepare_data(root, "folder").card
    assert (
        "warning: classes are imbalanced: the largest has 11.0x the images of the smallest (above 10): cat 22, "
        "dog 22, eel 2; remedies: --sampler=balanced or --class_weights=auto, and "
        "--best_metric=balanced_accuracy or macro_f1" in card
    )


def test_without_a_test_folder_a_stable_tenth_of_train_is_the_test_set(tmp_path):
    root = write_image_folder(tmp_path / "data", train=20, test=0, splits=("train",))
    prepared = api.prepare_data(root, "folder")
    assert prepared.train_images + prepared.test_images == 60 and 0 < prepared.test_images < 15
    assert "test carved from train: no test/ folder" in prepared.card
    assert api.prepare_data(root, "folder").test_images == prepared.test_images


def test_a_folder_run_names_its_classes_everywhere_and_exports_with_its_normalisation(image_folder, tmp_path):
    result = run_in_this_process(
        "run",
        *FOLDER_RUN,
        f"--data_path={image_folder}",
        f"--output_path={tmp_path}",
        "--run_name=run",
        "--image_size=40",
        "--num_epochs=2",
        "--crop_fraction=0.8",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["data_checks"]["duplicates_across_splits"] == 0 and summary["final"]["test"]["num_samples"] == 24
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["dataset"]["info"]["classes"] == ["cat", "dog", "eel"]
    info = provenance["dataset"]["info"]  # stored at 40 / 0.8, seen through the central 80% (40 px)
    assert (info["image_size"], info["stored_size"], info["crop_fraction"]) == (40, 50, 0.8)
    checkpoint = sorted(run_dir.glob("training_checkpoint_*.pt"))[-1]
    predicted = run_in_this_process(
        "predict", f"--checkpoint={checkpoint}", str(image_folder / "test"), "--top_k=3", "--json"
    )
    rows = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert len(rows) == 24 and {entry["class"] for row in rows for entry in row["top_k"]} == {"cat", "dog", "eel"}
    evaluated = run_in_this_process("evaluate", f"--checkpoint={checkpoint}", "--json", "--num_workers=0")
    metrics = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert metrics["classes"] == ["cat", "dog", "eel"]
    assert metrics["accuracy"] == pytest.approx(summary["final"]["test"]["accuracy"])
    right = sum(row["top_k"][0]["class"] == Path(row["path"]).parent.name for row in rows)
    assert right / 24 == pytest.approx(metrics["accuracy"])  # predict sees the images as evaluate does
    exported = api.export(checkpoint, "onnx")
    sidecar = json.loads(Path(exported.sidecar).read_text())
    assert sidecar["classes"] == ["cat", "dog", "eel"] and sidecar["input"]["shape"] == ["N", 3, 40, 40]
    assert sidecar["input"]["resize"] == (
        "shorter side to 50 (bilinear), then the centre 50x50, then its centre 40x40 (crop_fraction 0.8)"
    )
    assert sidecar["mean"] == provenance["dataset"]["info"]["mean"] != [0.4914, 0.4822, 0.4465]
    assert exported.same_top1 == exported.num_images and "images of" in exported.images


def test_predict_with_a_two_class_model_shows_both_classes_by_default(tmp_path):
    root = write_image_folder(tmp_path / "data", train=12, test=4, classes=2)
    result = run_in_this_process(
        "run",
        *FOLDER_RUN,
        f"--data_path={root}",
        f"--output_path={tmp_path}",
        "--run_name=run",
        "--num_epochs=2",
        "--image_size=24",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = sorted((tmp_path / "run").glob("training_checkpoint_*.pt"))[-1]
    predicted = run_in_this_process("predict", f"--checkpoint={checkpoint}", str(root / "test"), "--json")
    assert predicted.returncode == 0, predicted.stderr
    rows = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert len(rows) == 8 and all(sorted(entry["class"] for entry in row["top_k"]) == ["cat", "dog"] for row in rows)
    assert (
        predicted.stderr.strip() == "note: 8 of 8 images were not 24x24 and were resized (shorter side to 24 "
        "pixels, then the centre 24x24)"
    )
    refused = run_in_this_process("predict", f"--checkpoint={checkpoint}", str(root / "test"), "--top_k=3")
    assert refused.returncode == 2
    assert refused.stderr.strip() == "error: top_k=3 is more than the model's 2 classes (cat, dog)"


def test_crops_cut_by_the_loaders_workers_train_exactly_as_crops_cut_in_the_training_process(image_folder, tmp_path):
    """On a CPU with workers, the workers cut the random-resized crops from numbered batches (the log says so):
    the same weights as without workers, also when resumed mid-epoch (iteration 10 of 18, inside epoch 2)."""
    common = [
        *FOLDER_RUN,
        f"--data_path={image_folder}",
        f"--output_path={tmp_path}",
        "--image_size=28",
        "--crop_fraction=0.875",
        "--random_resized_crop=0.35",
        "--checkpoint_every=10",
    ]
    runs = {"here": ["--num_workers=0"], "workers": ["--num_workers=2"]}
    for name, flags in runs.items():
        done = run_in_this_process(
            "run", *[arg for arg in common if arg != "--num_workers=0"], *flags, f"--run_name={name}"
        )
        assert done.returncode == 0, done.stderr[-3000:]
        said = (tmp_path / name / "run.log").read_text()
        assert ("crops and flips: cut by the DataLoader workers" in said) == (name == "workers")
    middle = tmp_path / "workers" / "training_checkpoint_10.pt"
    resumed = run_in_this_process(
        "run",
        *[arg for arg in common if arg != "--num_workers=0"],
        "--num_workers=2",
        "--run_name=resumed",
        f"--resume_from={middle}",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ends = [
        torch.load(tmp_path / name / "training_checkpoint_18.pt", weights_only=True)["model"]
        for name in ("here", "workers", "resumed")
    ]
    assert all(torch.equal(ends[0][key], end[key]) for end in ends[1:] for key in ends[0])


@pytest.mark.slow
def test_a_folder_run_resumes_bit_exactly_and_evaluates_alike_at_world_sizes_1_2_3(image_folder, tmp_path):
    """With random-resized crops from images stored at 32 and evaluation on their central 28 pixels."""
    common = [
        *FOLDER_RUN,
        f"--data_path={image_folder}",
        f"--output_path={tmp_path}",
        "--data_on_device=True",
        "--image_size=28",
        "--crop_fraction=0.875",
        "--random_resized_crop=0.35",
    ]
    whole = run_in_this_process("run", *common, "--run_name=whole", "--checkpoint_every=10")
    assert whole.returncode == 0, whole.stderr[-3000:]
    middle = tmp_path / "whole" / "training_checkpoint_10.pt"  # iteration 10 of 18: inside epoch 2
    resumed = run_in_this_process(
        "run", *common, "--run_name=resumed", "--checkpoint_every=10", f"--resume_from={middle}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ends = [
        torch.load(tmp_path / name / "training_checkpoint_18.pt", weights_only=True) for name in ("whole", "resumed")
    ]
    assert all(torch.equal(ends[0]["model"][key], ends[1]["model"][key]) for key in ends[0]["model"])
    checkpoint = tmp_path / "whole" / "training_checkpoint_18.pt"
    results = []
    for launch in ([], ["--backend=gloo", "--nproc_per_node=2"], ["--backend=gloo", "--nproc_per_node=3"]):
        evaluated = run_in_this_process("evaluate", f"--checkpoint={checkpoint}", "--json", "--num_workers=0", *launch)
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        results.append(json.loads(evaluated.stdout.strip().splitlines()[-1]))
    assert all(r["num_samples"] == 24 for r in results)
    assert results[0]["confusion_matrix"] == results[1]["confusion_matrix"] == results[2]["confusion_matrix"]
    assert (
        results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-6) == pytest.approx(results[2]["loss"], abs=1e-6)
    )


def test_a_damaged_cache_is_built_again_with_one_warning_and_its_pixels_are_never_read(tmp_path):
    root = write_image_folder(tmp_path / "data", train=6, test=3)
    cache = Path(api.prepare_data(root, "folder", image_size=24).folder)
    whole = (cache / "images.npy").read_bytes()
    with (cache / "images.npy").open("r+b") as stream:  # a copy cut short, a disk that filled
        stream.truncate(len(whole) // 2)
    result = run_in_this_process(
        "run",
        *FOLDER_RUN,
        f"--data_path={root}",
        "--image_size=24",
        "--num_epochs=1",
        "--num_warmup_epochs=0.5",
        "--train_eval_size=0",
        f"--output_path={tmp_path / 'out'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if "is damaged" in line]
    assert len(warnings) == 1, warnings
    assert (
        f"image cache {cache} is damaged (images.npy is {len(whole) // 2:,} bytes, its header says "
        f"{len(whole):,}): building it again from the images"
    ) in warnings[0]
    assert (cache / "images.npy").read_bytes() == whole  # the same pixels, decoded again
    labels = (cache / "labels.npy").read_bytes()
    (cache / "labels.npy").unlink()
    again = api.prepare_data(root, "folder", image_size=24)  # a file missing: built again too
    assert "built now" in again.card and (cache / "labels.npy").read_bytes() == labels


def test_a_damaged_cache_that_cannot_be_removed_is_one_line_naming_it(tmp_path, monkeypatch):
    root = write_image_folder(tmp_path / "data", train=6, test=3)
    cache = Path(api.prepare_data(root, "folder", image_size=24).folder)
    (cache / "labels.npy").write_bytes((cache / "labels.npy").read_bytes()[:-8])

    rename = Path.rename

    def read_only_data_folder(self, target):  # the data folder (and its cache) is read-only, the rest is not
        if str(self).startswith(str(root)):
            raise OSError(errno.EROFS, "Read-only file system")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", read_only_data_folder)
    with pytest.raises(UserError) as refused:
        api.prepare_data(root, "folder", image_size=24)
    assert str(refused.value) == (
        f"image cache {cache} is damaged (labels.npy is {(cache / 'labels.npy').stat().st_size:,} bytes, its header "
        f"says {(cache / 'labels.npy').stat().st_size + 8:,}) and cannot be removed here (Read-only file system): "
        "remove it (it is built again from the images) or give cache_dir=<a writable folder>"
    )
    followed = api.prepare_data(root, "folder", image_size=24, cache_dir=tmp_path / "writable")  # the advice works
    assert Path(followed.folder).parent == tmp_path / "writable" and "built now" in followed.card
    assert (cache / "labels.npy").is_file()  # the damaged cache beside the data is left as it was


def test_a_resume_after_a_class_folder_was_removed_names_it_and_writes_nothing(tmp_path):
    import shutil

    root = write_image_folder(tmp_path / "data", train=10, test=3)
    command = [
        "run",
        *FOLDER_RUN,
        "--num_epochs=1",
        "--num_warmup_epochs=0",
        f"--data_path={root}",
        f"--output_path={tmp_path / 'out'}",
        "--run_name=three",
        "--checkpoint_every=1",
    ]
    first = run_in_this_process(*command)
    assert first.returncode == 0, first.stderr[-2000:]
    run_dir = tmp_path / "out" / "three"

    def files() -> dict[str, bytes]:  # the run folder's own files (not the hidden lock of whoever claims it)
        return {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file() and path.name[0] != "."}

    before = files()
    shutil.rmtree(root / "train" / "dog")
    shutil.rmtree(root / "test" / "dog")
    for flags in ([], ["--resume_on_changed_data=True"]):
        refused = run_in_this_process(*command, "--resume_from=auto", *flags)
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines()[-1] == (
            f"error: checkpoint '{run_dir / 'training_checkpoint_2.pt'}' was trained on 3 classes and the data now "
            "has 2 (removed: dog): its model cannot continue on other classes, even with resume_on_changed_data; "
            "restore the class folders, or start afresh (another --run_name, or --overwrite; "
            "--pretrained=<checkpoint> starts from its weights with a new head)"
        )
        assert files() == before  # nothing rewritten, nothing added (provenance, config, TensorBoard events)

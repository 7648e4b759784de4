"""Taking a trained model out: ``predict`` on image files written by Pillow, and ``export`` to safetensors,
TorchScript and ONNX, each file loaded back by its own runtime and compared with the PyTorch model."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cifar10_dist import models
from cifar10_dist.data import augmentation, cifar, cifar_layouts
from cifar10_dist.data.datasets import MEAN, STD, ImageSet
from cifar10_dist.data.synthetic import make_synthetic
from tests.conftest import TINY_WIDTH, run_in_this_process


@pytest.fixture(scope="module")
def trained(long_reference) -> Path:
    """simple_cnn trained by the LONG reference run on small_dataset: its best-model file."""
    return sorted(long_reference.glob("best_model_*.pt"))[-1]


def write_png_folder(images: ImageSet, folder: Path) -> None:
    """Each image as folder/<class name>/<index>.png (lossless: the pixels are the dataset's)."""
    for index, (image, label) in enumerate(zip(images.images, images.labels)):
        target = folder / cifar.CLASSES[label] / f"{index:04d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(target)


def test_predict_on_png_files_gets_exactly_the_accuracy_evaluate_reports(trained, small_dataset, tmp_path):
    """The 301 test images as PNG files in class folders: top-1 of predict --json against the folder names gives
    the accuracy evaluate computes from the dataset files (same pixels, normalisation and model)."""
    test = cifar.read_cifar10(small_dataset / cifar_layouts.FOLDER)[1]
    write_png_folder(test, tmp_path / "images")
    predicted = run_in_this_process(
        "predict", f"--checkpoint={trained}", str(tmp_path / "images"), "--json", "--top_k=3", "--batch_size=100"
    )
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    lines = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert len(lines) == len(test) == 301
    for line in lines:
        probabilities = [entry["probability"] for entry in line["top_k"]]
        assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1.000001
    correct = sum(Path(line["path"]).parent.name == line["top_k"][0]["class"] for line in lines)
    evaluated = run_in_this_process("evaluate", f"--checkpoint={trained}", "--json", "--num_workers=0")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert correct == round(metrics["accuracy"] * metrics["num_samples"])


def test_predict_converts_resizes_and_reports_unreadable_files(trained, tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "mixed"
    (folder / "nested").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / "rgb.png")
    Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8)).save(folder / "gray.png")
    Image.fromarray(rng.integers(0, 256, (32, 32, 4), dtype=np.uint8)).save(folder / "rgba.png")
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / "nested" / "big.jpg")
    (folder / "broken.png").write_bytes(b"this is not an image")
    (folder / "notes.txt").write_text("not an image, and not named like one: skipped in a folder")
    result = run_in_this_process("predict", f"--checkpoint={trained}", str(folder))
    assert result.returncode == 2
    assert sorted(line.split(":")[0] for line in result.stdout.splitlines()) == sorted(
        str(folder / name) for name in ("gray.png", "nested/big.jpg", "rgb.png", "rgba.png")
    )
    for line in result.stdout.splitlines():
        names_and_values = line.split(": ", 1)[1].split(", ")
        assert len(names_and_values) == 3 and all(item.split()[0] in cifar.CLASSES for item in names_and_values)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{folder / 'broken.png'}: cannot be read as an image" in errors[0]
    assert "1 of 4 images were not 32x32 and were resized" in result.stderr


def test_predict_on_a_folder_without_images_is_one_line(trained, tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    result = run_in_this_process("predict", f"--checkpoint={trained}", str(tmp_path / "empty"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'empty'}: the folder holds no image files (searched recursively)"
    ]


def test_predict_api_takes_paths_pil_images_and_uint8_tensors_alike(trained, tmp_path):
    import cifar10_dist

    images = make_synthetic(1, 6, seed=3)[1].images
    paths = []
    for index, image in enumerate(images):
        paths.append(tmp_path / f"{index}.png")
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(paths[-1])
    from_tensor = cifar10_dist.predict(trained, images)
    from_paths = cifar10_dist.predict(trained, paths)
    from_pil = cifar10_dist.predict(trained, [Image.open(path) for path in paths])
    assert from_tensor.shape == (6, 10) and torch.allclose(from_tensor.sum(1), torch.ones(6))
    assert torch.equal(from_tensor, from_paths) and torch.equal(from_tensor, from_pil)
    model = models.build_model("simple_cnn", {"width": TINY_WIDTH})
    model.load_state_dict(torch.load(trained, weights_only=True)["model"])
    with torch.no_grad():
        expected = torch.softmax(model.eval()(augmentation.normalize(images)), dim=1)
    assert torch.allclose(from_tensor, expected, atol=1e-6)
    mirrored = cifar10_dist.predict(trained, images, tta=1)
    assert not torch.allclose(mirrored, from_tensor)  # tta=1 averages in the mirror images


# ---------------------------------------------------------------- export

USER_MODEL = textwrap.dedent("""\
    import torch
    from torch import nn


    class Mine(nn.Module):
        def __init__(self, width: int = 8) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.SiLU(),
                                          nn.AdaptiveAvgPool2d(2), nn.Flatten())
            self.head = nn.Linear(4 * width, 10)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(images))


    class Loud(Mine):  # logits in the tens of thousands (trained with no pull towards small logits)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return super().forward(images) * 1e5


    class CumMax(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(3, 10)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.head(torch.cummax(images, dim=3)[0].mean((2, 3)))
    """)


def saved_model(folder: Path, model: str, model_kwargs: dict | None = None) -> tuple[Path, torch.nn.Module]:
    """A best-model file as training writes it (model weights and meta with the config) for a freshly built model
    whose BatchNorm statistics are not the defaults (so that eval mode matters)."""
    torch.manual_seed(0)
    network = models.build_model(model, model_kwargs)
    if isinstance(network, models.AirbenchNet):
        network.init_whitening(augmentation.normalize(make_synthetic(1, 256)[1].images))
    with torch.no_grad():
        network.train()(torch.randn(16, 3, 32, 32) * 2 + 0.5)  # moves the running statistics
    path = folder / f"best_model_1_val_accuracy=0.5000_{model.replace('/', '_').replace(':', '_')}.pt"
    torch.save(
        {
            "model": network.state_dict(),
            "meta": {"config": {"model": model, "model_kwargs": model_kwargs, "dataset": "synthetic"}},
        },
        path,
    )
    return path, network.eval()


# cifar_resnet18 is resnet18's layers with a CIFAR stem (one operator fewer: no max-pool), at 16x its compute here
# (19 s of a core on an AVX2 EPYC): resnet18 stands for both
FAMILIES = ["trained simple_cnn", "airbench", "resnet18", "user model"]


@pytest.fixture(scope="module")
def checkpoints(trained, tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    folder = tmp_path_factory.mktemp("to-export")
    (folder / "mine.py").write_text(USER_MODEL)
    trained_model = models.build_model("simple_cnn", {"width": TINY_WIDTH})
    trained_model.load_state_dict(torch.load(trained, weights_only=True)["model"])
    return {
        "trained simple_cnn": (trained, trained_model.eval()),
        "airbench": saved_model(folder, "airbench"),
        "resnet18": saved_model(folder, "resnet18"),  # torchvision as it is (the default model)
        "user model": saved_model(folder, f"{folder / 'mine.py'}:Mine", {"width": 6}),
    }


def export(checkpoint: Path, format: str, output: Path) -> str:
    result = run_in_this_process("export", f"--checkpoint={checkpoint}", f"--format={format}", f"--output={output}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert output.is_file() and Path(f"{output}.json").is_file()
    return result.stdout


@pytest.mark.parametrize(
    "family", [pytest.param(family, marks=[pytest.mark.slow] if "resnet" in family else []) for family in FAMILIES]
)  # the resnet's exports: the same code, 10 s of a core
def test_every_export_computes_what_the_model_computes(checkpoints, family, tmp_path):
    """safetensors read back torch.equal; TorchScript and ONNX (with ONNX Runtime, at batch sizes 1 and 7) give
    the model's logits; the sidecar carries the reference, classes and normalisation."""
    import onnx
    import onnxruntime
    from safetensors.torch import load_file

    checkpoint, model = checkpoints[family]
    images = augmentation.normalize(make_synthetic(1, 7, seed=5)[1].images)
    with torch.no_grad():
        expected = model(images)

    printed = export(checkpoint, "safetensors", tmp_path / "model.safetensors")
    state = model.state_dict()
    loaded = load_file(tmp_path / "model.safetensors")
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[key], state[key]) for key in state)
    assert f"read back: {len(state)} of {len(state)} tensors torch.equal" in printed
    sidecar = json.loads((tmp_path / "model.safetensors.json").read_text())
    recorded = torch.load(checkpoint, weights_only=True)["meta"]["config"]
    assert sidecar["model"] == recorded["model"] and sidecar["classes"] == list(cifar.CLASSES)
    assert sidecar["mean"] == list(MEAN) and sidecar["std"] == list(STD)

    export(checkpoint, "torchscript", tmp_path / "model.pt")
    with warnings.catch_warnings():  # torch.jit.load is deprecated (a FutureWarning): loaded here on purpose
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.load(tmp_path / "model.pt")
    with torch.no_grad():
        assert torch.allclose(scripted(images), expected, atol=1e-5)

    printed = export(checkpoint, "pt2", tmp_path / "model.pt2")
    assert "torch.export.load vs PyTorch on 64 " in printed and "same top-1 class on 64 of 64" in printed
    extra = {"metadata.json": ""}
    program = torch.export.load(tmp_path / "model.pt2", extra_files=extra)
    assert json.loads(extra["metadata.json"])["classes"] == list(cifar.CLASSES)
    for batch in (images[:1], images):  # a dynamic batch dimension
        with torch.no_grad():
            assert torch.allclose(program.module()(batch), expected[: len(batch)], rtol=1e-4, atol=1e-5)

    printed = export(checkpoint, "onnx", tmp_path / "model.onnx")
    assert "ONNX Runtime (CPU) vs PyTorch on 64 " in printed and "same top-1 class on 64 of 64" in printed
    onnx.checker.check_model(str(tmp_path / "model.onnx"), full_check=True)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in (images[:1], images):
        logits = torch.from_numpy(session.run(None, {"images": batch.numpy()})[0])
        assert (logits - expected[: len(batch)]).abs().max() <= 1e-4
        assert torch.equal(logits.argmax(1), expected[: len(batch)].argmax(1))
    metadata = {entry.key: entry.value for entry in onnx.load(str(tmp_path / "model.onnx")).metadata_props}
    assert json.loads(metadata["classes"]) == list(cifar.CLASSES)


def test_an_export_of_a_model_with_large_logits_is_accepted_by_their_scale(checkpoints, tmp_path):
    """Rounding of fp32 kernels grows with the values: logits of 1e4 differ by more than a fixed 1e-4 between
    ONNX Runtime and PyTorch and are still the same computation."""
    folder = checkpoints["user model"][0].parent
    checkpoint, model = saved_model(tmp_path, f"{folder / 'mine.py'}:Loud", {"width": 32})
    result = run_in_this_process(
        "export", f"--checkpoint={checkpoint}", "--format=onnx", f"--output={tmp_path / 'm.onnx'}"
    )
    assert result.returncode == 0, result.stderr
    found = re.search(
        r"logits max abs difference (\S+) \((\S+) of their scale (\S+); accepted: 1e-03 of it\), "
        r"same top-1 class on 64 of 64",
        result.stdout,
    )
    assert found, result.stdout
    difference, relative, scale = (float(value) for value in found.groups())
    assert scale > 1e4 and difference > 1e-4 and relative <= 1e-3 and (tmp_path / "m.onnx").is_file()


def test_an_export_that_computes_something_else_is_refused_naming_both_numbers(trained, tmp_path, monkeypatch):
    """A graph whose last layer is 1% off keeps the top-1 class of most images, and is still refused."""
    original = torch.onnx.export

    def export_a_perturbed_copy(model, *args, **kwargs):
        import copy

        wrong = copy.deepcopy(model)
        last = [module for module in wrong.modules() if isinstance(module, torch.nn.Linear)][-1]
        with torch.no_grad():
            last.weight.mul_(1.01)
            last.bias.add_(0.05 * last.bias.abs().max())
        return original(wrong, *args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", export_a_perturbed_copy)
    result = run_in_this_process(
        "export", f"--checkpoint={trained}", "--format=onnx", f"--output={tmp_path / 'm.onnx'}"
    )
    assert result.returncode == 2
    assert re.fullmatch(
        r"error: the ONNX export of \S+ does not compute what the model computes: logits max abs "
        r"difference \S+ \(\S+ of their scale \S+; accepted: 1e-03 of it\), same top-1 on \d+ of 64 "
        r"images; no file written\n",
        result.stderr,
    ), result.stderr
    assert not any(tmp_path.iterdir())


def test_a_model_onnx_cannot_express_is_one_line_naming_the_operator(tmp_path, checkpoints):
    folder = checkpoints["user model"][0].parent
    checkpoint, _ = saved_model(tmp_path, f"{folder / 'mine.py'}:CumMax")
    result = run_in_this_process("export", f"--checkpoint={checkpoint}", "--format=onnx")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: model={folder / 'mine.py'}:CumMax cannot be exported to onnx: operator aten.cummax has no ONNX "
        f"conversion in torch {torch.__version__}"
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == [checkpoint.name]  # nothing half-written


def test_a_missing_export_package_is_one_line_saying_what_to_install(trained, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    result = run_in_this_process(
        "export", f"--checkpoint={trained}", "--format=onnx", f"--output={tmp_path / 'm.onnx'}"
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: format=onnx needs the onnxruntime package, which is not installed: pip install 'cifar10-dist[export]'"
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--format=tflite"],
            "error: format='tflite' is not accepted: choose one of safetensors, pt2, onnx, torchscript",
        ),
        (
            ["--format=onnx", "--output=/no/such/folder/m.onnx"],
            "error: output='/no/such/folder/m.onnx': the folder /no/such/folder does not exist",
        ),
        ([], "error: export needs --format=safetensors|pt2|onnx|torchscript (cifar10-dist export --help)"),
    ],
)
def test_bad_export_arguments_are_one_line(trained, args, expected):
    result = run_in_this_process("export", f"--checkpoint={trained}", *args)
    assert result.returncode == 2 and result.stderr.strip() == expected


def test_the_docs_predict_json_example_has_the_entries_its_command_asks_for(trained, tmp_path):
    """docs/models-in-and-out.md's --json example: as many top_k entries as its command line gives (the default
    where it gives none), with the keys a real run prints."""
    from cifar10_dist.config.commands import DEFAULT_TOP_K

    doc = (Path(__file__).resolve().parents[1] / "docs" / "models-in-and-out.md").read_text()
    command, output = re.search(r"\n\$ (cifar10-dist predict [^\n]*--json[^\n]*)\n(\{[^\n]*\})\n", doc).groups()
    asked = re.search(r"--top_k=(\d+)", command)
    example = json.loads(output)
    assert len(example["top_k"]) == (int(asked.group(1)) if asked else DEFAULT_TOP_K)
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(tmp_path / "black.png")
    real = run_in_this_process("predict", f"--checkpoint={trained}", str(tmp_path / "black.png"), "--json")
    printed = json.loads(real.stdout.splitlines()[0])
    assert printed.keys() == example.keys() and printed["top_k"][0].keys() == example["top_k"][0].keys()
    assert len(printed["top_k"]) == DEFAULT_TOP_K


def test_every_place_that_lists_the_export_formats_lists_them_all():
    """config.export_formats.FORMATS is the one registry: the CLI's help pages, its usage line, the API, the deployment
    package and docs/models-in-and-out.md's table name every format (pt2 was missing from three of them)."""
    from cifar10_dist import api, deployment
    from cifar10_dist.cli import help_pages as cli_help
    from cifar10_dist.config.export_formats import FORMATS

    repo = Path(__file__).resolve().parents[1]
    table = [
        line for line in (repo / "docs" / "models-in-and-out.md").read_text().splitlines() if line.startswith("| `")
    ]
    usage = run_in_this_process("export", "--checkpoint=x.pt")
    places = {
        "export --help": cli_help.page("export"),
        "--help": cli_help.main_help(80),
        "api.export": api.export.__doc__,
        "deployment": deployment.__doc__,
        "the usage error": usage.stderr,
        "the docs' table": "\n".join(line.split("|")[1] for line in table),
    }
    for place, text in places.items():
        missing = [name for name, record in FORMATS.items() if name.lower() not in text.lower()]
        assert not missing, f"{place} does not list {missing}"
    assert all(f"`{record.suffix}`" in "\n".join(table) for record in FORMATS.values())


def test_evaluate_given_an_export_refuses_in_one_line_naming_what_reads_it(trained, tmp_path):
    from cifar10_dist import api

    onnx_file = Path(api.export(trained, "onnx", tmp_path / "model.onnx").path)
    result = run_in_this_process("evaluate", f"--checkpoint={onnx_file}")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: evaluate reads training checkpoints and best-model files (.pt), and '{onnx_file}' is an export "
        f"(onnx): classify images with it: cifar10-dist predict --checkpoint={onnx_file} IMAGES; for test-set metrics "
        "evaluate the checkpoint it was exported from (its model.onnx.json names it)"
    )
    assert json.loads((tmp_path / "model.onnx.json").read_text())["checkpoint"] == str(trained)
    program = run_in_this_process("evaluate", f"--checkpoint={tmp_path / 'model.pt2'}")
    assert program.returncode == 2
    assert "is an export (pt2): for test-set metrics evaluate the checkpoint" in program.stderr

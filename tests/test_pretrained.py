"""A pretrained start (``pretrained``): torchvision weights from a file placed under torch's standard cache name
(no network here), our own checkpoints and exported safetensors files with another class count, the head replaced
per torchvision family, a misfit refused in one line, and no download possible refused before anything starts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torchvision

from cifar10_dist import api, models
from cifar10_dist.errors import UserError
from cifar10_dist.models import pretrained
from tests.conftest import run_in_this_process

RESNET18_FILE = "resnet18-f37072fd.pth"  # torchvision's IMAGENET1K_V1 file name (its URL's last part)
RUN = [
    "--dataset=synthetic",
    "--synthetic_size=64",
    "--figures=False",
    "--num_epochs=1",
    "--num_warmup_epochs=0",
    "--batch_size=32",
    "--num_workers=0",
    "--train_eval_size=0",
    "--learning_rate=0.01",
]


@pytest.fixture()
def torch_home(tmp_path, monkeypatch) -> Path:
    """An empty torch cache of its own (TORCH_HOME), as on a machine that never downloaded anything."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    return tmp_path / "torch_home"


def place_resnet18_weights(torch_home: Path) -> dict[str, torch.Tensor]:
    """Stand-in ImageNet weights (random, 1000 classes) under the cache name torchvision loads them from."""
    torch.manual_seed(123)
    state = torchvision.models.resnet18().state_dict()
    (torch_home / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(state, torch_home / "hub" / "checkpoints" / RESNET18_FILE)
    return state


def test_torchvision_weights_from_the_cache_load_with_a_new_head_and_their_normalisation(torch_home, tmp_path):
    expected = place_resnet18_weights(torch_home)
    weights = pretrained.resolve("resnet18", "IMAGENET1K_V1")
    assert weights.path == str(torch_home / "hub" / "checkpoints" / RESNET18_FILE)
    assert weights.url == "https://download.pytorch.org/models/resnet18-f37072fd.pth"
    model = models.build_model("resnet18", None, 10)
    pretrained.load(model, weights, tuple("abcdefghij"))
    state = model.state_dict()
    assert all(torch.equal(state[name], expected[name]) for name in expected if not name.startswith("fc."))
    assert state["fc.weight"].shape == (10, 512)

    result = run_in_this_process(
        "run", *RUN, "--model=resnet18", "--pretrained=IMAGENET1K_V1", f"--output_path={tmp_path}", "--run_name=tv"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "INFO pretrained resnet18 IMAGENET1K_V1: layer fc replaced for the run's 10 classes (the weights' head "
        "has 1000 other classes); new tensors: fc.weight, fc.bias; 120 loaded"
    ) in result.stderr
    provenance = json.loads((tmp_path / "tv" / "provenance.json").read_text())
    assert provenance["pretrained"]["url"] == weights.url and len(provenance["pretrained"]["sha256"]) == 64
    assert provenance["dataset"]["info"]["mean"] == [0.485, 0.456, 0.406]  # ImageNet's, used by evaluate/predict
    assert provenance["dataset"]["info"]["std"] == [0.229, 0.224, 0.225]


def test_without_network_or_the_cached_file_the_run_stops_before_anything_starts(torch_home, tmp_path):
    result = run_in_this_process(
        "run", *RUN, "--model=resnet18", "--pretrained=DEFAULT", f"--output_path={tmp_path}", "--run_name=offline"
    )
    cached = torch_home / "hub" / "checkpoints" / RESNET18_FILE
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: pretrained=DEFAULT: {RESNET18_FILE} is not in torch's cache and cannot be downloaded (")
    )
    assert result.stderr.strip().endswith(
        f"download https://download.pytorch.org/models/{RESNET18_FILE} and place "
        f"it at {cached} (TORCH_HOME chooses the cache)"
    )
    assert not (tmp_path / "offline").exists() and not cached.exists()  # nothing half-downloaded either


@pytest.mark.parametrize(
    ("model", "name", "message"),
    [
        (
            "resnet18",
            "IMAGENET1K_V2",
            "pretrained='IMAGENET1K_V2' is not a weights name of resnet18: did you mean "
            "'IMAGENET1K_V1'? choose one of IMAGENET1K_V1, DEFAULT (or give a file)",
        ),
        (
            "simple_cnn",
            "DEFAULT",
            "pretrained='DEFAULT' is a weights name, which only torchvision models have (model=simple_cnn is not one)",
        ),
        ("simple_cnn", "no/such/file.pt", "pretrained='no/such/file.pt' does not exist"),
    ],
)
def test_a_pretrained_value_that_names_nothing_is_one_line(model, name, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        pretrained.resolve(model, name)


@pytest.mark.parametrize(
    ("family", "head"),
    [
        ("resnet18", "fc"),
        ("mobilenet_v3_small", "classifier.3"),
        ("efficientnet_b0", "classifier.1"),
        ("vit_b_16", "heads.head"),
        ("convnext_tiny", "classifier.2"),
        ("densenet121", "classifier"),
    ],
)
def test_the_head_replaced_is_the_last_linear_layer_of_each_torchvision_family(family, head):
    with torch.device("meta"):  # the architecture only: no memory, no initialisation
        model = torchvision.models.get_model(family, weights=None)
    name, module = pretrained.head_of(model)
    assert name == head and module.out_features == 1000


@pytest.fixture(scope="module")
def our_run(tmp_path_factory) -> Path:
    """A simple_cnn (width 8) trained by us on synthetic data (10 classes): its folder."""
    folder = tmp_path_factory.mktemp("ours")
    api.train(
        dataset="synthetic",
        synthetic_size=64,
        model="simple_cnn",
        model_kwargs={"width": 8},
        num_epochs=1,
        num_warmup_epochs=0,
        batch_size=32,
        num_workers=0,
        train_eval_size=0,
        output_path=str(folder),
        run_name="ten",
    )
    return folder / "ten"


def test_our_checkpoint_starts_a_model_for_other_classes_with_its_head_new(our_run, caplog):
    best = sorted(our_run.glob("best_model_*.pt"))[-1]
    recorded = torch.load(best, weights_only=True)["model"]
    weights = pretrained.resolve("simple_cnn", str(best))
    assert weights.kind == "file" and len(weights.classes) == 10 and weights.mean == (0.4914, 0.4822, 0.4465)
    model = models.build_model("simple_cnn", {"width": 8}, 3)
    with caplog.at_level(logging.INFO, logger="cifar10_dist"):
        pretrained.load(model, weights, ("cat", "dog", "eel"))
    head = [name for name in recorded if name.startswith(pretrained.head_of(model)[0] + ".")]
    state = model.state_dict()
    assert all(torch.equal(state[name], recorded[name]) for name in recorded if name not in head)
    assert [tuple(state[name].shape) for name in head] == [(3, pretrained.head_of(model)[1].in_features), (3,)]
    assert "10 other classes" in caplog.text and f"new tensors: {', '.join(head)}" in caplog.text
    same_count = models.build_model("simple_cnn", {"width": 8}, 10)  # ten classes, but not CIFAR-10's ten
    pretrained.load(same_count, weights, tuple(f"class{index}" for index in range(10)))
    assert not torch.equal(same_count.state_dict()[head[0]], recorded[head[0]])


def test_an_exported_safetensors_file_with_the_same_classes_loads_whole(our_run, tmp_path):
    best = sorted(our_run.glob("best_model_*.pt"))[-1]
    exported = api.export(best, "safetensors", tmp_path / "ten.safetensors")
    weights = pretrained.resolve("simple_cnn", exported.path)
    assert weights.classes == ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    model = models.build_model("simple_cnn", {"width": 8}, 10)
    pretrained.load(model, weights, weights.classes)
    recorded = torch.load(best, weights_only=True)["model"]
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in recorded.items())


def test_weights_of_another_architecture_are_refused_naming_the_first_misfit(our_run):
    best = sorted(our_run.glob("best_model_*.pt"))[-1]
    wider = models.build_model("simple_cnn", {"width": 16}, 10)
    with pytest.raises(
        UserError,
        match=r"^pretrained \S+ does not fit this model: 15 tensors of another shape, "
        r"first 0\.0\.weight: \(8, 3, 3, 3\) there, \(16, 3, 3, 3\) here",
    ):
        pretrained.load(wider, pretrained.resolve("simple_cnn", str(best)), tuple(range(10)))


def test_a_folder_run_fine_tuned_from_our_checkpoint_evaluates_with_the_checkpoints_normalisation(our_run, tmp_path):
    """Our CIFAR-trained model as the start of a 3-class image-folder run: the head is new, the run records the
    starting weights' normalisation, and evaluate uses it on the folder's test images."""
    from tests.test_image_folders import FOLDER_RUN, write_image_folder

    root = write_image_folder(tmp_path / "data", train=12, test=4)
    best = sorted(our_run.glob("best_model_*.pt"))[-1]
    result = run_in_this_process(
        "run",
        *FOLDER_RUN,
        f"--data_path={root}",
        "--model=simple_cnn",
        '--model_kwargs={"width": 8}',
        f"--pretrained={best}",
        "--num_epochs=2",
        f"--output_path={tmp_path}",
        "--run_name=tuned",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "replaced for the run's 3 classes (the weights' head has 10 other classes)" in result.stderr
    provenance = json.loads((tmp_path / "tuned" / "provenance.json").read_text())
    assert provenance["pretrained"]["kind"] == "file" and provenance["pretrained"]["path"] == str(best.resolve())
    assert provenance["dataset"]["info"]["mean"] == [0.4914, 0.4822, 0.4465]  # the start's, not the folder's
    checkpoint = sorted((tmp_path / "tuned").glob("best_model_*.pt"))[-1]
    evaluated = api.evaluate(checkpoint, num_workers=0)
    summary = json.loads((tmp_path / "tuned" / "summary.json").read_text())
    assert list(evaluated.classes) == ["cat", "dog", "eel"]
    assert evaluated.accuracy == pytest.approx(summary["final"]["test"]["accuracy"])
    sidecar = json.loads(
        Path(api.export(checkpoint, "safetensors", tmp_path / "tuned.safetensors").sidecar).read_text()
    )
    assert sidecar["mean"] == [0.4914, 0.4822, 0.4465] and sidecar["classes"] == ["cat", "dog", "eel"]  # for predict
    image = next((root / "test" / "eel").iterdir())
    assert api.predict(checkpoint, [image]).shape == (1, 3)


# ---------------------------------------------------------------- the head first, then everything


def test_frozen_epochs_leave_the_backbone_and_its_batchnorm_statistics_as_loaded(our_run, tmp_path):
    best = sorted(our_run.glob("best_model_*.pt"))[-1]
    start = torch.load(best, weights_only=True)["model"]
    result = run_in_this_process(
        "run",
        *RUN,
        "--num_epochs=2",
        "--model=simple_cnn",
        '--model_kwargs={"width": 8}',
        f"--pretrained={best}",
        "--freeze_epochs=1",
        "--checkpoint_every=2",
        f"--output_path={tmp_path}",
        "--run_name=frozen",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    head = pretrained.head_of(models.build_model("simple_cnn", {"width": 8}))[0] + "."
    after_epoch_1 = torch.load(tmp_path / "frozen" / "training_checkpoint_2.pt", weights_only=True)["model"]
    after_epoch_2 = torch.load(tmp_path / "frozen" / "training_checkpoint_4.pt", weights_only=True)["model"]
    backbone = [name for name in start if not name.startswith(head)]
    assert any("running_mean" in name for name in backbone)  # BatchNorm statistics are among them
    assert all(torch.equal(after_epoch_1[name], start[name]) for name in backbone)  # weights and statistics
    assert not torch.equal(after_epoch_1[head + "weight"], start[head + "weight"])  # the head trained
    assert not all(torch.equal(after_epoch_2[name], start[name]) for name in backbone)  # then everything did


def test_a_run_resumed_inside_its_frozen_epochs_ends_bit_exactly_as_the_uninterrupted_one(our_run, tmp_path):
    best = sorted(our_run.glob("best_model_*.pt"))[-1]
    common = [
        "run",
        *RUN,
        "--num_epochs=3",
        "--model=simple_cnn",
        '--model_kwargs={"width": 8}',
        f"--pretrained={best}",
        "--freeze_epochs=2",
        "--backbone_lr_scale=0.5",
        "--checkpoint_every=3",
        f"--output_path={tmp_path}",
    ]
    whole = run_in_this_process(*common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    resumed = run_in_this_process(
        *common, "--run_name=resumed", f"--resume_from={tmp_path / 'whole' / 'training_checkpoint_3.pt'}"
    )  # frozen until 4
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ours = torch.load(tmp_path / "resumed" / "training_checkpoint_6.pt", weights_only=True)
    theirs = torch.load(tmp_path / "whole" / "training_checkpoint_6.pt", weights_only=True)
    assert all(torch.equal(ours["model"][name], theirs["model"][name]) for name in theirs["model"])
    assert "tensors loaded" in whole.stderr and "tensors loaded" not in resumed.stderr  # the start not loaded again


def test_the_backbone_learns_at_its_scale_and_not_at_all_while_frozen():
    from cifar10_dist.config import load_config
    from cifar10_dist.training.setup import optimizers, schedules

    config = load_config(
        model="simple_cnn", learning_rate=0.2, num_warmup_epochs=0, num_epochs=4, freeze_epochs=1, backbone_lr_scale=0.1
    )
    model = models.build_model("simple_cnn")
    head = {id(parameter) for parameter in pretrained.head_of(model)[1].parameters()}
    optimizer, group_schedules = optimizers.build_optimizer(model, config, total_iterations=40)
    scheduler = schedules.create_lr_scheduler(optimizer, 0.2, 0, 40, group_schedules=group_schedules)
    is_head = [all(id(p) in head for p in group["params"]) for group in optimizer.param_groups]
    assert sorted(is_head) == [False, True]
    lrs = []
    for _ in range(40):
        scheduler(None)
        lrs.append({flag: group["lr"] for flag, group in zip(is_head, optimizer.param_groups)})
    assert all(step[False] == 0 for step in lrs[:10]) and lrs[10][False] > 0  # frozen for the first epoch
    assert all(step[False] == pytest.approx(0.1 * step[True]) for step in lrs[10:])


# ---------------------------------------------------------------- timm's zoo


def place_timm_weights(hf_home: Path, name: str) -> dict[str, torch.Tensor]:
    """Stand-in pretrained weights of timm's ``name`` (random, 1000 classes) in the Hugging Face cache layout
    (hub/models--timm--NAME/{refs/main, snapshots/REVISION/model.safetensors}), as a download leaves them."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    repository = hf_home / "hub" / f"models--timm--{name}"
    revision = "0" * 40
    (repository / "refs").mkdir(parents=True)
    (repository / "refs" / "main").write_text(revision)
    (repository / "snapshots" / revision).mkdir(parents=True)
    torch.manual_seed(7)
    state = timm.create_model(name.split(".")[0]).state_dict()
    save_file(state, str(repository / "snapshots" / revision / "model.safetensors"))
    return state


def test_a_timm_model_starts_from_its_pretrained_tag_in_the_hugging_face_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    expected = place_timm_weights(tmp_path / "hf", "test_resnet.r160_in1k")
    weights = pretrained.resolve("timm:test_resnet.r160_in1k", "true")
    assert weights.kind == "timm" and weights.mean == (0.5, 0.5, 0.5)  # timm's pretrained_cfg for it
    pretrained.fetch(weights)  # cached: nothing to download
    model = models.build_model("timm:test_resnet.r160_in1k", None, 5)
    pretrained.load(model, weights, tuple("abcde"))
    state = model.state_dict()
    assert all(torch.equal(state[name], expected[name]) for name in expected if not name.startswith("fc."))
    assert state["fc.weight"].shape == (5, 96)


def test_a_timm_model_without_network_or_cache_is_refused_at_once(tmp_path, monkeypatch):
    pytest.importorskip("timm")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    result = run_in_this_process(
        "run",
        *RUN,
        "--model=timm:test_resnet.r160_in1k",
        "--pretrained=true",
        f"--output_path={tmp_path}",
        "--run_name=offline",
    )
    assert result.returncode == 2 and not (tmp_path / "offline").exists()
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: pretrained=true: the weights of timm:test_resnet.r160_in1k are not in the Hugging Face cache "
            "(HF_HOME) and cannot be downloaded ("
        )
    )
    assert result.stderr.strip().endswith(
        "download https://huggingface.co/timm/test_resnet.r160_in1k (model.safetensors) and give --pretrained=THAT_FILE"
    )


@pytest.mark.slow  # a fine-tuning run, then ONNX
def test_a_fine_tuned_timm_model_from_a_local_file_exports_to_onnx_checked_by_onnx_runtime(tmp_path):
    timm = pytest.importorskip("timm")
    torch.manual_seed(3)
    weights = tmp_path / "test_resnet_imagenet.pth"
    torch.save(timm.create_model("test_resnet").state_dict(), weights)  # 1000 classes
    result = run_in_this_process(
        "run",
        *RUN,
        "--model=timm:test_resnet",
        f"--pretrained={weights}",
        f"--output_path={tmp_path}",
        "--run_name=timm",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pretrained " in result.stderr and "layer fc replaced for the run's 10 classes" in result.stderr
    checkpoint = sorted((tmp_path / "timm").glob("best_model_*.pt"))[-1]
    exported = api.export(checkpoint, "onnx", tmp_path / "timm.onnx")
    assert exported.same_top1 == exported.num_images == 64 and exported.relative_difference <= 1e-3


@pytest.mark.slow
def test_two_gloo_processes_start_from_the_same_weights_and_freeze_alike(our_run, tmp_path):
    """Each spawned process loads the start itself; with the backbone frozen, it is still the start after epoch 1
    (the processes' BatchNorm statistics, broadcast by DDP from rank 0, included)."""
    from tests.conftest import SPAWN_2

    best = sorted(our_run.glob("best_model_*.pt"))[-1]
    result = run_in_this_process(
        "run",
        *RUN,
        *SPAWN_2,
        "--num_epochs=2",
        "--model=simple_cnn",
        '--model_kwargs={"width": 8}',
        f"--pretrained={best}",
        "--freeze_epochs=1",
        "--checkpoint_every=2",
        f"--output_path={tmp_path}",
        "--run_name=two",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    start = torch.load(best, weights_only=True)["model"]
    after_epoch_1 = torch.load(tmp_path / "two" / "training_checkpoint_2.pt", weights_only=True)["model"]
    head = pretrained.head_of(models.build_model("simple_cnn", {"width": 8}))[0] + "."
    after_epoch_1 = {name.removeprefix("module."): tensor for name, tensor in after_epoch_1.items()}
    assert all(torch.equal(after_epoch_1[name], start[name]) for name in start if not name.startswith(head))


def test_the_fine_tuning_keys_are_searchable_and_their_bounds_checked():
    from cifar10_dist.config import load_config
    from cifar10_dist.tuning.search_space import Dimension, check_space

    base = load_config(val_split=0.1, num_epochs=4)
    check_space(
        base,
        {
            "freeze_epochs": Dimension("freeze_epochs", "int", 0, 3),
            "backbone_lr_scale": Dimension("backbone_lr_scale", "float", 0.01, 1.0, log=True),
        },
    )
    with pytest.raises(
        UserError,
        match=r"^space: freeze_epochs=4 is outside what the config accepts: "
        r"freeze_epochs=4 must be less than num_epochs=4",
    ):
        check_space(base, {"freeze_epochs": Dimension("freeze_epochs", "int", 0, 4)})


@pytest.mark.parametrize(
    "prefix",
    ["module.", "_orig_mod.", "module._orig_mod.", "_orig_mod.module."],
    ids=["ddp", "compiled", "ddp-of-compiled", "compiled-ddp"],
)
def test_a_state_dict_saved_from_a_wrapped_model_loads_with_its_prefixes_stripped(our_run, tmp_path, prefix):
    """DDP's ``module.`` and torch.compile's ``_orig_mod.`` (in either order) in a plain state dict's names."""
    recorded = torch.load(sorted(our_run.glob("best_model_*.pt"))[-1], weights_only=True)["model"]
    path = tmp_path / "wrapped.pt"
    torch.save({f"{prefix}{name}": tensor for name, tensor in recorded.items()}, path)
    model = models.build_model("simple_cnn", {"width": 8}, 10)
    pretrained.load(model, pretrained.resolve("simple_cnn", str(path)), tuple(f"class{n}" for n in range(10)))
    state = model.state_dict()
    head = pretrained.head_of(model)[0] + "."
    assert all(torch.equal(state[name], tensor) for name, tensor in recorded.items() if not name.startswith(head))


def test_a_training_checkpoint_of_a_run_with_ema_starts_from_its_ema_weights(tmp_path):
    api.train(
        dataset="synthetic",
        synthetic_size=64,
        model="simple_cnn",
        model_kwargs={"width": 8},
        num_epochs=1,
        num_warmup_epochs=0,
        batch_size=32,
        num_workers=0,
        train_eval_size=0,
        output_path=str(tmp_path),
        run_name="ema",
        ema_decay=0.5,
    )
    checkpoint_path = sorted((tmp_path / "ema").glob("training_checkpoint_*.pt"))[-1]
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    model = models.build_model("simple_cnn", {"width": 8}, 10)
    weights = pretrained.resolve("simple_cnn", str(checkpoint_path))
    pretrained.load(model, weights, weights.classes)
    state = model.state_dict()
    ema = {name.removeprefix("module."): tensor for name, tensor in checkpoint["ema_model"].items()}
    trained = checkpoint["model"]
    weight = next(name for name in trained if name.endswith("weight"))
    assert not torch.equal(ema[weight], trained[weight])  # the two differ, so the check below means something
    assert all(torch.equal(state[name], ema[name]) for name in state)

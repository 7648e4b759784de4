"""Knowledge distillation: the loss against a hand computation, the teacher's classes and normalisation, a
resume at world size 2 that ends bit-exactly, the teacher in provenance, and a teacher's weights fetched before
the workers start (one line offline)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

from cifar10_dist import models
from cifar10_dist.outputs import checkpoint_files
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop.step import TrainStep
from cifar10_dist.training.trained_models.distillation import Distillation, Teacher
from tests.conftest import SPAWN_2, TINY, assert_same_nested, run_in_this_process
from tests.test_pretrained import RESNET18_FILE, torch_home  # noqa: F401  (a fixture)

SYNTHETIC = ["--dataset=synthetic", "--synthetic_size=320", *TINY]


def soft_target_loss_by_hand(student: torch.Tensor, teacher: torch.Tensor, t: float) -> float:
    """T^2 x the mean over images of sum_k p_k (log p_k - log q_k), p the teacher's and q the student's softmax at T."""
    total = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist()):
        p = [math.exp(v / t) for v in t_row]
        q = [math.exp(v / t) for v in s_row]
        p, q = [v / sum(p) for v in p], [v / sum(q) for v in q]
        total += sum(pk * (math.log(pk) - math.log(qk)) for pk, qk in zip(p, q))
    return t * t * total / len(student)


def test_the_distillation_loss_mixes_the_runs_loss_and_the_soft_targets_by_alpha():
    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(6, 10, generator=generator), torch.randn(6, 10, generator=generator)
    targets = torch.randint(0, 10, (6,), generator=generator)
    base = nn.CrossEntropyLoss()
    soft = soft_target_loss_by_hand(student, teacher, 4.0)
    assert float(Distillation(base, 1.0, 4.0)(student, targets, teacher)) == pytest.approx(soft, rel=1e-5)
    mixed = 0.7 * float(base(student, targets)) + 0.3 * soft
    assert float(Distillation(base, 0.3, 4.0)(student, targets, teacher)) == pytest.approx(mixed, rel=1e-5)
    assert float(Distillation(base, 1.0, 2.0)(student, targets, student)) == pytest.approx(0.0, abs=1e-6)


def test_with_alpha_1_and_the_students_start_as_teacher_one_step_trains_on_the_soft_target_loss():
    torch.manual_seed(0)
    student = models.build_model("simple_cnn", {"width": 8})
    teacher_model = copy.deepcopy(student).eval()
    normalisation = ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    teacher = Teacher(teacher_model, normalisation, normalisation, Precision("cpu", None), {})
    inputs, targets = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    with torch.no_grad():
        by_hand = soft_target_loss_by_hand(student.train()(inputs), teacher_model(inputs), 4.0)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    step = TrainStep(
        student, optimizer, Distillation(nn.CrossEntropyLoss(), 1.0, 4.0), Precision("cpu", None), teacher=teacher
    )
    assert float(step(inputs, targets).loss) == pytest.approx(by_hand, rel=1e-4)
    assert by_hand > 0  # the student trains its BatchNorm on the batch, the teacher uses its running statistics


def test_a_teacher_normalised_otherwise_sees_the_images_its_own_way():
    seen = []
    model = lambda images: seen.append(images) or images.mean(dim=(2, 3))  # noqa: E731
    teacher = Teacher(model, ((0.5,) * 3, (0.25,) * 3), ((0.4,) * 3, (0.2,) * 3), Precision("cpu", None), {})
    pixels = torch.rand(2, 3, 4, 4)
    teacher((pixels - 0.5) / 0.25)  # the student's view of the pixels
    assert torch.allclose(seen[0], (pixels - 0.4) / 0.2, atol=1e-6)  # the teacher's


@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory):
    output = tmp_path_factory.mktemp("teacher")
    result = run_in_this_process("run", *SYNTHETIC, f"--output_path={output}", "--run_name=teacher")
    assert result.returncode == 0, result.stderr[-2000:]
    return sorted((output / "teacher").glob("best_model_*.pt"))[-1]


def test_a_run_with_a_teacher_resumes_bit_exactly_at_world_size_2_and_records_it(teacher_file, tmp_path):
    common = [
        "run",
        *SYNTHETIC,
        *SPAWN_2,
        f"--teacher={teacher_file}",
        "--distill_alpha=0.7",
        "--checkpoint_every=5",
        f"--output_path={tmp_path}",
    ]
    whole = run_in_this_process(*common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    resumed = run_in_this_process(
        *common, "--run_name=resumed", f"--resume_from={tmp_path / 'whole' / 'training_checkpoint_15.pt'}"
    )  # mid-epoch 2
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ours = torch.load(tmp_path / "resumed" / "training_checkpoint_20.pt", weights_only=True)
    theirs = torch.load(tmp_path / "whole" / "training_checkpoint_20.pt", weights_only=True)
    assert_same_nested(ours["model"], theirs["model"], "model")
    recorded = json.loads((tmp_path / "whole" / "provenance.json").read_text())["teacher"]
    assert recorded["kind"] == "checkpoint" and recorded["model"] == "simple_cnn" and len(recorded["sha256"]) == 64
    assert recorded["alpha"] == 0.7 and recorded["temperature"] == 4.0
    plain = run_in_this_process(
        "run", *SYNTHETIC, *SPAWN_2, "--checkpoint_every=5", f"--output_path={tmp_path}", "--run_name=plain"
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    alone = torch.load(tmp_path / "plain" / "training_checkpoint_20.pt", weights_only=True)
    assert any(not torch.equal(alone["model"][key], theirs["model"][key]) for key in theirs["model"])  # it taught


def test_a_teacher_with_other_classes_is_refused_naming_both_lists(teacher_file, tmp_path):
    checkpoint = checkpoint_files.load_checkpoint(teacher_file)
    info = checkpoint["meta"]["provenance"]["dataset"]["info"]
    info["classes"] = ["cat", "dog"]
    other = tmp_path / "two_classes.pt"
    torch.save(checkpoint, other)
    result = run_in_this_process("run", *SYNTHETIC, f"--teacher={other}", f"--output_path={tmp_path}", "--run_name=r")
    assert result.returncode == 2
    assert (
        f"error: teacher '{other}' was trained on the classes cat, dog (2), this run has airplane, automobile, "
        "bird, cat, deer, dog, ... (10): a teacher must have the run's classes"
    ) in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_teacher_by_weights_name_is_fetched_before_the_workers_and_offline_is_one_line(torch_home, tmp_path):  # noqa: F811
    result = run_in_this_process(
        "run",
        *SYNTHETIC,
        "--teacher=resnet18",
        "--teacher_pretrained=IMAGENET1K_V1",
        f"--output_path={tmp_path}",
        "--run_name=offline",
    )
    cached = torch_home / "hub" / "checkpoints" / RESNET18_FILE
    assert result.returncode == 2
    assert f"{RESNET18_FILE} is not in torch's cache and cannot be downloaded" in result.stderr
    assert f"place it at {cached}" in result.stderr
    assert not (tmp_path / "offline").exists()


def test_a_missing_teacher_file_is_one_line(tmp_path):
    result = run_in_this_process("run", *SYNTHETIC, f"--teacher={tmp_path / 'nope.pt'}", f"--output_path={tmp_path}")
    assert result.returncode == 2
    assert f"teacher='{tmp_path / 'nope.pt'}' does not exist" in result.stderr


def test_a_calibrated_teacher_teaches_with_its_calibrated_logits(teacher_file, tmp_path):
    from cifar10_dist.config import load_config
    from cifar10_dist.models.viewing import TemperatureScaled
    from cifar10_dist.training.trained_models.distillation import build_teacher

    checkpoint = checkpoint_files.load_checkpoint(teacher_file)
    checkpoint["temperature"] = 2.0
    calibrated = tmp_path / "calibrated.pt"
    torch.save(checkpoint, calibrated)
    config = load_config(None, dataset="synthetic", teacher=str(calibrated))
    info = checkpoint["meta"]["provenance"]["dataset"]["info"]
    teacher = build_teacher(
        config,
        tuple(info["classes"]),
        (info["mean"], info["std"]),
        torch.device("cpu"),
        Precision("cpu", None),
        torch.contiguous_format,
    )
    assert isinstance(teacher.model, TemperatureScaled) and float(teacher.model.temperature) == 2.0

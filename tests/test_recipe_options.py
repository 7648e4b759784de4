"""The recipe options from torchvision's reference script, against the libraries' own definitions: MixUp and
CutMix (torchvision.transforms.v2), AdamW with weight decay apart for norms and biases, cosine and step
schedules (torch's schedulers, step by step), gradient clipping under fp16 + GradScaler and accumulation; then
all of them in one run of 2 gloo processes, resumed bit-exactly and evaluated alike at world sizes 1 and 2."""

from __future__ import annotations

import json
import re

import pytest
import torch
from ignite.engine import Engine, Events
from torch import nn

from cifar10_dist.config import load_config
from cifar10_dist.data import augmentation
from cifar10_dist.errors import UserError
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop.step import Accumulation, TrainStep, create_trainer
from cifar10_dist.training.setup import optimizers, schedules
from tests.conftest import TINY, run_in_this_process


def test_mixup_targets_are_convex_combinations_of_two_labels_matching_the_images():
    torch.manual_seed(0)
    images, labels = torch.rand(8, 3, 8, 8), torch.arange(8) % 4
    mixed, soft = augmentation.mixing(0.4, 0.0, 4)(images, labels)
    assert soft.shape == (8, 4) and torch.allclose(soft.sum(dim=1), torch.ones(8))
    lam = soft[0, labels[0]].item()  # image 0 mixes with image 7 (torchvision rolls the batch by one)
    assert 0 < lam < 1 and torch.allclose(mixed, lam * images + (1 - lam) * images.roll(1, 0), atol=1e-6)
    assert torch.allclose(soft[0, labels[7]], torch.tensor(1 - lam))


def test_cutmix_pastes_a_box_whose_area_is_the_weight_of_the_pasted_label():
    torch.manual_seed(1)
    images = torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1).expand(6, 3, 16, 16).clone()  # image i is all i
    labels = torch.arange(6)
    mixed, soft = augmentation.mixing(0.0, 1.0, 6)(images, labels)
    pasted = (mixed[0] != images[0]).float().mean().item()  # the box comes from image 5 (the roll)
    assert 0 < pasted < 1 and soft[0, 5].item() == pytest.approx(pasted, abs=1e-6)
    assert soft[0, 0].item() == pytest.approx(1 - pasted, abs=1e-6) and torch.allclose(soft.sum(1), torch.ones(6))


def test_brightness_and_contrast_are_drawn_per_image_within_the_amount_from_the_generator():
    """Each image becomes (x + b) * c with its own b in -0.15..0.15 and c in 0.85..1.15; the same generator state
    gives the same images (the basis of exact resume), and 0 leaves the batch as it is."""
    from cifar10_dist.data import augmentation

    images = torch.randn(64, 3, 4, 4)
    jittered = augmentation.brightness_contrast(images.clone(), 0.15, torch.Generator().manual_seed(3))
    again = augmentation.brightness_contrast(images.clone(), 0.15, torch.Generator().manual_seed(3))
    assert torch.equal(jittered, again)
    # two pixels of an image give its c (the difference scales by c) and then its b
    scale = (jittered[:, 0, 0, 0] - jittered[:, 0, 0, 1]) / (images[:, 0, 0, 0] - images[:, 0, 0, 1])
    shift = jittered[:, 0, 0, 0] / scale - images[:, 0, 0, 0]
    assert torch.allclose(jittered, (images + shift.view(-1, 1, 1, 1)) * scale.view(-1, 1, 1, 1), atol=1e-5)
    assert scale.min() >= 0.85 - 1e-5 and scale.max() <= 1.15 + 1e-5 and scale.std() > 0.05
    assert shift.abs().max() <= 0.15 + 1e-4 and shift.std() > 0.05
    same = images.clone()
    assert augmentation.brightness_contrast(same, 0.0, torch.Generator()) is same and torch.equal(same, images)


def test_adamw_with_norm_and_bias_decay_off_leaves_them_undecayed():
    config = load_config(
        None,
        model="simple_cnn",
        optimizer="adamw",
        learning_rate=0.1,
        weight_decay=0.5,
        norm_weight_decay=0.0,
        bias_weight_decay=0.0,
    )
    torch.manual_seed(0)
    from cifar10_dist import models

    model = models.build_model("simple_cnn")
    optimizer, schedules = optimizers.build_optimizer(model, config, total_iterations=10)
    assert isinstance(optimizer, torch.optim.AdamW) and len(schedules) == len(optimizer.param_groups) == 2
    exempt = {
        id(p)
        for m in model.modules()
        for name, p in m.named_parameters(recurse=False)
        if name == "bias" or isinstance(m, nn.BatchNorm2d)
    }
    before = {id(p): p.detach().clone() for p in model.parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # only the decay moves anything
    optimizer.step()
    for p in model.parameters():
        if id(p) in exempt:
            assert torch.equal(p, before[id(p)])
        else:
            assert torch.allclose(p, before[id(p)] * (1 - 0.1 * 0.5))  # AdamW's decoupled decay


def lrs_over(scheduler_of, iterations: int) -> list[float]:
    """The lr an Ignite trainer sees at each iteration with the scheduler attached as our runs attach it."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    seen = []
    trainer = Engine(lambda engine, batch: seen.append(optimizer.param_groups[0]["lr"]))
    trainer.add_event_handler(Events.ITERATION_STARTED, scheduler_of(optimizer))
    trainer.run(range(iterations), max_epochs=1)
    return seen


def torch_lrs(make, steps: int, lr: float) -> list[float]:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler, values = make(optimizer), []
    for _ in range(steps):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


@pytest.mark.parametrize("warmup", [0, 5])
def test_cosine_and_step_schedules_match_torchs_own_schedulers_step_by_step(warmup):
    total, lr = 40, 0.8
    cosine = lrs_over(
        lambda o: schedules.create_lr_scheduler(o, lr, warmup, total, end=0.05, shape=schedules.Shape("cosine")), total
    )
    expected = torch_lrs(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=total - warmup, eta_min=0.04), total - warmup, lr
    )
    assert cosine[warmup:] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    step = lrs_over(
        lambda o: schedules.create_lr_scheduler(
            o, lr, warmup, total, shape=schedules.Shape("step", drops=(10, 20), gamma=0.2)
        ),
        total,
    )
    expected = torch_lrs(
        lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[10, 20], gamma=0.2), total - warmup, lr
    )
    assert step[warmup:] == pytest.approx(expected, rel=1e-12)
    if warmup:
        assert step[:warmup] == pytest.approx([lr * i / warmup for i in range(warmup)])


def test_the_schedule_registry_and_the_configs_lr_schedule_choices_are_the_same_names():
    """A schedule is one registered function (training.setup.schedules.SHAPES) and its name among the config's
    choices; a name in one list only would be refused by the config or fail in the middle of a run."""
    from cifar10_dist.config import choices

    assert sorted(schedules.SHAPES) == sorted(choices("lr_schedule"))
    linear = lrs_over(lambda o: schedules.create_lr_scheduler(o, 0.8, 4, 12, end=0.25), 12)
    assert linear == pytest.approx([0.8 * i / 4 for i in range(4)] + [0.8 - 0.6 * i / 8 for i in range(8)])


@pytest.mark.parametrize("accumulate", [1, 2])
def test_clipping_under_fp16_grad_scaler_bounds_the_unscaled_accumulated_gradient(accumulate):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step, norms = optimizer.step, []

    def recording_step(*args, **kwargs):
        norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item())
        return step(*args, **kwargs)

    optimizer.step = recording_step
    train_step = TrainStep(
        model,
        optimizer,
        nn.CrossEntropyLoss(),
        Precision("cpu", torch.float16),
        Accumulation(accumulate),
        clip_grad_norm=0.01,
    )
    train_step.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    trainer = create_trainer(train_step, lambda batch, iteration: batch)
    data = [(10 * torch.randn(8, 3, 4, 4), torch.randint(0, 3, (8,))) for _ in range(4)]
    trainer.run(data, max_epochs=1)
    assert len(norms) == 4 // accumulate and all(norm <= 0.01 * (1 + 1e-3) for norm in norms)
    assert trainer.state.output.grad_norm.item() > 0.01  # the pre-clip norm, unscaled: far above the bound


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"optimizer": "adam"}, "optimizer='adam' is unknown: did you mean 'adamw'? choose one of sgd, adamw"),
        ({"optimizer": "adamw", "muon_lr": 0.1}, "muon_lr=0.1 with optimizer=adamw"),
        ({"lr_schedule": "step"}, "lr_schedule=step needs lr_milestones"),
        ({"lr_schedule": "step", "lr_milestones": "3,2", "num_epochs": 5}, "lr_milestones=3,2 must increase"),
        ({"lr_schedule": "exp"}, "lr_schedule='exp' is unknown: choose one of linear, cosine, step"),
        ({"auto_augment": "randaugment", "auto_augment_magnitude": 31}, "out of range for randaugment: 0..30"),
        ({"auto_augment_magnitude": 5}, "auto_augment_magnitude=5 is for randaugment or trivialaugment"),
        ({"mixup_alpha": -0.2}, "mixup_alpha=-0.2 must be 0 (off) or more"),
        ({"random_erasing": 1.5}, "random_erasing=1.5 must be a probability in 0..1"),
        ({"color_jitter": 1.5}, "color_jitter=1.5 must be in [0, 1)"),
        ({"clip_grad_norm": 0}, "clip_grad_norm=0.0 must be greater than 0"),
        (
            {"sync_bn": True, "backend": "gloo"},
            "sync_bn=True with backend=gloo: torch's SyncBatchNorm computes on GPUs",
        ),
    ],
)
def test_bad_recipe_options_are_one_line_naming_the_value(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        load_config(None, **overrides)


MODERN = [
    "--optimizer=adamw",
    "--learning_rate=0.003",
    "--weight_decay=0.05",
    "--norm_weight_decay=0",
    "--lr_schedule=cosine",
    "--auto_augment=trivialaugment",
    "--random_erasing=0.25",
    "--mixup_alpha=0.2",
    "--cutmix_alpha=1.0",
    "--clip_grad_norm=1.0",
    "--label_smoothing=0.1",
    "--log_every_iters=2",
    "--color_jitter=0.15",
]


@pytest.mark.slow
def test_every_option_together_with_two_processes_resumes_exactly_and_evaluates_alike(small_dataset, tmp_path):
    common = [
        "run",
        *TINY,
        *MODERN,
        "--num_epochs=3",
        "--backend=gloo",
        "--nproc_per_node=2",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--checkpoint_every=40",
        "--sampler=balanced",
        "--best_metric=balanced_accuracy",
    ]
    whole = run_in_this_process(*common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    middle = tmp_path / "whole" / "training_checkpoint_40.pt"  # inside epoch 3 (iterations 37-54)
    resumed = run_in_this_process(*common, "--run_name=resumed", f"--resume_from={middle}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ends = [
        torch.load(tmp_path / name / "training_checkpoint_54.pt", weights_only=True) for name in ("whole", "resumed")
    ]
    assert all(torch.equal(ends[0]["model"][key], ends[1]["model"][key]) for key in ends[0]["model"])
    assert ends[0]["optimizer"]["param_groups"][0]["lr"] == ends[1]["optimizer"]["param_groups"][0]["lr"]
    events = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("epoch") == 3
    checkpoint = tmp_path / "whole" / "training_checkpoint_54.pt"
    results = [
        json.loads(
            run_in_this_process("evaluate", f"--checkpoint={checkpoint}", "--json", "--num_workers=0", *launch)
            .stdout.strip()
            .splitlines()[-1]
        )
        for launch in ([], ["--backend=gloo", "--nproc_per_node=2"])
    ]
    assert results[0]["confusion_matrix"] == results[1]["confusion_matrix"]
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-6)

"""Knowledge distillation (``teacher``, Hinton et al. 2015): a trained teacher, in eval mode and without gradients,
sees every training batch the student sees (the same augmented images, MixUp and CutMix included, under the run's
precision, on every process), and the student's loss becomes

    (1 - distill_alpha) x the run's own loss + distill_alpha x T^2 x KL(softmax(teacher / T) || softmax(student / T))

with T = ``distill_temperature``. The teacher is one of our checkpoints or best-model files (its model rebuilt, its
EMA weights when it has them, its logits divided by its own temperature when it was calibrated), or a model name with
``teacher_pretrained`` weights (torchvision, timm, a file) whose classes are known; it must have the run's classes,
and it sees the images with its own normalisation (the student's batch is un-normalised and normalised again for it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from cifar10_dist import checkpoint_layout, models
from cifar10_dist.config import Config
from cifar10_dist.data import cifar
from cifar10_dist.errors import UserError
from cifar10_dist.models import pretrained, restoring
from cifar10_dist.outputs import checkpoint_files
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.system import ranks
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.trained_models import temperature

logger = logging.getLogger("cifar10_dist")


class Distillation(nn.Module):
    """The student's loss with a teacher: (1 - alpha) x ``base`` + alpha x T^2 x KL(teacher's || student's
    softened distribution), the KL averaged over the batch (``batchmean``, its mathematical definition)."""

    def __init__(self, base: nn.Module, alpha: float, temperature: float) -> None:
        super().__init__()
        self.base, self.alpha, self.temperature = base, alpha, temperature

    def forward(self, student: torch.Tensor, targets: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        t = self.temperature
        soft = (
            nn.functional.kl_div(
                nn.functional.log_softmax(student.float() / t, dim=1),
                nn.functional.log_softmax(teacher.float() / t, dim=1),
                reduction="batchmean",
                log_target=True,
            )
            * t
            * t
        )
        if self.alpha == 1:
            return soft
        return (1 - self.alpha) * self.base(student, targets) + self.alpha * soft


@dataclass
class Teacher:
    """The teacher in eval mode on the run's device: called on the student's normalised batch, it returns its
    logits (no gradients, the run's precision), having re-normalised the images its own way."""

    model: nn.Module
    student_normalisation: tuple[Sequence[float], Sequence[float]]
    own_normalisation: tuple[Sequence[float], Sequence[float]]
    precision: Precision
    record: dict[str, Any]

    def __post_init__(self) -> None:
        (s_mean, s_std), (t_mean, t_std) = self.student_normalisation, self.own_normalisation
        as_column = lambda values: torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1)  # noqa: E731
        self.scale = as_column(s_std) / as_column(t_std)
        self.shift = (as_column(s_mean) - as_column(t_mean)) / as_column(t_std)
        self.same = tuple(s_mean) == tuple(t_mean) and tuple(s_std) == tuple(t_std)

    @torch.no_grad()
    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.same:  # x_teacher = (x_student * std_s + mean_s - mean_t) / std_t
            inputs = inputs * self.scale.to(inputs.device) + self.shift.to(inputs.device)
        with self.precision.autocast():
            return self.model(inputs)


def _other_classes(what: str, theirs: Sequence[str], ours: Sequence[str]) -> UserError:
    def listed(names: Sequence[str]) -> str:
        return ", ".join(names[:6]) + (f", ... ({len(names)})" if len(names) > 6 else f" ({len(names)})")

    return UserError(
        f"teacher {what} was trained on the classes {listed(theirs)}, this run has {listed(ours)}: a "
        "teacher must have the run's classes (fine-tune it on this data first)"
    )


def build_teacher(
    config: Config,
    classes: tuple[str, ...],
    normalisation: tuple[Sequence[float], Sequence[float]],
    device: torch.device,
    precision: Precision,
    layout: torch.memory_format,
) -> Teacher | None:
    """The run's teacher on ``device``, or None without one; refused in one line when its classes differ."""
    if config.teacher is None:
        return None
    path = Path(config.teacher).expanduser()
    if config.teacher_pretrained is None:
        checkpoint = checkpoint_files.load_checkpoint(path)
        info = cifar.checkpoint_info(checkpoint)
        if tuple(info.classes) != tuple(classes):
            raise _other_classes(f"'{config.teacher}'", info.classes, classes)
        model = temperature.with_temperature(restoring.restore_model(checkpoint, path, len(info.classes)), checkpoint)
        own = (info.mean, info.std)
        described = pretrained.Weights("file", str(path.resolve()), str(path.resolve()))
        recorded = checkpoint_layout.recorded_config(checkpoint)
        record = {
            "kind": "checkpoint",
            "model": recorded.model if recorded is not None else None,
            **{key: value for key, value in ranks.from_rank_zero(described.describe).items() if key != "kind"},
        }
    else:
        weights = pretrained.resolve(config.teacher, config.teacher_pretrained)
        if not weights.classes:
            raise UserError(
                f"teacher={config.teacher} with teacher_pretrained={config.teacher_pretrained}: these "
                "weights do not say which classes their head predicts, so they cannot be checked against "
                "the run's; give one of our checkpoints or best-model files as the teacher instead"
            )
        if tuple(weights.classes) != tuple(classes):
            raise _other_classes(weights.name, weights.classes, classes)
        model = models.build_model(config.teacher, None, len(classes))
        pretrained.load(model, weights, classes)
        own = weights.normalisation or normalisation  # type: ignore[assignment]
        record = {"model": config.teacher, **ranks.from_rank_zero(weights.describe)}  # the file hashed once
    model = model.to(device).to(memory_format=layout).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    ranks.on_rank_zero(
        logger.info,
        "teacher %s (%s): %.2fM parameters, distill_alpha %g, distill_temperature %g",
        record.get("model"),
        record["kind"],
        models.count_parameters(model) / 1e6,
        config.distill_alpha,
        config.distill_temperature,
    )
    return Teacher(
        model,
        normalisation,
        own,
        precision,
        {**record, "alpha": config.distill_alpha, "temperature": config.distill_temperature},
    )


def setup_teacher(
    config: Config, info: Any, device: torch.device, precision: Precision, record: Provenance
) -> Teacher | None:
    """The run's teacher (``build_teacher`` for the data's classes and normalisation, in the run's memory format),
    recorded in the run's provenance (``record``) as ``teacher``."""
    from cifar10_dist.data import batches

    teacher = build_teacher(
        config,
        tuple(info.classes),
        (info.mean, info.std),
        device,
        precision,
        batches.memory_format(config.channels_last),
    )
    if teacher is not None:
        record.teacher = teacher.record
    return teacher


def distilled(base: nn.Module, config: Config) -> Distillation:
    return Distillation(base, config.distill_alpha, config.distill_temperature)

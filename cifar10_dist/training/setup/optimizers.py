"""The optimizer a config asks for: SGD or AdamW over parameter groups (weight decay per group: normalisation
layers and biases may have their own, as in torchvision's reference script), or SGD with ``torch.optim.Muon`` for
the convolution filters (Keller Jordan's airbench94_muon record). Either way it is one ``torch.optim.Optimizer``,
so the trainer, the LR schedule, GradScaler, ``idist.auto_optim`` and checkpoints treat all alike."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cifar10_dist import models, recipes
from cifar10_dist.config import Config
from cifar10_dist.errors import UserError
from cifar10_dist.models.pretrained import head_of
from cifar10_dist.training.setup import schedules


@dataclass(frozen=True)
class ParamGroup:
    """One optimizer param group and how the LR schedule treats it."""

    params: list[nn.Parameter]
    lr: float
    weight_decay: float
    schedule: schedules.GroupSchedule = schedules.GroupSchedule()

    def for_optimizer(self) -> dict[str, Any]:
        return {"params": self.params, "lr": self.lr, "weight_decay": self.weight_decay}


def parameter_groups(
    model: nn.Module, config: Config, total_iterations: int, leave_out: frozenset[int] = frozenset()
) -> list[ParamGroup]:
    """One group, or: normalisation biases (lr x bias_lr_scale, weight decay / bias_lr_scale), the groups the
    model's recipe trains apart (``recipes.parts_of``: their lr scale and schedule), and everything else; parameters
    whose id is in ``leave_out`` are in none of them (another optimizer trains them)."""
    network = models.unwrap(model)
    norm_types = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
    norm_biases = {id(m.bias) for m in network.modules() if isinstance(m, norm_types) and m.bias is not None}
    apart = recipes.parts_of(network).groups_apart(config, total_iterations)
    set_apart = {id(p) for group in apart for p in group.params}
    lr, decay, scale = float(config.learning_rate), config.weight_decay, config.bias_lr_scale  # (find: settled)
    trained = [p for p in model.parameters() if p.requires_grad and id(p) not in leave_out]
    if scale == 1.0 and not set_apart:
        return [ParamGroup(trained, lr, decay)]
    groups = [
        ParamGroup([p for p in trained if id(p) not in norm_biases | set_apart], lr, decay),
        ParamGroup(
            [p for p in trained if id(p) in norm_biases],
            lr * scale,
            decay / scale,
            schedules.GroupSchedule(lr_scale=scale),
        ),
        *(
            ParamGroup(
                [p for p in trained if id(p) in {id(q) for q in group.params}],
                lr * group.lr_scale,
                decay / group.lr_scale,
                schedules.GroupSchedule(group.lr_scale, group.train_until, group.decay_to_zero),
            )
            for group in apart
        ),
    ]
    return [group for group in groups if group.params]


NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)


def decay_overrides(model: nn.Module, config: Config) -> dict[int, float]:
    """id(parameter) -> its weight decay where the config sets one apart: every bias (``bias_weight_decay``)
    and the parameters of normalisation layers (``norm_weight_decay``), as torchvision's ``set_weight_decay``
    decides: a bias takes bias_weight_decay when given, before norm_weight_decay."""
    overrides: dict[int, float] = {}
    for module in models.unwrap(model).modules():
        for name, parameter in module.named_parameters(recurse=False):
            if config.bias_weight_decay is not None and name == "bias":
                overrides[id(parameter)] = config.bias_weight_decay
            elif config.norm_weight_decay is not None and isinstance(module, NORM_TYPES):
                overrides[id(parameter)] = config.norm_weight_decay
    return overrides


def with_decay_overrides(groups: list[ParamGroup], overrides: dict[int, float]) -> list[ParamGroup]:
    """Each group split by weight decay: its parameters with an override in a group of their own (same lr and
    schedule)."""
    if not overrides:
        return groups
    split: list[ParamGroup] = []
    for group in groups:
        decays = sorted({overrides.get(id(p), group.weight_decay) for p in group.params})
        split.extend(
            ParamGroup(
                [p for p in group.params if overrides.get(id(p), group.weight_decay) == decay],
                group.lr,
                decay,
                group.schedule,
            )
            for decay in decays
        )
    return split


def head_parameters(model: nn.Module, config: Config) -> set[int]:
    """ids of the head's parameters (the model's last Linear: the classifier a fine-tuning run trains first)."""
    name, head = head_of(models.unwrap(model))
    if head is None:
        raise UserError(
            f"freeze_epochs={config.freeze_epochs} and backbone_lr_scale={config.backbone_lr_scale} need a "
            f"head, the model's last nn.Linear: model={config.model} has none"
        )
    return {id(parameter) for parameter in head.parameters()}


def frozen_iterations(config: Config, total_iterations: int) -> int:
    """The iterations of the first ``freeze_epochs``, in which only the head trains."""
    return total_iterations * config.freeze_epochs // config.num_epochs


def with_backbone_schedule(
    groups: list[ParamGroup], head: set[int], config: Config, total_iterations: int
) -> list[ParamGroup]:
    """Each group split into its head and backbone parameters: the backbone's lr times ``backbone_lr_scale``,
    and 0 for its first ``freeze_epochs`` (the head trains alone); the head's as the group's."""
    if config.freeze_epochs == 0 and config.backbone_lr_scale == 1.0:
        return groups
    scale, train_from = config.backbone_lr_scale, frozen_iterations(config, total_iterations)
    split = []
    for group in groups:
        split.append(
            ParamGroup([p for p in group.params if id(p) in head], group.lr, group.weight_decay, group.schedule)
        )
        split.append(
            ParamGroup(
                [p for p in group.params if id(p) not in head],
                group.lr * scale,
                group.weight_decay,
                dataclasses.replace(group.schedule, lr_scale=group.schedule.lr_scale * scale, train_from=train_from),
            )
        )
    return [group for group in split if group.params]


def build_optimizer(
    model: nn.Module, config: Config, total_iterations: int
) -> tuple[torch.optim.Optimizer, list[schedules.GroupSchedule]]:
    """SGD (Nesterov when asked), or with ``muon_lr`` SGD for everything but the convolution filters and Muon for
    those; with the schedule of each param group in the optimizer's order."""
    fused = {"fused": True} if config.fused_optimizer is True else {}  # (auto is settled per device: fused_on)
    learning_rate = float(config.learning_rate)  # (find: settled before an optimizer is built)
    sgd_options: dict[str, Any] = dict(
        lr=learning_rate,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        nesterov=config.nesterov and config.momentum > 0,
        **fused,
    )
    fine_tuning = config.freeze_epochs > 0 or config.backbone_lr_scale != 1.0
    head = head_parameters(model, config) if fine_tuning else set()
    if config.muon_lr is None:
        groups = with_decay_overrides(parameter_groups(model, config, total_iterations), decay_overrides(model, config))
        groups = with_backbone_schedule(groups, head, config, total_iterations)
        if config.optimizer == "adamw":
            adamw = torch.optim.AdamW(
                [g.for_optimizer() for g in groups],
                lr=learning_rate,
                betas=(config.adam_beta1, config.adam_beta2),
                eps=config.adam_eps,
                weight_decay=config.weight_decay,
                **fused,
            )
            return adamw, [g.schedule for g in groups]
        return torch.optim.SGD([g.for_optimizer() for g in groups], **sgd_options), [g.schedule for g in groups]
    filters = convolution_filters(model)
    if not filters:
        raise UserError(
            f"muon_lr={config.muon_lr}: model={config.model} has no trainable convolution filters for "
            "Muon to train; leave muon_lr unset"
        )
    grouped = parameter_groups(model, config, total_iterations, leave_out=frozenset(map(id, filters)))
    groups = with_decay_overrides(grouped, decay_overrides(model, config))
    groups = with_backbone_schedule(groups, head, config, total_iterations)
    sgd = torch.optim.SGD([g.for_optimizer() for g in groups], **sgd_options)
    optimizer = SGDWithMuon(sgd, filters, config.muon_lr, config.muon_momentum, config.muon_ns_steps)
    muon_schedule = schedules.GroupSchedule(lr_scale=config.muon_lr / learning_rate)  # filters: backbone
    if fine_tuning:
        muon_schedule = dataclasses.replace(
            muon_schedule,
            lr_scale=muon_schedule.lr_scale * config.backbone_lr_scale,
            train_from=frozen_iterations(config, total_iterations),
        )
    return optimizer, [*(g.schedule for g in groups), muon_schedule]


def fused_on(setting: bool | str, device: torch.device) -> bool:
    """``fused_optimizer``: as given; auto: on a CUDA GPU, where one fused kernel per param group replaces a few
    foreach launches each, and fp16's GradScaler passes its overflow flag to the kernel instead of reading it on
    the host at every step. Elsewhere torch's foreach kernels stay (fused SGD on a CPU rounds differently, and
    the CPU's results stay what they were)."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def convolution_filters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable 4D parameters (convolution filters), in the model's order."""
    return [p for p in model.parameters() if p.requires_grad and p.ndim == 4]


def check_muon_available(muon_lr: float | None) -> None:
    """A one-line error where the config asks for Muon and this torch has none (torch.optim.Muon: torch 2.9+)."""
    if muon_lr is not None and not hasattr(torch.optim, "Muon"):
        raise UserError(
            f"muon_lr={muon_lr} needs torch.optim.Muon (torch 2.9 or newer), and this torch is "
            f"{torch.__version__}: upgrade torch (pip install 'torch>=2.9') or leave muon_lr unset"
        )


def as_matrix(filters: torch.Tensor) -> torch.Tensor:
    """A 4D filter tensor as the (out, in*kh*kw) matrix Muon orthogonalises, its columns in the tensor's memory
    order (channels_last: kh, kw, in), so for a parameter it is a view of the same memory. Orthogonalisation
    commutes with a permutation of the columns, so the order does not change Muon's update."""
    if _layout(filters) == torch.channels_last:
        return filters.permute(0, 2, 3, 1).reshape(len(filters), -1)
    return filters.reshape(len(filters), -1)


def _layout(tensor: torch.Tensor) -> torch.memory_format:
    """channels_last for a tensor stored that way, else contiguous_format."""
    channels_last = tensor.is_contiguous(memory_format=torch.channels_last) and not tensor.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format


class SGDWithMuon(torch.optim.Optimizer):
    """SGD for its param groups and ``torch.optim.Muon`` (Nesterov, no weight decay) for the convolution filters,
    which Muon sees as matrices sharing the filters' memory (torch's Muon takes 2D parameters only). As in
    airbench94_muon, each filter tensor is rescaled to norm sqrt(out_channels) before its step (the BatchNorm
    after it makes the scale irrelevant to the function; it keeps Muon's fixed-size steps in proportion).

    ``param_groups`` are SGD's groups followed by one group of the 4D filters: LR schedulers set their lr,
    GradScaler unscales their gradients and ``zero_grad`` clears them, as for any optimizer."""

    def __init__(
        self, sgd: torch.optim.SGD, filters: list[nn.Parameter], lr: float, momentum: float, ns_steps: int
    ) -> None:
        self.sgd = sgd
        self.matrices = [as_matrix(f.detach()) for f in filters]
        for matrix, tensor in zip(self.matrices, filters):
            if matrix.data_ptr() != tensor.data_ptr() or not matrix.is_contiguous():
                raise ValueError(f"a filter of shape {tuple(tensor.shape)} cannot be viewed as a matrix in place")
        self.muon = torch.optim.Muon(
            self.matrices, lr=lr, momentum=momentum, nesterov=True, weight_decay=0.0, ns_steps=ns_steps
        )
        filter_group = {"params": filters, "lr": lr, "momentum": momentum, "weight_decay": 0.0}
        super().__init__([*sgd.param_groups, filter_group], defaults={"lr": lr})
        self.param_groups[: len(sgd.param_groups)] = sgd.param_groups  # the same dicts: one lr for both views

    @property
    def filter_group(self) -> dict[str, Any]:
        return self.param_groups[-1]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # (no closure: refused below)
        if closure is not None:
            raise ValueError("SGDWithMuon.step takes no closure")
        self.muon.param_groups[0]["lr"] = self.filter_group["lr"]
        for tensor, matrix in zip(self.filter_group["params"], self.matrices):
            if tensor.grad is None:
                continue
            matrix.grad = as_matrix(tensor.grad.contiguous(memory_format=_layout(tensor)))  # columns as matrix's
            tensor.mul_(math.sqrt(len(tensor)) / tensor.norm())
        self.sgd.step()
        self.muon.step()
        for matrix in self.matrices:
            matrix.grad = None

    def state_dict(self) -> dict[str, Any]:
        """Both optimizers' states, the filters' lr, and the group sizes (which checkpointing compares)."""
        sizes = [{"params": list(range(len(group["params"])))} for group in self.param_groups]
        return {
            "sgd": self.sgd.state_dict(),
            "muon": self.muon.state_dict(),
            "filter_lr": self.filter_group["lr"],
            "param_groups": sizes,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not {"sgd", "muon", "filter_lr"} <= set(state_dict):
            raise ValueError("not a state of SGD with Muon: it was saved with another optimizer")
        self.sgd.load_state_dict(state_dict["sgd"])
        self.muon.load_state_dict(state_dict["muon"])
        self.param_groups[:-1] = self.sgd.param_groups  # loading made new group dicts: share them again
        self.filter_group["lr"] = state_dict["filter_lr"]

"""Gradient compression for slow links (``grad_compression``): one of torch's DDP communication hooks registered on
the run's DDP model, fp16 or bf16 compression (the buckets all-reduced at half their bytes) or PowerSGD (a low-rank
approximation of each gradient matrix, with error feedback and a warm start, uncompressed for its first
``powersgd_start_step`` steps). ``GradientCompression`` is also what a checkpoint keeps of it: PowerSGD's step count,
its Q matrices and every rank's error feedback (gathered, since each rank's is its own), so a resume is exact at the
same world size. With ``none`` nothing is registered: the run is what it was without this module."""

from __future__ import annotations

import logging
from typing import Any, Callable

import ignite.distributed as idist
import numpy as np
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from cifar10_dist.config import Config
from cifar10_dist.system import ranks

logger = logging.getLogger("cifar10_dist")

HALF_HOOKS: dict[str, Callable[..., Any]] = {
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


class GradientCompression:
    """The hook's state as a checkpoint holds it (``state_dict``: plain tensors and numbers, for
    ``torch.load(weights_only=True)``); fp16 and bf16 keep none."""

    def __init__(self, kind: str, state: powerSGD_hook.PowerSGDState | None) -> None:
        self.kind, self.state = kind, state

    def state_dict(self) -> dict[str, Any]:
        """PowerSGD's: its step, its P and Q matrices (the same on every rank) and each rank's error feedback, gathered
        (every rank calls this when a checkpoint is taken: Ignite's Checkpoint builds it on all of them)."""
        if self.state is None:
            return {"kind": self.kind}
        errors = {bucket: gathered(error) for bucket, error in sorted(self.state.error_dict.items())}
        generator: Any = self.state.rng.get_state()
        return {
            "kind": self.kind,
            "iter": int(self.state.iter),
            "errors": errors,
            "p": {bucket: p.cpu() for bucket, p in self.state.p_memory_dict.items()},
            "q": {bucket: q.cpu() for bucket, q in self.state.q_memory_dict.items()},
            "rng": {
                "keys": torch.from_numpy(generator[1].astype(np.int64)),
                "position": int(generator[2]),
                "has_gauss": int(generator[3]),
                "cached_gaussian": float(generator[4]),
            },
        }

    @property
    def continued(self) -> bool:
        """PowerSGD's state came from a checkpoint (its step past 0) in a process whose DDP has not yet laid out its
        buckets as they are after a first step (their order keys the error feedback and the Q matrices): one step,
        undone, must come first (``warm_up``)."""
        return self.state is not None and self.state.iter > 0

    def reset(self) -> None:
        """A state as at the start (for steps that are undone: the warm-up's): nothing compressed yet."""
        if self.state is not None:
            self.state.iter, self.state.error_dict, self.state.q_memory_dict, self.state.p_memory_dict = 0, {}, {}, {}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if self.state is None or saved.get("kind") != "powersgd":
            return
        device = idist.device()
        self.state.iter = saved["iter"]
        self.state.p_memory_dict = {bucket: p.to(device) for bucket, p in saved["p"].items()}  # (its keys: warm)
        self.state.q_memory_dict = {bucket: q.to(device) for bucket, q in saved["q"].items()}
        rng = saved["rng"]
        self.state.rng.set_state(
            (
                "MT19937",
                rng["keys"].numpy().astype(np.uint32),
                rng["position"],
                rng["has_gauss"],
                rng["cached_gaussian"],
            )
        )
        errors, rank = saved["errors"], idist.get_rank()
        if errors and next(iter(errors.values())).shape[0] != idist.get_world_size():
            ranks.on_rank_zero(
                logger.warning,
                "powersgd: the checkpoint's error feedback is of %d processes and this run has %d: it starts afresh",
                next(iter(errors.values())).shape[0],
                idist.get_world_size(),
            )
            self.state.error_dict = {}
            return
        self.state.error_dict = {bucket: stacked[rank].to(device) for bucket, stacked in errors.items()}


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor``, stacked by rank, on the CPU."""
    if idist.get_world_size() == 1:
        return tensor.unsqueeze(0).cpu()
    found = idist.all_gather(tensor.unsqueeze(0))
    assert isinstance(found, torch.Tensor)
    return found.cpu()


def attach(model: nn.Module, config: Config, process_group: Any = None) -> GradientCompression | None:
    """The hook ``grad_compression`` names, registered on the DDP model (None for none, and where the model is not
    wrapped in DDP: one process, said once); ``process_group``: the DDP's, where it is not the default one."""
    if config.grad_compression == "none":
        return None
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        ranks.on_rank_zero(
            logger.warning,
            "grad_compression=%s does nothing at world size %d: there is no exchange of gradients to compress",
            config.grad_compression,
            idist.get_world_size(),
        )
        return None
    if config.grad_compression in HALF_HOOKS:
        model.register_comm_hook(process_group, HALF_HOOKS[config.grad_compression])
        state = None
    else:
        state = powerSGD_hook.PowerSGDState(
            process_group,
            matrix_approximation_rank=config.powersgd_rank,
            start_powerSGD_iter=config.powersgd_start_step,
            use_error_feedback=True,
            warm_start=True,
            random_seed=config.seed,
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    ranks.on_rank_zero(
        logger.info,
        "grad_compression: %s%s on the gradients exchanged between %d processes",
        config.grad_compression,
        f" rank {config.powersgd_rank} (uncompressed for the first {config.powersgd_start_step} steps)"
        if state is not None
        else "",
        idist.get_world_size(),
    )
    return GradientCompression(config.grad_compression, state)


def described(attached: GradientCompression | None, config: Config) -> str:
    """What the run compresses, for its plan and provenance: 'none', 'bf16', 'powersgd rank 2 from step 10', or
    what was asked and why it does nothing."""
    if attached is None:
        return "none" if config.grad_compression == "none" else f"none ({config.grad_compression} asked: world size 1)"
    if attached.kind == "powersgd":
        return f"powersgd rank {config.powersgd_rank} from step {config.powersgd_start_step}"
    return attached.kind

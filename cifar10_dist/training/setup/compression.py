"""Gradient compression for slow links (``grad_compression``): one of torch's DDP communication hooks registered on
the run's DDP model, fp16 or bf16 compression (the buckets all-reduced at half their bytes) or PowerSGD (a low-rank
approximation of each gradient matrix, with error feedback and a warm start, uncompressed for its first
``powersgd_start_step`` steps). ``GradientCompression`` is also what a checkpoint keeps of it: PowerSGD's step count,
its Q matrices and every rank's error feedback (gathered, since each rank's is its own), so a resume is exact at the
same world size. With ``none`` nothing is registered: the run is what it was without this module.

Over gloo, PowerSGD runs each bucket on the thread DDP calls the hook from (``powersgd_on_this_thread``). torch's
hook issues a bucket's second and third all-reduce from the callbacks of its first, on gloo's own threads, while
the backward pass issues the next bucket's first from its thread. Two processes could then issue them in different
orders, and gloo pairs collectives by the order they are issued: a model whose gradients fill several buckets
(ResNet-18's 45 MB: three) died of ``gloo::EnforceNotMet`` ("Received data size doesn't match expected size")
within tens of steps. Those callbacks also multiply matrices on gloo's threads, which use every core where this
process uses its share: two runs then differed in their last bits. Over NCCL the arithmetic runs on the GPU, and a
future's callbacks run when its work is queued, in the issuing thread, so torch's hook serves as it is."""

from __future__ import annotations

import logging
from typing import Any, Callable

import ignite.distributed as idist
import numpy as np
import torch
import torch.distributed as dist
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


def start_afresh(state: powerSGD_hook.PowerSGDState) -> None:
    """A checkpoint's PowerSGD state of other buckets (another ddp_bucket_cap_mb, or a build before it was recorded)
    is dropped, with one warning: the error feedback and the warm P and Q start again."""
    ranks.on_rank_zero(
        logger.warning, "powersgd: the checkpoint's buckets differ from this run's: its error feedback starts afresh"
    )
    state.error_dict.clear()
    state.p_memory_dict.clear()
    state.q_memory_dict.clear()


def powersgd_on_this_thread(
    state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook`` for one bucket, step for step (its helpers, its state and its memory layout, so a
    checkpoint reads alike), with every all-reduce waited for here, on the thread DDP calls the hook from: the
    buckets' collectives are issued in one order on every process, and all the arithmetic runs with this process's
    CPU threads. Returns a future that already holds the bucket's averaged gradients."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world_size, buffer = dist.get_world_size(group), bucket.buffer()
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    if state.iter < state.start_powerSGD_iter:  # whole gradients, averaged as torch's hook does before its start
        dist.all_reduce(buffer.div_(world_size), group=group)
        state.maybe_increase_iter(bucket)
        done.set_result(buffer)
        return done
    index = bucket.index()
    if index in state.error_dict and state.error_dict[index].shape != buffer.shape:
        start_afresh(state)
    if index in state.error_dict:
        buffer.add_(state.error_dict[index])
    before = buffer.detach().clone()
    matrices, vectors = split_for_compression(state, bucket.gradients())
    ps, qs = low_rank_factors(state, index, matrices, buffer)
    whole = torch.cat([vector.view(-1) for vector in vectors]) if vectors else buffer.new_empty(0)
    whole_reduced = dist.all_reduce(whole, group=group, async_op=True)
    for matrix, p, q in zip(matrices, ps, qs):
        torch.bmm(matrix, q, out=p)
    dist.all_reduce(state.p_memory_dict[index], group=group)
    for matrix, p, q in zip(matrices, ps, qs):
        powerSGD_hook._orthogonalize(p, state.orthogonalization_epsilon)
        torch.bmm(matrix.transpose(1, 2), p, out=q)
    dist.all_reduce(state.q_memory_dict[index], group=group)
    state.q_memory_dict[index].div_(world_size)
    for matrix, p, q in zip(matrices, ps, qs):
        torch.bmm(p, q.transpose(1, 2), out=matrix)
    whole_reduced.wait()
    whole.div_(world_size)
    offset = 0
    for vector in vectors:
        vector.copy_(whole[offset : offset + vector.numel()].view_as(vector))
        offset += vector.numel()
    state.error_dict[index] = before - buffer
    state.maybe_increase_iter(bucket)
    done.set_result(buffer)
    return done


# DDP checks a hook's annotations as objects, and this module's are strings (``from __future__ import annotations``)
powersgd_on_this_thread.__annotations__.update(bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]})


def split_for_compression(
    state: powerSGD_hook.PowerSGDState, gradients: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The gradients worth compressing, as matrices (batches of one, as torch's hook keeps them), and the rest
    (biases, small layers), exchanged whole: torch's rule, ``min_compression_rate``."""
    matrices: list[torch.Tensor] = []
    vectors: list[torch.Tensor] = []
    for gradient in gradients:
        rows, columns = gradient.shape[0], gradient.numel() // max(gradient.shape[0], 1)
        rank = min(rows, columns, state.matrix_approximation_rank)
        if powerSGD_hook._should_compress(rows, columns, rank, state.min_compression_rate)[0]:
            matrices.append(gradient.view(1, rows, columns))
        else:
            vectors.append(gradient)
    return matrices, vectors


def low_rank_factors(
    state: powerSGD_hook.PowerSGDState, index: int, matrices: list[torch.Tensor], buffer: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each matrix's P and Q (matrices and factors as batches of one, as torch's hook keeps them), views of the
    bucket's P and Q memory: Q as the step before left it, orthogonalized (warm start), or drawn at random where
    the bucket has none yet (as torch draws them, from the state's seed)."""
    shapes = [matrix.shape[1:] for matrix in matrices]
    ranks = [min(*shape, state.matrix_approximation_rank) for shape in shapes]
    p_sizes = [shape[0] * rank for shape, rank in zip(shapes, ranks)]
    q_sizes = [shape[1] * rank for shape, rank in zip(shapes, ranks)]
    drawn = index not in state.p_memory_dict
    if drawn:
        state.p_memory_dict[index] = buffer.new_empty(sum(p_sizes))
        state.q_memory_dict[index] = buffer.new_empty(sum(q_sizes))
    ps = [p.view(1, shape[0], rank) for p, shape, rank in zip(state.p_memory_dict[index].split(p_sizes), shapes, ranks)]
    qs = [q.view(1, shape[1], rank) for q, shape, rank in zip(state.q_memory_dict[index].split(q_sizes), shapes, ranks)]
    if not drawn:
        for q in qs:
            powerSGD_hook._orthogonalize(q, state.orthogonalization_epsilon)
        return ps, qs
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(state.rng.randint(1_000_000_000))
        for q in qs:
            q.copy_(torch.randn(*q.shape, dtype=q.dtype))
            powerSGD_hook._orthogonalize(q, state.orthogonalization_epsilon)
    return ps, qs


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
        if idist.backend() == "gloo":
            model.register_comm_hook(state, powersgd_on_this_thread)
        else:
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
    """What the run compresses, for its plan and provenance: 'none', 'bf16', 'powersgd rank 32 from step 10', or
    what was asked and why it does nothing."""
    if attached is None:
        return "none" if config.grad_compression == "none" else f"none ({config.grad_compression} asked: world size 1)"
    if attached.kind == "powersgd":
        return f"powersgd rank {config.powersgd_rank} from step {config.powersgd_start_step}"
    return attached.kind

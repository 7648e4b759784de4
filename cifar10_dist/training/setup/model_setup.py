"""The model a training process trains, set up once and shared by ``training.run`` (a run) and ``lr_finding`` (the
learning-rate sweep): its pretrained start, its data-dependent initialisation, its memory format, its wrapping for
the backend and its compiled forward."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ignite.distributed as idist
import torch
from torch import nn

from cifar10_dist import models, recipes
from cifar10_dist.config import NATIVE_BACKENDS, Config
from cifar10_dist.data import batches, run_data
from cifar10_dist.errors import UserError
from cifar10_dist.models import pretrained
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.setup.resumption import Resumption

logger = logging.getLogger("cifar10_dist")


@dataclass
class Network:
    model: nn.Module  # wrapped for the backend (DDP, ...); checkpoints save this one
    forward: nn.Module  # what the engines call: the model, compiled when compile=True
    compression: Any = None  # grad_compression's hook and state (compression.GradientCompression), once attached


def setup_pretrained(config: Config) -> pretrained.Weights | None:
    """The weights the model starts from (``pretrained``), resolved once in each process (fetched before the
    workers started); None without them."""
    return pretrained.resolve(config.model, config.pretrained) if config.pretrained is not None else None


def setup_model(
    config: Config,
    data_setup: run_data.DataSetup,
    weights: pretrained.Weights | None,
    precision: Precision | None = None,
    resumption: Resumption | None = None,
) -> Network:
    """The model (started from ``weights`` unless resuming, else with what its recipe sets from training images),
    its weights in bf16 with ``low_precision_weights`` (``precision``: the run's), in the configured memory
    format, wrapped for the backend (DDP, ...), and compiled for the engines if asked."""
    info = data_setup.info
    model = models.build_model(config.model, config.model_kwargs, len(info.classes))
    if weights is not None and not (resumption is not None and resumption.continues):
        pretrained.load(model, weights, info.classes)  # (a resume loads its checkpoint's weights)
    else:  # what the model's recipe sets from data, never over pretrained weights
        recipes.parts_of(model).init_from_data(data_setup.train.images, info)
    logger.info("model %s: %.2fM parameters", config.model, models.count_parameters(model) / 1e6)
    if config.low_precision_weights:
        half_network(model, precision)
    if config.sync_bn and idist.get_world_size() > 1:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = wrapped_for_backend(model.to(memory_format=batches.memory_format(config.channels_last)), config)
    compiled: nn.Module = torch.compile(model, mode=config.compile_mode) if config.compile else model  # type: ignore[assignment]
    return Network(model, compiled)


def wrapped_for_backend(model: nn.Module, config: Config) -> nn.Module:
    """The model on this process's device, wrapped for its backend by Ignite's ``auto_model`` (DDP, ...), with the
    config's DDP bucket size; where local ranks share a GPU (replicas per GPU over gloo, ``launch.spawn``), in DDP
    on the GPU this process really uses: auto_model names the local rank as the device, a GPU that does not exist
    past the first."""
    device = idist.device()
    local_rank = idist.get_local_rank()
    cap = config.ddp_bucket_cap_mb
    buckets: dict[str, Any] = {"bucket_cap_mb": cap} if cap is not None else {}
    if not shares_a_gpu(device, local_rank, idist.get_world_size()):
        # auto_model wraps one process on several GPUs in DataParallel, which takes no buckets
        in_ddp = idist.get_world_size() > 1 and idist.backend() in NATIVE_BACKENDS
        return idist.auto_model(model, **(buckets if in_ddp else {}))
    return nn.parallel.DistributedDataParallel(model.to(device), device_ids=[device.index], **buckets)


def shares_a_gpu(device: torch.device, local_rank: int, world_size: int) -> bool:
    """Whether this process trains on a GPU other than the one its local rank names (local ranks outnumber GPUs)."""
    return world_size > 1 and device.type == "cuda" and device.index is not None and device.index != local_rank


NORMALISATION = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def half_network(model: nn.Module, precision: Precision | None) -> None:
    """``low_precision_weights``: every weight and buffer in bf16 but the normalisation layers' (fp32, as airbench's
    ``.half()`` net keeps its BatchNorm), so autocast has no weight to cast at each step; refused in one line
    unless the run trains in bf16."""
    if precision is None or precision.dtype != torch.bfloat16:
        trains = f"{precision.name} ({precision.reason})" if precision else "fp32"
        raise UserError(
            f"low_precision_weights=True keeps the weights in bf16, and this run trains in {trains}: give "
            "--with_amp=True --amp_dtype=bfloat16 on hardware with bf16, or leave low_precision_weights off"
        )
    norms = [module for module in model.modules() if isinstance(module, NORMALISATION)]
    model.to(torch.bfloat16)
    for norm in norms:
        norm.float()
    logger.info("low_precision_weights: weights in bf16, %d normalisation layers in fp32", len(norms))

"""Where and how the processes of a run start: the backend, processes per node, nodes, rendezvous and timeouts. Fields
of ``Config`` (``config.fields`` composes them; one flat set of keys for flags, YAML and the API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from cifar10_dist.config.options import AT_LEAST_1, Bounds, option

NATIVE_BACKENDS = ("gloo", "nccl")  # torch.distributed's own: DDP and its hooks, init_method, timeouts


@dataclass(frozen=True)
class LaunchKeys:
    """Where and how the processes of a run start."""

    backend: Optional[Literal["gloo", "nccl", "xla-tpu", "horovod"]] = option(
        None,
        "distributed backend: gloo, nccl, xla-tpu, horovod (default: none)",
        short="gloo (CPU), nccl (GPU), xla-tpu, horovod",
        choices_in_words="one of gloo, nccl, xla-tpu, horovod (or leave it unset for 1 process)",
        per_tuning_worker=True,
    )
    nproc_per_node: Optional[int] = option(
        None,
        "processes to spawn on this node (not under torchrun)",
        short="processes to start on this node",
        bounds=Bounds(1, in_words=">= 1"),
        per_tuning_worker=True,
    )
    nnodes: Optional[int] = option(
        None,
        "number of nodes when spawning (with nproc_per_node)",
        short="number of nodes",
        bounds=AT_LEAST_1,
        per_tuning_worker=True,
    )
    node_rank: Optional[int] = option(
        None,
        "rank of this node when spawning over several nodes",
        short="this node's rank (0 on the first)",
        per_tuning_worker=True,
    )
    master_addr: Optional[str] = option(
        None,
        "address of node 0 when spawning over several nodes",
        short="node 0's address, as the others reach it",
        per_tuning_worker=True,
    )
    master_port: Optional[int] = option(
        None,
        "free TCP port on node 0 when spawning (default: a free one, 1 node)",
        short="a free TCP port on node 0",
        bounds=Bounds(1, 65535),
        per_tuning_worker=True,
    )
    init_method: str = option(
        "env://",
        "how gloo/nccl processes find each other: env:// or file:///shared/fresh-file",
        short="env:// or file:///shared/file",
        per_tuning_worker=True,
    )
    dist_timeout: int = option(
        1800,
        "seconds a process waits for the others in a gloo/nccl collective before failing",
        short="seconds to wait for the other processes",
        bounds=Bounds(1, in_words="at least 1 second"),
        per_tuning_worker=True,
    )

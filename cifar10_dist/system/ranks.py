"""The rank seam: work that rank 0 alone does goes through here. ``on_rank_zero`` runs an action on rank 0 alone,
``from_rank_zero`` computes on rank 0 and hands the (JSON-able) result to every rank. (Other code reads the rank
only as a number: to shard and seed data per process, and to prefix a process's log lines.)"""

from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

import ignite.distributed as idist

from cifar10_dist.errors import KINDS, UserError

T = TypeVar("T")


def is_rank_zero() -> bool:
    return idist.get_rank() == 0


def on_rank_zero(action: Callable[..., T], *args: Any) -> T | None:
    """``action(*args)`` on rank 0 only; None on the other ranks."""
    return action(*args) if is_rank_zero() else None


def from_rank_zero(compute: Callable[..., Any], *args: Any) -> Any:
    """``compute(*args)`` on rank 0, its JSON-able result handed to every rank (all ranks must call this).
    A UserError raised by ``compute`` is raised on every rank, so all of them stop with the same message."""
    outcome: dict[str, Any] = {}
    if idist.get_rank() == 0:
        try:
            outcome = {"value": compute(*args)}
        except UserError as error:
            if idist.get_world_size() == 1:
                raise
            outcome = {"error": type(error).__name__, "message": str(error)}
    if idist.get_world_size() > 1:
        outcome = json.loads(str(idist.broadcast(json.dumps(outcome), src=0, safe_mode=True)))
    if "error" in outcome:
        raise KINDS.get(outcome["error"], UserError)(outcome["message"])
    return outcome["value"]

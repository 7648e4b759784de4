"""Make pytorch-ignite 0.5.x run on current torch-xla (2.7 and newer). Nothing happens without torch_xla.

Each patch fixes one incompatibility found with torch-xla 2.9 (scripts/test_xla_cpu.sh) and is applied only
when the thing it replaces is missing or broken:

1. ``xm.xrt_world_size``, ``xm.get_ordinal``, ``xm.get_local_ordinal`` were removed from torch-xla; Ignite's
   XLA model still calls them (even ``idist.get_rank()`` in a run without any backend crashes).
   They are pointed at ``torch_xla.runtime.world_size/global_ordinal/local_ordinal``.
2. ``xmp.spawn(nprocs=N)`` accepts only N in {1, None} since torch-xla 2.6; Ignite passes N. N > 1 becomes
   ``nprocs=None`` with ``<PJRT_DEVICE>_NUM_DEVICES=N``, the documented way to limit the devices used.
3. ``idist.auto_optim`` on XLA builds an optimizer class whose ``__init__`` calls a zero-argument ``super()``
   outside its class (TypeError since ignite 0.5.4); it also kept optimizer state (momentum) where
   ``state_dict()`` could not see it. The replacement shares state and param_groups with the wrapped optimizer,
   also after ``load_state_dict`` (resume).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, MutableMapping

import ignite.distributed as idist


def apply() -> list[str]:
    """Apply the patches this torch-xla needs; return their names (empty without torch_xla)."""
    if not idist.has_xla_support:
        return []
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    from ignite.distributed import auto
    from ignite.distributed.comp_models import xla as ignite_xla

    applied = []
    if patch_removed_xm_functions(xm, xr):
        applied.append("xm world size and ordinals")
    if patch_xla_spawn(ignite_xla._XlaDistModel):
        applied.append("xmp.spawn nprocs")
    if patch_xla_optimizer(auto._XLADistributedOptimizer):
        applied.append("auto_optim on XLA")
    return applied


def patch_removed_xm_functions(xm: Any, xr: Any) -> bool:
    """Point the xla_model functions Ignite calls at their torch_xla.runtime replacements, where missing."""
    replacements = {
        "xrt_world_size": xr.world_size,
        "get_ordinal": xr.global_ordinal,
        "get_local_ordinal": xr.local_ordinal,
    }
    missing = {name: function for name, function in replacements.items() if not hasattr(xm, name)}
    for name, function in missing.items():
        setattr(xm, name, function)
    return bool(missing)


def patch_xla_spawn(xla_dist_model: Any) -> bool:  # (a class, patched)
    """Replace Ignite's ``_XlaDistModel.spawn`` by one that asks xmp.spawn for N devices the supported way."""
    if getattr(xla_dist_model.spawn, "_cifar10_dist_patch", False):
        return False

    def spawn(
        fn: Callable,
        args: tuple,
        kwargs_dict: Mapping | None = None,
        nproc_per_node: int = 1,
        nnodes: int = 1,
        node_rank: int = 0,
        backend: str = "xla-tpu",
        **kwargs: Any,
    ) -> None:
        import torch_xla.distributed.xla_multiprocessing as xmp

        nprocs = xla_spawn_nprocs(nproc_per_node, os.environ)
        xmp.spawn(
            xla_dist_model._dist_worker_task_fn,
            args=(backend, fn, args, kwargs_dict),
            nprocs=nprocs,
            start_method=kwargs.get("start_method", "fork"),
        )

    spawn._cifar10_dist_patch = True  # type: ignore[attr-defined]
    xla_dist_model.spawn = staticmethod(spawn)
    return True


def xla_spawn_nprocs(nproc_per_node: int, environ: MutableMapping[str, str]) -> int | None:
    """xmp.spawn's nprocs for nproc_per_node: 1 stays 1; N > 1 is None plus <DEVICE>_NUM_DEVICES=N."""
    if nproc_per_node == 1:
        return 1
    device = environ.get("PJRT_DEVICE", "TPU").upper()
    environ[f"{device}_NUM_DEVICES"] = str(nproc_per_node)
    return None


def patch_xla_optimizer(xla_optimizer: Any) -> bool:  # (a class, patched)
    """Give Ignite's XLA optimizer wrapper an ``__init__`` that works in the class Ignite builds from it."""
    if getattr(xla_optimizer.__init__, "_cifar10_dist_patch", False):
        return False

    def __init__(self: Any, optimizer: Any) -> None:
        # Ignite copies this class's __dict__ into type(name, (type(optimizer),), ...): call that base directly
        base = type(self).__mro__[1]
        base.__init__(self, optimizer.param_groups)  # type: ignore[misc]  # (the class Ignite made)
        self.wrapped_optimizer = optimizer
        self.param_groups = optimizer.param_groups  # the lr scheduler edits these
        self.state = optimizer.state  # momentum lives here: checkpoints must see it

    def load_state_dict(self: Any, state_dict: dict[str, Any]) -> None:
        # Optimizer.load_state_dict rebinds state and param_groups: load into the wrapped one and share again
        self.wrapped_optimizer.load_state_dict(state_dict)
        self.param_groups = self.wrapped_optimizer.param_groups
        self.state = self.wrapped_optimizer.state

    __init__._cifar10_dist_patch = True  # type: ignore[attr-defined]
    xla_optimizer.__init__ = __init__
    xla_optimizer.load_state_dict = load_state_dict
    return True

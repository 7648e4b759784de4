"""Each torch-xla compatibility patch, on stand-ins that behave like the torch-xla 2.9 / ignite 0.5.5 code
they fix (torch_xla is not installed here; scripts/test_xla_cpu.sh runs the real thing)."""

from __future__ import annotations

import copy
import os
import sys
import types

import pytest
import torch

from cifar10_dist.launch import xla_compat


def test_nothing_is_patched_without_torch_xla():
    assert "torch_xla" not in sys.modules
    assert xla_compat.apply() == []


def test_removed_xm_functions_point_at_torch_xla_runtime():
    def local_ordinal_kept():
        return 5

    xm = types.SimpleNamespace(get_local_ordinal=local_ordinal_kept)  # torch-xla 2.9 still has this one
    xr = types.SimpleNamespace(world_size=lambda: 8, global_ordinal=lambda: 3, local_ordinal=lambda: 1)
    assert xla_compat.patch_removed_xm_functions(xm, xr)
    assert (xm.xrt_world_size(), xm.get_ordinal(), xm.get_local_ordinal()) == (8, 3, 5)
    assert not xla_compat.patch_removed_xm_functions(xm, xr)  # nothing left to patch


class FakeXlaDistModel:
    """Ignite's _XlaDistModel.spawn passes nprocs=nproc_per_node, which xmp.spawn refuses for N > 1."""

    @staticmethod
    def _dist_worker_task_fn(local_rank, backend, fn, args, kwargs_dict):
        pass

    @staticmethod
    def spawn(fn, args, kwargs_dict=None, nproc_per_node=1, nnodes=1, node_rank=0, backend="xla-tpu", **kwargs):
        raise ValueError(f"Unsupported nprocs ({nproc_per_node})")


@pytest.fixture
def fake_xmp(monkeypatch):
    calls = []
    xmp = types.ModuleType("torch_xla.distributed.xla_multiprocessing")
    xmp.spawn = lambda fn, args=(), nprocs=None, start_method="spawn": calls.append((fn, args, nprocs, start_method))
    for name in ("torch_xla", "torch_xla.distributed"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torch_xla.distributed.xla_multiprocessing", xmp)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setenv("TPU_NUM_DEVICES", "unset")  # restored after the test
    return calls


def test_spawn_asks_for_n_devices_the_way_torch_xla_accepts(fake_xmp):
    model = type("XlaModel", (FakeXlaDistModel,), {})
    assert xla_compat.patch_xla_spawn(model)
    model.spawn(print, args=("a",), kwargs_dict={}, nproc_per_node=4, backend="xla-tpu")
    model.spawn(print, args=("b",), kwargs_dict={}, nproc_per_node=1, backend="xla-tpu")
    (fn, args, nprocs, start_method), (_, _, nprocs_one, _) = fake_xmp
    assert fn is FakeXlaDistModel._dist_worker_task_fn and args == ("xla-tpu", print, ("a",), {})
    assert (nprocs, os.environ["TPU_NUM_DEVICES"], start_method) == (None, "4", "fork")
    assert nprocs_one == 1
    assert not xla_compat.patch_xla_spawn(model)  # applied once


def make_ignite_xla_optimizer_class() -> type:
    """A copy of ignite 0.5.5's _XLADistributedOptimizer (xm.optimizer_step replaced by a plain step)."""

    class XLADistributedOptimizer(torch.optim.Optimizer):
        def __init__(self, optimizer):
            super().__init__(optimizer.param_groups)
            self.wrapped_optimizer = optimizer

        def step(self, closure=None):
            self.wrapped_optimizer.step()

    return XLADistributedOptimizer


def ignite_auto_optim(optimizer: torch.optim.Optimizer, wrapper: type) -> torch.optim.Optimizer:
    """What idist.auto_optim does on XLA."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(wrapper.__dict__))
    return cls(optimizer)


def sgd_steps(optimizer: torch.optim.Optimizer, weight: torch.nn.Parameter, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        (weight**2).sum().backward()
        optimizer.step()


def test_auto_optim_on_xla_works_and_checkpoints_hold_the_momentum():
    unpatched = make_ignite_xla_optimizer_class()
    with pytest.raises(TypeError, match="super"):
        ignite_auto_optim(torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1), unpatched)

    wrapper_class = make_ignite_xla_optimizer_class()
    assert xla_compat.patch_xla_optimizer(wrapper_class)
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = ignite_auto_optim(torch.optim.SGD([weight], lr=0.1, momentum=0.9), wrapper_class)
    sgd_steps(optimizer, weight, 2)
    optimizer.param_groups[0]["lr"] = 0.05  # as the lr scheduler does
    assert optimizer.wrapped_optimizer.param_groups[0]["lr"] == 0.05
    saved = copy.deepcopy(optimizer.state_dict())  # as written to disk
    assert torch.is_tensor(saved["state"][0]["momentum_buffer"])

    # resume: a new wrapper loads the checkpoint, and both continue identically
    weight_copy = torch.nn.Parameter(weight.detach().clone())
    resumed = ignite_auto_optim(torch.optim.SGD([weight_copy], lr=0.1, momentum=0.9), wrapper_class)
    resumed.load_state_dict(saved)
    assert resumed.wrapped_optimizer.param_groups[0]["lr"] == 0.05
    sgd_steps(optimizer, weight, 1)
    sgd_steps(resumed, weight_copy, 1)
    assert torch.equal(weight, weight_copy)

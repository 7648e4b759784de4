"""How spawned workers start, decided without importing torch: fork in a notebook, else a forkserver that
imports torch and the package once (``start_method``), started as early as a run knows it will spawn
(``start_early``), so that the server imports them on one core while the launcher checks the config on the other."""

from __future__ import annotations

import builtins
import multiprocessing

from cifar10_dist.config import Config

NATIVE_BACKENDS = ("gloo", "nccl")
# the worker module (torch, Ignite), what every worker imports on first use (torch._dynamo, by the optimizer's
# constructor: about 1 s of a core; torchvision's datasets and models, filelock) and what rank 0 imports at every
# run (TensorBoard's writer; matplotlib for curves.png and mistakes.png); the forkserver leaves out a module that
# is not installed
PRELOADED = ("cifar10_dist.training.worker", "torch._dynamo", "torchvision.datasets", "torchvision.models", "filelock",
             "torch.utils.tensorboard", "matplotlib.figure", "matplotlib.backends.backend_agg")


def start_method() -> str:
    """fork in a notebook (its functions stay reachable); elsewhere a forkserver that imported torch and this
    package once, so each worker starts in a fraction of a second instead of importing them again (what spawn
    does, and where there is no forkserver, e.g. on Windows). Workers forked from the server take this process's
    environment, folder and import path from their arguments (``spawn._spawned_entry``), as spawned ones would."""
    if "__IPYTHON__" in builtins.__dict__:
        return "fork"
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(list(PRELOADED))
    return "forkserver"


def start_early(config: Config) -> None:
    """A run that will spawn gloo/nccl workers through a forkserver starts the server now, before this process
    imports torch for its checks: both import at once (a launch from the command line starts its workers about
    2 s sooner on two cores). The server waits, unused, when the checks refuse the run."""
    if config.backend not in NATIVE_BACKENDS or config.nproc_per_node is None or start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    forkserver.ensure_running()

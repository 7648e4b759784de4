"""cifar10_dist: data-parallel CIFAR-10 training with PyTorch-Ignite, from one CPU to many GPUs.

Python API: ``train(config=None, **overrides)`` and ``evaluate(checkpoint, config=None, **overrides)``.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["train", "evaluate", "UserError"]

from cifar10_dist.errors import UserError


def train(config: Any = None, **overrides: Any) -> dict:
    """Train; see :func:`cifar10_dist.training.train` (imported lazily: torch loads only when used)."""
    from cifar10_dist.training import train as _train

    return _train(config, **overrides)


def evaluate(checkpoint: Any, config: Any = None, **overrides: Any) -> dict:
    """Evaluate a checkpoint; see :func:`cifar10_dist.training.evaluate`."""
    from cifar10_dist.training import evaluate as _evaluate

    return _evaluate(checkpoint, config, **overrides)

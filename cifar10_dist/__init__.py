"""cifar10_dist: data-parallel CIFAR-10 training with PyTorch-Ignite, from one CPU to many GPUs.

Python API (``cifar10_dist.api``): ``train(config=None, **overrides)``, ``train_seeds(...)``,
``evaluate(checkpoint, config=None, **overrides)``, ``predict(checkpoint, images)``,
``export(checkpoint, format)`` and ``doctor()``; ``config`` is a YAML path or a ``Config``.
Importing the package does not import torch: that happens when a run starts.
"""

__version__ = "0.1.0"
__all__ = ["train", "train_seeds", "evaluate", "predict", "export", "doctor", "Config", "load_config", "UserError", "RunResult", "SeedsResult",
           "EvaluationResult", "ExportResult", "DoctorReport", "TuneResult"]

from cifar10_dist.api import doctor, evaluate, export, predict, train, train_seeds
from cifar10_dist.config import Config, load_config
from cifar10_dist.errors import UserError
from cifar10_dist.results import DoctorReport, EvaluationResult, ExportResult, RunResult, SeedsResult, TuneResult

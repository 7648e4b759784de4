"""cifar10_dist: data-parallel CIFAR-10 training with PyTorch-Ignite, from one CPU to many GPUs.

The Python API, the calls behind the command line: ``train(config=None, **overrides)``, ``train_seeds``,
``evaluate(checkpoint, config=None, **overrides)``, ``lr_find``, ``batch_size``, ``predict``, ``predict_files``,
``export(checkpoint, format)``, ``tune``, ``doctor``, ``report`` and ``prepare_data``; ``config`` is a YAML path, the
name of a shipped config (``"demo"``, ``"fast"``, ...) or a ``Config`` (``load_config``, ``resolve``). Each returns a
typed result (``cifar10_dist.results``; the package ships ``py.typed``). Importing the package does not import
torch: that happens when a run starts.
"""

# the one place the version is written (pyproject.toml reads it; --version prints it): a development build between
# releases is X.Y.Z.devN (PEP 440), so that nothing built from a tree with unreleased changes reads as a release
__version__ = "0.1.1.dev0"

from cifar10_dist.api import (
    batch_size,
    doctor,
    evaluate,
    export,
    lr_find,
    predict,
    predict_files,
    prepare_data,
    report,
    resolve,
    train,
    train_seeds,
    tune,
)
from cifar10_dist.config import Config, load_config, shipped_configs
from cifar10_dist.errors import UserError
from cifar10_dist.results import (
    BatchSizeResult,
    DoctorReport,
    EvaluationResult,
    ExportResult,
    LrFindResult,
    PreparedData,
    ReportResult,
    RunResult,
    SeedsResult,
    TuneResult,
)

__all__ = [
    "__version__",
    "train",
    "train_seeds",
    "evaluate",
    "lr_find",
    "batch_size",
    "predict",
    "predict_files",
    "export",
    "tune",
    "doctor",
    "report",
    "prepare_data",
    "resolve",
    "Config",
    "load_config",
    "shipped_configs",
    "UserError",
    "RunResult",
    "SeedsResult",
    "EvaluationResult",
    "ExportResult",
    "LrFindResult",
    "BatchSizeResult",
    "DoctorReport",
    "ReportResult",
    "PreparedData",
    "TuneResult",
]

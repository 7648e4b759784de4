"""What a checkpoint file holds, key by key: the one place its layout is written and read. Training writes through
``training_contents`` and ``best_model_contents``, calibration through ``with_temperature``; resume, evaluate,
predict, export, lr-find, a teacher and a pretrained start read through the functions below. A new entry is added
here (its key, where it is written, how it is read) and old files, which lack it, read as before.

- ``training_checkpoint_<iteration>.pt``: TRAINING_KEYS (the trainer's state: epoch and iteration, hence the
  sampler's position; the model; the optimizer; the LR schedule), and where the run has them SCALER (fp16's
  GradScaler), LOOKAHEAD, EARLY_STOPPING, EMA_MODEL with EMA_WARMUP, COMPRESSION (grad_compression's hook state:
  PowerSGD's error feedback and Q matrices); META; TEMPERATURE once calibrated.
- ``best_model_<epoch>_<split>_<metric>=<value>.pt``: MODEL (the EMA's weights in a run with ema_decay), META,
  PROGRESS (the epoch and iteration of the model it holds; not in older files), TEMPERATURE once calibrated.
- META: the resolved config, the provenance (data checksum and classes, teacher, ...), the world size and the
  library versions (``RunMetadata``).
- A bare state dict (a user's file) reads as MODEL.

Plain data and torch: no package below this one but ``config`` (a recorded config is read back as a ``Config``) and
``errors``.
"""

from __future__ import annotations

import platform
from typing import Any, Mapping

import torch

from cifar10_dist.config import Config
from cifar10_dist.errors import UserError

TRAINER = "trainer"
MODEL = "model"
OPTIMIZER = "optimizer"
LR_SCHEDULER = "lr_scheduler"
SCALER = "scaler"
LOOKAHEAD = "lookahead"  # periodic_averaging's state (the slot keeps its first name: older checkpoints read)
EARLY_STOPPING = "early_stopping"
EMA_MODEL = "ema_model"
EMA_WARMUP = "ema_warmup"
META = "meta"
TEMPERATURE = "temperature"
PROGRESS = "progress"
COMPRESSION = "grad_compression"

TRAINING_KEYS = (TRAINER, MODEL, OPTIMIZER, LR_SCHEDULER)  # every training checkpoint has these


class RunMetadata:
    """What produced a checkpoint: config, provenance, library versions, world size (stored under META)."""

    def __init__(
        self, config: Mapping[str, Any] | None = None, provenance: Mapping[str, Any] | None = None, world_size: int = 1
    ) -> None:
        import ignite

        self.state: dict[str, Any] = {
            "config": dict(config or {}),
            "provenance": dict(provenance or {}),
            "world_size": world_size,
            "versions": {
                "python": platform.python_version(),
                "torch": str(torch.__version__),
                "pytorch-ignite": ignite.__version__,
            },
        }

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.state = dict(state)


def training_contents(
    trainer: Any,
    model: Any,
    optimizer: Any,
    lr_scheduler: Any,
    scaler: Any = None,
    lookahead: Any = None,
    early_stopping: Any = None,
    ema: Any = None,
    compression: Any = None,
) -> dict[str, Any]:
    """The objects a training checkpoint saves and a resume restores (Ignite's ``to_save``), META aside;
    ``ema``: Ignite's EMAHandler, whose model and warm-up state are both kept."""
    contents = {TRAINER: trainer, MODEL: model, OPTIMIZER: optimizer, LR_SCHEDULER: lr_scheduler}
    optional = {SCALER: scaler, LOOKAHEAD: lookahead, EARLY_STOPPING: early_stopping, COMPRESSION: compression}
    contents.update({key: value for key, value in optional.items() if value is not None})
    if ema is not None:
        contents[EMA_MODEL], contents[EMA_WARMUP] = ema.model, ema
    return contents


def with_meta(contents: Mapping[str, Any], meta: RunMetadata) -> dict[str, Any]:
    return {**contents, META: meta}


class Progress:
    """Where training was when a file was written: the trainer's epoch and iteration (saved, never restored: a
    resume restores the trainer's own state)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, int]:
        return {"epoch": int(self.trainer.state.epoch), "iteration": int(self.trainer.state.iteration)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""


def best_model_contents(model: Any, meta: RunMetadata, trainer: Any) -> dict[str, Any]:
    """What a best-model file saves: the model it was chosen with (the EMA's in a run with ema_decay), META, and
    the ``trainer``'s PROGRESS at that moment."""
    return {MODEL: model, META: meta, PROGRESS: Progress(trainer)}


def restorable(contents: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """Those of ``contents`` that ``checkpoint`` has (an older file may lack an optional entry)."""
    return {key: value for key, value in contents.items() if key in checkpoint}


def missing_training_keys(checkpoint: Mapping[str, Any], required: Any = TRAINING_KEYS) -> list[str]:
    return [key for key in required if key != META and key not in checkpoint]


def has_ema(checkpoint: Mapping[str, Any]) -> bool:
    return EMA_MODEL in checkpoint


def model_weights(checkpoint: Mapping[str, Any], prefer_ema: bool = False) -> Mapping[str, torch.Tensor]:
    """The model's state dict from a training checkpoint, a best-model file, or a bare state dict; with
    ``prefer_ema``, a training checkpoint's EMA weights where it has them (the weights its run evaluates)."""
    weights = checkpoint[EMA_MODEL] if prefer_ema and EMA_MODEL in checkpoint else checkpoint.get(MODEL, checkpoint)
    if not isinstance(weights, Mapping) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise UserError("checkpoint holds no model weights (expected a 'model' entry or a state dict)")
    return weights


def meta(checkpoint: Mapping[str, Any]) -> Mapping[str, Any]:
    found = checkpoint.get(META) if isinstance(checkpoint, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def recorded_config(checkpoint: Mapping[str, Any]) -> Config | None:
    """The config recorded in a checkpoint's META, as a ``Config`` (``Config.from_record``: a file of an older
    release reads with today's defaults for the keys it lacks); None when the file records none (a bare state
    dict)."""
    values = meta(checkpoint).get("config")
    return Config.from_record(values) if isinstance(values, Mapping) and values else None


def recorded_keys(checkpoint: Mapping[str, Any]) -> frozenset[str]:
    """The config keys a checkpoint's META records (an older release's file lacks the keys added since): where a
    reader must tell a recorded value from a default."""
    from cifar10_dist.config.fields import RENAMED

    values = meta(checkpoint).get("config")
    if not isinstance(values, Mapping):
        return frozenset()
    return frozenset(RENAMED.get(str(key), str(key)) for key in values)


def recorded_provenance(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance recorded in a checkpoint's META (empty for older files or bare state dicts)."""
    return dict(meta(checkpoint).get("provenance", {}))


def recorded_data_info(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The classes, normalisation and sizes of the data the model was trained on, as recorded (None in files from
    before they were)."""
    return recorded_provenance(checkpoint).get("dataset", {}).get("info") or None


def recorded_world_size(checkpoint: Mapping[str, Any]) -> int | None:
    return meta(checkpoint).get("world_size")


def iteration(checkpoint: Mapping[str, Any]) -> int:
    """The iteration a training checkpoint was written at."""
    return int(checkpoint[TRAINER].get("iteration", 0))


def epoch_length(checkpoint: Mapping[str, Any]) -> int | None:
    """The iterations of an epoch in the run that wrote a training checkpoint (Ignite keeps them on resume)."""
    found = checkpoint[TRAINER].get("epoch_length")
    return int(found) if found else None


def progress(checkpoint: Mapping[str, Any]) -> dict[str, int] | None:
    """The epoch and iteration of a best-model file's model (None in files from before it was recorded)."""
    found = checkpoint.get(PROGRESS)
    return dict(found) if isinstance(found, Mapping) else None


def temperature(checkpoint: Mapping[str, Any]) -> float | None:
    """The temperature calibration fitted to this file's model (None when it has none)."""
    found = checkpoint.get(TEMPERATURE)
    return None if found is None else float(found)


def with_temperature(checkpoint: Mapping[str, Any], value: float) -> dict[str, Any]:
    """The checkpoint with a fitted temperature, to be written back whole."""
    return {**checkpoint, TEMPERATURE: float(value)}

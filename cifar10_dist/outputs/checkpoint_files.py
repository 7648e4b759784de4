"""A run folder's checkpoint files: their names, listing them (newest or best first), and reading one safely
(``torch.load(weights_only=True)``, one line for a missing or damaged file). Writing them is
``training.loop.checkpointing``'s.

- ``training_checkpoint_<iteration>.pt``
- ``best_model_<epoch>_(test|val)_<best_metric>=<value>.pt`` (best_metric: accuracy, balanced_accuracy or
  macro_f1)

What they hold is ``checkpoint_layout``'s.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch

from cifar10_dist import checkpoint_layout
from cifar10_dist.errors import UserError, first_line

logger = logging.getLogger(__name__)

TRAINING_PATTERN = re.compile(r"^training_checkpoint_(\d+)\.pt$")


BEST_PATTERN = re.compile(r"^best_model_(\d+)_(?:test|val)_(?:accuracy|balanced_accuracy|macro_f1)=([0-9.]+)\.pt$")


def best_model_file(run_dir: Path) -> Path | None:
    """The best-model file with the highest score in run_dir (None when there is none)."""
    found = existing_checkpoints(run_dir, BEST_PATTERN, lambda m: float(m.group(2)))
    return run_dir / found[-1][1] if found else None


def existing_checkpoints(run_dir: Path, pattern: re.Pattern, priority: Any) -> list[tuple[Any, str]]:
    """Checkpoints already in a resumed run's folder, so that n_saved also counts (and prunes) them."""
    found = []
    for path in sorted(run_dir.glob("*.pt")):
        match = pattern.match(path.name)
        if match:
            found.append((priority(match), path.name))
    return sorted(found)


def model_file(given: str | Path) -> str:
    """The file a command that reads a model takes: ``given`` itself, or for a run folder its best model (the
    newest training checkpoint where it has none); one line for a folder that holds neither."""
    folder = Path(given)
    if not folder.is_dir():
        return str(given)
    found = best_model_file(folder) or next(iter(training_checkpoints(folder)), None)
    if found is None:
        raise UserError(
            f"checkpoint '{given}' is a folder without a best_model_*.pt or training_checkpoint_*.pt: give a run "
            "folder or one of its checkpoint files"
        )
    return str(found)


def training_checkpoints(run_dir: Path) -> list[Path]:
    """training_checkpoint_<N>.pt files in run_dir, newest (highest N) first."""
    found = existing_checkpoints(run_dir, TRAINING_PATTERN, lambda m: int(m.group(1)))
    return [run_dir / name for _, name in reversed(found)]


def newest_valid_checkpoint(run_dir: Path) -> Path | None:
    """The newest training checkpoint in run_dir that loads and has every key; damaged ones are skipped."""
    for path in training_checkpoints(run_dir):
        try:
            checkpoint = load_checkpoint(path)
        except UserError as error:
            logger.warning("skipping %s: %s", path.name, error)
            continue
        missing = checkpoint_layout.missing_training_keys(checkpoint)
        if missing:
            logger.warning("skipping %s: missing %s", path.name, ", ".join(missing))
            continue
        return path
    return None


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint file without executing code; a clear UserError for missing or unreadable files. With
    ``mmap`` its tensors stay in the file until read (for a look at its meta alone)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint '{path}' does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:
        raise UserError(f"checkpoint '{path}' cannot be loaded: {_load_failure(error, path)}") from error
    if not isinstance(checkpoint, dict):
        raise UserError(f"checkpoint '{path}' holds a {type(checkpoint).__name__}, expected a dict")
    return checkpoint


def starts_like_a_checkpoint(path: Path) -> bool:
    """Whether the file begins as torch.save's zip archive (or an old pickle) does, whole or truncated."""
    with open(path, "rb") as opened:
        head = opened.read(4)
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def _load_failure(error: BaseException, path: Path) -> str:
    """A one-line reason for a failed torch.load: a refused global (code on unpickling), a file that is not a
    checkpoint at all (torch.save writes a zip archive), or a damaged one; torch's own words only where they say
    something (a bare number, as a KeyError of the first byte gives, says nothing)."""
    text = str(error)
    refused = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", text)
    if refused:
        return f"it asks to import {refused.group(1)}, refused (only tensors and plain data are loaded)"
    if not starts_like_a_checkpoint(path):
        return (
            "it is not a PyTorch checkpoint: torch.save writes a zip archive and this file is not one (give a "
            "training_checkpoint_*.pt or best_model_*.pt of a run)"
        )
    if "weights_only" in text and "WeightsUnpickler error:" in text:
        return "refused by the safe loader: " + text.split("WeightsUnpickler error:")[1].strip().splitlines()[0][:200]
    words = first_line(error, 200)
    return "the file is truncated or damaged" + (f" ({words})" if re.search(r"[A-Za-z]{3}", words) else "")

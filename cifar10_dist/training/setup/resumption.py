"""Whether a run continues, decided once: ``Resumption`` says whether the run was asked to continue
(``resume_from`` given, a path or auto) and from which checkpoint it does (the path given, or with auto the newest
valid one in the run folder, looked for by rank 0 and the same on every rank; None: a fresh start). Everything that
depends on it (the pretrained start skipped, the found learning rate read back, the folder claimed, the checkpoint
loaded) reads this one record."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from cifar10_dist.config import Config
from cifar10_dist.outputs.checkpoint_files import newest_valid_checkpoint
from cifar10_dist.system import ranks

logger = logging.getLogger("cifar10_dist")


@dataclass(frozen=True)
class Resumption:
    asked: bool  # resume_from was given (a path, or auto): an existing run folder may be taken over
    checkpoint: str | None  # the checkpoint the run continues from; None: it starts afresh

    @property
    def continues(self) -> bool:
        return self.checkpoint is not None


def decide(config: Config) -> Resumption:
    """The run's Resumption: resume_from as given, or with auto the newest valid checkpoint of
    output_path/run_name (rank 0 looks and says so in the log; every rank gets its answer)."""
    if config.resume_from != "auto":
        return Resumption(config.resume_from is not None, config.resume_from)

    def newest() -> str | None:
        found = newest_valid_checkpoint(Path(config.output_path) / str(config.run_name))
        logger.info("resume_from=auto: %s", f"continuing from {found}" if found else "no checkpoint, starting fresh")
        return str(found) if found else None

    return Resumption(True, ranks.from_rank_zero(newest))

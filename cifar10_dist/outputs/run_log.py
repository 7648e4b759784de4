"""Rank 0's log kept in the run folder (``run.log``): every line from the start of the run, with dates."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path
from typing import Any

import ignite.distributed as idist

logger = logging.getLogger("cifar10_dist")


class QuietFileHandler(logging.FileHandler):
    """A log file that never prints a traceback when it cannot be written (a full disk is reported by the run's
    own writes, in one line)."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


class RunLog:
    """Rank 0's log lines also kept in the run folder, ``run.log`` (a resumed run appends): held in memory from
    the start until the run folder is known, then written there line by line. A no-op on the other ranks."""

    def __init__(self) -> None:
        self.buffer: logging.handlers.MemoryHandler | None = None

    def __enter__(self) -> RunLog:
        if idist.get_rank() == 0:
            self.buffer = logging.handlers.MemoryHandler(
                capacity=100_000, flushLevel=logging.CRITICAL + 1, flushOnClose=False
            )
            logger.addHandler(self.buffer)
        return self

    def write_to(self, run_dir: Path) -> None:
        if self.buffer is not None:
            target = QuietFileHandler(run_dir / "run.log", mode="a", encoding="utf-8", delay=True)
            target.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
            self.buffer.setTarget(target)
            self.buffer.flushLevel = logging.DEBUG  # from now on every line at once
            self.buffer.flush()

    def __exit__(self, *exc_info: Any) -> None:
        if self.buffer is not None:
            self.buffer.flush()
            logger.removeHandler(self.buffer)
            if self.buffer.target is not None:
                self.buffer.target.close()
            self.buffer.close()
            self.buffer = None

"""How a launch that failed says so in one line: what a worker reports (``WorkerReport``, written to the launch's
exchange folder, read back by the launcher), and the launcher's explanation of a worker that raised, died of a
signal, crashed, or lost or never met its peers. Plain records and messages: the processes themselves are
``spawn``'s."""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from torch.multiprocessing import ProcessExitedException

from cifar10_dist.config import Config
from cifar10_dist.errors import (
    KINDS,
    GroupIncomplete,
    Interrupted,
    PeerLost,
    PeerSilent,
    UserError,
    WorkerLost,
    resume_hint,
)
from cifar10_dist.system import stopping


@dataclass(frozen=True)
class WorkerReport:
    """How a worker ended, when not with a result: a user error or an agreed Ctrl-C stop, by its class name
    (a key of ``errors.KINDS``), message and rank (and the checkpoint an interrupt wrote)."""

    kind: str
    message: str
    rank: int
    checkpoint: str | None = None

    @staticmethod
    def of(error: BaseException) -> WorkerReport:
        return WorkerReport(type(error).__name__, str(error), idist.get_rank(), getattr(error, "checkpoint", None))

    def error(self) -> BaseException:
        if self.kind == Interrupted.__name__:
            return Interrupted(self.message, self.checkpoint)
        return KINDS.get(self.kind, UserError)(self.message)

    def write(self, exchange: Path) -> None:
        (exchange / f"error-rank{self.rank}.json").write_text(json.dumps(asdict(self)))

    @staticmethod
    def read_all(exchange: Path) -> list[WorkerReport]:
        """Every report, lowest rank first."""
        reports = [WorkerReport(**json.loads(path.read_text())) for path in exchange.glob("error-rank*.json")]
        return sorted(reports, key=lambda report: report.rank)


def joining_failure(error: torch.distributed.DistError, config: Config) -> UserError:
    """One line for a process group that could not form: this process could not reach node 0's store (a wrong
    master_addr or port, node 0 not started: exit 2), or node 0 waited dist_timeout for processes that never
    came (exit 4). Nothing ran: there is nothing to resume."""
    where = f"{config.master_addr or os.environ.get('MASTER_ADDR', '127.0.0.1')}:{_master_port_given(config)}"
    cause = str(error).splitlines()[0] if str(error) else type(error).__name__
    check = (
        "start every node with the same --master_addr and --master_port: node 0's address as the other nodes "
        "reach it, and a port open between them"
    )
    if isinstance(error, torch.distributed.DistNetworkError):
        errno = re.search(r"errno: \d+ - ([^)]+)", cause)
        reason = errno[1] if errno else "no answer" if "timed out" in cause else cause
        return UserError(f"this process could not reach node 0 at {where} ({reason}): {check}")
    joined = re.search(r"(\d+)/(\d+) clients joined", cause)
    waited = (
        f"only {joined[1]} of {joined[2]} processes joined" if joined else f"the processes did not all join ({cause})"
    )
    return GroupIncomplete(f"{waited} node 0 at {where} within dist_timeout={config.dist_timeout} s: {check}")


def _master_port_given(config: Config) -> str:
    return str(config.master_port or os.environ.get("MASTER_PORT", "?"))


def explain_failure(failure: Exception, context: Any, config: Config, exchange: Path) -> BaseException:
    reports = WorkerReport.read_all(exchange)
    pids = context.pids()
    rerun = f"rerun with {resume_hint(config.run_name)} to continue from the last checkpoint"
    killed = [
        (index, process.exitcode) for index, process in enumerate(context.processes) if (process.exitcode or 0) < 0
    ]
    if killed and reports and all(report.kind == PeerLost.__name__ for report in reports):
        return died_by_signal(*killed[0], config)  # the others only lost it: its own death is the news (a silent
        # one's, by contrast, was the launcher's SIGKILL)
    first = reports[0] if reports else None
    if first is not None and first.kind == PeerSilent.__name__:
        offset = (config.node_rank or 0) * len(pids)
        silent = [
            f"rank {offset + index} (pid {pid})"
            for index, pid in enumerate(pids)
            if offset + index not in {report.rank for report in reports}
        ]
        who = ", ".join(silent) + " stopped answering" if silent else "a process on another node stopped answering"
        return PeerSilent(f"{first.message.replace(stopping.SILENT, who, 1)}; the others were stopped: {rerun}")
    if first is not None and first.kind == PeerLost.__name__:
        return PeerLost(f"{first.message}; the others were stopped: {rerun}")
    if first is not None:
        return first.error()
    if isinstance(failure, ProcessExitedException):
        if failure.signal_name:
            return died_by_signal(failure.error_index, -signal.Signals[failure.signal_name].value, config)
        return WorkerLost(
            f"worker process {failure.error_index} (local rank) exited with code {failure.exit_code}; the others "
            f"were stopped: {rerun}"
        )
    return failure  # a bug in a worker: its traceback is in the message


CRASH_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")  # a fatal error inside the process itself


def died_by_signal(index: int, exitcode: int, config: Config) -> WorkerLost:
    """A worker killed by a signal from outside (SIGKILL: the OOM killer, a user) may be resumed as it is; one that
    crashed (SIGABRT, SIGSEGV: a fatal error inside torch or a library, its own lines above on stderr) would meet
    the same cause again, so the advice says to mend it first."""
    name = signal.Signals(-exitcode).name
    if name in CRASH_SIGNALS:
        return WorkerLost(
            f"worker process {index} (local rank) crashed with {name}: a fatal error inside torch or a library, "
            "which its own lines above on stderr name (gloo's 'collective mismatch' is a bug, not a fault of the "
            "machine); the others were stopped. A resume would meet the same cause: once it is mended, continue "
            f"from the last checkpoint with {resume_hint(config.run_name)}"
        )
    return WorkerLost(
        f"worker process {index} (local rank) was killed by {name}; the others were stopped: rerun with "
        f"{resume_hint(config.run_name)} to continue from the last checkpoint"
    )

"""Outside stores never end a run (rank 0): a tracker (``trackers.Tracker``) reaches its store through ``Guarded``,
which makes every call that may go over the network in one background thread, in order, so training never waits
for a store.

A store that stops answering is one warning naming it; the training goes on and metrics.jsonl keeps every value.
The tracker keeps what it could not send, and the next flush at least ``RETRY_SECONDS`` later (or the seconds
``CIFAR10_DIST_TRACKER_RETRY_SECONDS`` gives) tries again; when
the store answers again one line says so. At the end the run's last sends (metrics, artifacts, status) get
``END_WAIT_SECONDS`` in all; what the store still lacks then is one warning and a note in summary.json
(``trackers``) that ``report`` shows.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from cifar10_dist.errors import Interrupted, Preempted, first_line
from cifar10_dist.outputs import files
from cifar10_dist.system.ranks import is_rank_zero

logger = logging.getLogger("cifar10_dist")

RETRY_VARIABLE = "CIFAR10_DIST_TRACKER_RETRY_SECONDS"  # sets RETRY_SECONDS (a store you know to be back sooner)
RETRY_SECONDS = 10.0  # a store that did not answer is tried again at the first flush this long after
END_WAIT_SECONDS = 30.0  # the longest the end of a run waits for a store


def retry_seconds() -> float:
    """RETRY_SECONDS, or the seconds ``CIFAR10_DIST_TRACKER_RETRY_SECONDS`` gives (a number >= 0; anything else is
    one warning and the default)."""
    given = os.environ.get(RETRY_VARIABLE)
    if given is None:
        return RETRY_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        logger.warning(
            "%s=%r is not a number of seconds >= 0: %.0f s between tries of a store",
            RETRY_VARIABLE,
            given,
            RETRY_SECONDS,
        )
        return RETRY_SECONDS
    return seconds


class Guarded:
    """A tracker whose sends run in a background thread; failures are warnings, never the run's end."""

    def __init__(self, tracker: Any, name: str, run_dir: Path) -> None:
        self.tracker, self.name, self.run_dir = tracker, name, run_dir
        self.enabled = bool(tracker.enabled) and is_rank_zero()
        self.jobs: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None
        self.error: str | None = None  # while the store does not answer: why, in one line
        self.failed_at = 0.0
        self.asked: list[str] = []  # the sends other than metrics (start, artifacts, end), in order
        self.delivered: set[str] = set()  # those that reached the store
        self.missed: list[str] = []  # those that did not, once the run has ended

    def __enter__(self) -> Guarded:
        self.flush(force=True)  # the tracker's first call (MLflow starts or continues its run), in the background
        return self

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        """The tracker's end: FINISHED, else KILLED for a stop by signal (a resume continues it), else FAILED."""
        status = (
            "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, (Interrupted, Preempted)) else "FAILED"
        )
        self.finish([("end", functools.partial(self.tracker.end, status))])

    def report_scalar(self, tag: str, value: float, step: int) -> None:
        self.tracker.report_scalar(tag, value, step)

    def flush(self, force: bool = False) -> None:
        """Send what the tracker keeps, in the background; skipped while a send is under way (the next flush
        takes what arrived meanwhile) and, unless ``force``, within RETRY_SECONDS of a failure."""
        if not self.enabled or self.jobs.unfinished_tasks:
            return
        if self.error is not None and not force and time.monotonic() - self.failed_at < retry_seconds():
            return
        self.send("metrics", self.tracker.flush)

    def send(self, what: str, action: Callable[[], Any]) -> None:
        """``action`` in the background thread, after everything sent before it."""
        if not self.enabled:
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name=f"cifar10_dist {self.name}", daemon=True)
            self.thread.start()
        if what != "metrics":
            self.asked.append(what)
        self.jobs.put((what, action))

    def _work(self) -> None:
        while True:
            what, action = self.jobs.get()
            try:
                if what != "metrics" and self.error is not None:  # after an outage: the missed metrics first;
                    self.tracker.flush()  # a store still silent fails here, and this send is missed
                action()
            except Exception as error:  # whatever the store's client raises: never the run's end
                self._failed(what, error)
            else:
                self._answered()
                self.delivered.add(what)
            finally:
                self.jobs.task_done()

    def _failed(self, what: str, error: BaseException) -> None:
        if self.error is None:
            logger.warning(
                "%s: the store at %s does not answer (%s): training goes on and metrics.jsonl keeps every "
                "value; the store gets what it missed when it answers again (tried every %.0f s and at the "
                "end of the run)",
                self.name,
                self.tracker.store,
                first_line(error),
                retry_seconds(),
            )
        self.error, self.failed_at = first_line(error), time.monotonic()

    def _answered(self) -> None:
        if self.error is not None:
            logger.info("%s: the store at %s answers again; what it missed is sent", self.name, self.tracker.store)
        self.error = None

    def finish(self, sends: list[tuple[str, Callable[[], Any]]]) -> None:
        """The run's last sends, then wait for them (END_WAIT_SECONDS at most); what the store still lacks is one
        warning and summary.json's ``trackers`` entry (when the run wrote one)."""
        if not self.enabled:
            return
        self.flush(force=True)
        for what, action in sends:
            self.send(what, action)
        deadline = time.monotonic() + END_WAIT_SECONDS
        while self.jobs.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.jobs.unfinished_tasks:  # a store that hangs: what is still queued or under way is missed
            self.error = self.error or f"no answer within {END_WAIT_SECONDS:.0f} s"
        self.missed = [what for what in self.asked if what not in self.delivered]
        note = self.note()
        if note is not None:
            logger.warning(
                "%s: the store at %s did not get %s: metrics.jsonl and the run folder have everything "
                "(summary.json: trackers)",
                self.name,
                self.tracker.store,
                describe_missing(note),
            )
            record_note(self.run_dir, self.name, note)

    def note(self) -> dict[str, Any] | None:
        """What the store lacks, or None when it got everything."""
        unsent = self.tracker.unsent()
        if not unsent and not self.missed:
            return None
        return {
            "store": str(self.tracker.store),
            "unsent_metrics": unsent,
            "missed": list(self.missed),
            "error": self.error or "unknown",
        }


def describe_missing(note: dict[str, Any]) -> str:
    """'12 metric values, artifacts, end' (from summary.json's note)."""
    parts = [f"{note['unsent_metrics']} metric values"] if note.get("unsent_metrics") else []
    parts += list(note.get("missed", []))
    return ", ".join(parts) or "nothing"


def record_note(run_dir: Path, name: str, note: dict[str, Any]) -> None:
    """summary.json's ``trackers`` entry for this tracker, when the run wrote summary.json."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    summary.setdefault("trackers", {})[name] = note
    files.write_json(path, summary)

"""The exceptions that end a run with a one-line message instead of a traceback, and their exit codes."""

EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3
EXIT_WORKER_LOST = 4
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on request after a checkpoint; rerun the same command to continue
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""

    exit_code = EXIT_USER_ERROR

    def _render_traceback_(self) -> list[str]:
        """IPython and Jupyter show this instead of a traceback: the one line."""
        return [f"{type(self).__name__}: {self}"]


class AlreadyReported(UserError):
    """Failures already reported line by line (e.g. image files that could not be read): exit 2, no further line."""


class TrainingDiverged(UserError):
    """The loss became NaN or infinite; the checkpoints on disk are from before it happened."""

    exit_code = EXIT_DIVERGED


class Preempted(UserError):
    """SIGTERM/SIGUSR1 arrived; every process agreed, a checkpoint was written and the run stopped."""

    exit_code = EXIT_PREEMPTED


class WorkerLost(UserError):
    """A spawned worker process died (killed, out of memory); the others were stopped."""

    exit_code = EXIT_WORKER_LOST


class PeerSilent(UserError):
    """A process stopped answering (hung, stopped, cut off): a collective got no reply within dist_timeout."""

    exit_code = EXIT_WORKER_LOST


class PeerLost(UserError):
    """A process's connection to another closed or was reset mid-run: that process ended (killed, its node down)."""

    exit_code = EXIT_WORKER_LOST


class GroupIncomplete(UserError):
    """The process group did not form: some processes never joined node 0 within dist_timeout (exit 4, as a lost
    worker: the processes that came are fine; nothing ran, so there is nothing to resume)."""

    exit_code = EXIT_WORKER_LOST


class OutputNotWritable(UserError):
    """A file of the run could not be written (disk full, quota exceeded, read-only folder); the files written
    before it are intact."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT, also Jupyter's "Interrupt kernel"): every process agreed, a checkpoint was written (its
    path in ``checkpoint``; None after a second Ctrl-C, which stops at once) and every worker has ended.
    A KeyboardInterrupt, so code that handles Ctrl-C handles it too."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


KINDS: dict[str, type[BaseException]] = {
    kind.__name__: kind
    for kind in (
        UserError,
        AlreadyReported,
        TrainingDiverged,
        Preempted,
        WorkerLost,
        PeerSilent,
        PeerLost,
        GroupIncomplete,
        OutputNotWritable,
        Interrupted,
    )
}


def first_line(error: BaseException, limit: int = 300) -> str:
    """An exception as one line: the first line of its message with white space folded (cut at ``limit``
    characters), or its type's name when it says nothing. Libraries' messages can run to pages."""
    lines = [" ".join(line.split()) for line in str(error).splitlines() if line.strip()]
    return lines[0][:limit] if lines else type(error).__name__


def resume_hint(run_name: str | None) -> str:
    """The flags that continue a run from its newest checkpoint (NAME where the run's name is not known)."""
    return f"--resume_from=auto --run_name={run_name or 'NAME'}"

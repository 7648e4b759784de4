"""The run folder: named, created and locked by rank 0 for the life of the run (one run per folder), what an
existing folder holds, the files written when a run starts, and its record files that trackers receive at the end."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Mapping

import ignite.distributed as idist

from cifar10_dist.errors import OutputNotWritable, UserError, resume_hint
from cifar10_dist.outputs import checkpoint_files, reading
from cifar10_dist.outputs.files import remove_stale_temporaries, write_json, write_yaml
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.system.ranks import from_rank_zero, on_rank_zero

logger = logging.getLogger("cifar10_dist")


RECORD_FILES = ("config.yaml", "provenance.json", "summary.json", "metrics.json", "curves.png")  # for trackers


def record_files(run_dir: Path) -> list[Path]:
    """The run's record files that a tracker receives at the end (those present), the mistakes pictures too."""
    names = (*RECORD_FILES, *sorted(path.name for path in run_dir.glob("mistakes*.png")))
    return [run_dir / name for name in names if (run_dir / name).is_file()]


def default_run_name(model: str, backend: str | None, world_size: int) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    model = model.rsplit(":", 1)[-1]  # a user model (module:factory, file.py:factory) by its factory's name
    return f"{model}_backend-{backend}-{world_size}_{stamp}"


LOCK_FILE = ".run.lock"  # held (flock) by rank 0 for the life of the run; the OS releases it when the holder dies
HOLDER_FILE = ".run.lock.json"  # who holds it: host, pid, start time


@contextlib.contextmanager
def claimed_run_dir(
    output_path: str, run_name: str | None, model: str, backend: str | None, resuming: bool, overwrite: bool
) -> Iterator[Path]:
    """The run folder, created and locked by rank 0 for as long as the run lasts; every rank gets its path.

    A folder in use by another run is refused (naming the holder); a folder that already holds a run is refused
    unless the run resumes (``resuming``) or ``overwrite`` moves the old folder aside (NAME.replaced-<time>).
    A file of the run that cannot be written ends it with one line saying how to continue.
    """
    held: list[Any] = []
    made: list[Path] = []

    def claim() -> list[str]:
        name = run_name or default_run_name(model, backend, idist.get_world_size())
        if not (Path(output_path) / name).exists():
            made.append(Path(output_path) / name)
        held.append(_claim(Path(output_path), name, resuming, overwrite))
        return [name, (Path(output_path) / name / HOLDER_FILE).read_text()]

    name, holder = from_rank_zero(claim)
    try:
        refuse_an_unshared_folder(Path(output_path) / name, holder)
        yield Path(output_path) / name
    except OutputNotWritable as error:
        raise OutputNotWritable(
            f"{error}: free space there (or make it writable) and continue with {resume_hint(name)}"
        ) from error
    except BaseException:
        for folder in made:
            _remove_if_only_locked(folder)  # a run refused before it wrote anything leaves no folder behind
        raise
    finally:
        for lock in held:
            if lock is not None:
                lock.release()


def _remove_if_only_locked(folder: Path) -> None:
    """The folder this run made, removed when it holds nothing but the lock's two files (rank 0, which made it)."""
    try:
        if {path.name for path in folder.iterdir()} <= {LOCK_FILE, HOLDER_FILE}:
            for name in (HOLDER_FILE, LOCK_FILE):
                (folder / name).unlink(missing_ok=True)
            folder.rmdir()
    except OSError:
        pass  # (left as it is: another process wrote there meanwhile, or the folder went away)


# how long a process looks for the run folder rank 0 made (a network filesystem's caches hide a new name for up to
# tens of seconds); CIFAR10_DIST_SHARED_FOLDER_WAIT sets it in seconds
SHARED_WAIT_VARIABLE, SHARED_WAIT_SECONDS = "CIFAR10_DIST_SHARED_FOLDER_WAIT", 30.0


def refuse_an_unshared_folder(folder: Path, holder: str) -> None:
    """Every process reads and writes the run folder (the checkpoints a resume loads, the best model): on several
    nodes it must be one shared folder. Each rank looks for the holder file rank 0 wrote there (waiting a little for
    a network filesystem to show it); where any does not see it, all stop with one line, before training."""
    if idist.get_world_size() == 1:
        return
    deadline = time.monotonic() + float(os.environ.get(SHARED_WAIT_VARIABLE, SHARED_WAIT_SECONDS))
    sees = _sees(folder, holder)
    while not sees and time.monotonic() < deadline:
        time.sleep(0.5)
        sees = _sees(folder, holder)
    seen = idist.all_gather(int(sees))
    blind = [rank for rank, flag in enumerate(list(seen)) if not flag]  # type: ignore[arg-type]  # (ints)
    if blind:
        hosts = idist.all_gather(platform.node())
        who = ", ".join(f"rank {rank} on {hosts[rank]}" for rank in blind)  # type: ignore[index]  # (names)
        raise UserError(
            f"output_path='{folder.parent}' is not one folder shared by every process: {who} cannot see "
            f"the run folder rank 0 made there ({folder / HOLDER_FILE}); every node reads and writes the "
            "run folder (checkpoints, the best model), so give them one shared folder (NFS, Lustre, a "
            f"cloud file share) as --output_path, and check it by listing {folder} from each node"
        )


def _sees(folder: Path, holder: str) -> bool:
    try:
        return (folder / HOLDER_FILE).read_text() == holder
    except OSError:
        return False


def _claim(output_path: Path, name: str, resuming: bool, overwrite: bool) -> Any:
    folder = output_path / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"output_path='{output_path}' is not writable: {error.strerror} ({error.filename})") from error
    lock = _lock(folder)
    existing = describe_existing_run(folder)
    if existing and not resuming:
        if not overwrite:
            _release(lock)
            raise UserError(
                f"run folder '{folder}' already holds a run ({existing}): continue it with --resume_from=auto, "
                f"choose another --run_name, or start afresh with --overwrite=True (the old folder is moved aside)"
            )
        aside = folder.with_name(f"{name}.replaced-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
        folder.rename(aside)
        logger.info("overwrite: the earlier run in %s was moved to %s", folder, aside)
        _release(lock)
        folder.mkdir()
        lock = _lock(folder)
    if existing and resuming:
        leftovers = remove_stale_temporaries(folder)
        if leftovers.removed:
            logger.info("removed what writes killed mid-way left in %s: %s", folder, ", ".join(leftovers.removed))
        if leftovers.left:
            logger.info(
                "left in %s, named like a temporary file but not one of this run's writes by its content: %s",
                folder,
                ", ".join(leftovers.left),
            )
    holder = {"host": platform.node(), "pid": os.getpid(), "started": datetime.now().isoformat(timespec="seconds")}
    write_json(folder / HOLDER_FILE, holder)
    return lock


def _lock(folder: Path) -> Any:
    """An exclusive flock on folder/.run.lock, or a UserError naming the run that holds it. Where the filesystem
    has no flock (Lustre mounted without -o flock), a warning and no lock."""
    from filelock import Timeout, UnixFileLock

    lock = UnixFileLock(str(folder / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout as busy:
        raise UserError(
            f"run folder '{folder}' is in use by another run ({_holder(folder)}): wait for it to end, "
            "or choose another --run_name"
        ) from busy
    except (NotImplementedError, OSError) as unsupported:
        logger.warning(
            "run folder %s cannot be locked on this filesystem (%s): nothing keeps a second run out",
            folder,
            unsupported,
        )
        return None
    return lock


def _release(lock: Any) -> None:
    if lock is not None:
        lock.release()


def _holder(folder: Path) -> str:
    try:
        holder = json.loads((folder / HOLDER_FILE).read_text())
        return f"host {holder['host']}, pid {holder['pid']}, started {holder['started']}"
    except (OSError, ValueError, KeyError):
        return "holder unknown"


def describe_existing_run(folder: Path) -> str | None:
    """What a run folder holds (checkpoints, the last epoch recorded), or None when it holds no run."""
    checkpoints = checkpoint_files.training_checkpoints(folder)  # newest first
    has_metrics = (folder / "metrics.jsonl").exists()
    if not (
        checkpoints or has_metrics or checkpoint_files.best_model_file(folder) or (folder / "config.yaml").exists()
    ):
        return None
    newest = f", the newest {checkpoints[0].name}" if checkpoints else ""
    parts = [f"{len(checkpoints)} training checkpoint(s){newest}"]
    epochs = reading.read_metrics(folder)[0] if has_metrics else []
    parts.append(f"last epoch recorded {epochs[-1]['epoch']}" if epochs else "no epoch recorded")
    if (folder / "summary.json").exists():
        parts.append("finished")
    return ", ".join(parts)


def write_run_start(
    run_dir: Path, config: Mapping[str, Any], provenance: Provenance, held_out_indices: list[int] | None
) -> None:
    """config.yaml, provenance.json and held_out_indices.json (when images are held out), on rank 0."""

    def write() -> None:
        write_yaml(run_dir / "config.yaml", config)
        write_json(run_dir / "provenance.json", provenance.to_dict())
        if held_out_indices is not None:
            write_json(run_dir / "held_out_indices.json", held_out_indices)

    on_rank_zero(write)

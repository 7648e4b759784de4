"""Writing a run's files atomically (a temporary name in the same folder, then a rename): a file is complete or
absent, and a full disk or a read-only folder is one line (``errors.OutputNotWritable``, from ``writing``)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import yaml

from cifar10_dist.errors import OutputNotWritable, UserError

# What a process killed mid-write leaves behind, and how a resume knows it wrote it (by name and by content, never
# by name alone: a user's own tmp_results or .notes.tmp1 stays). Ours: ``write_file``'s temporary, whose name carries
# this package's marker. Ignite's atomic DiskSaver's: ``tempfile``'s name (``tmp`` + 8 of [a-z0-9_]) holding the
# start of a torch.save file (a zip archive).
OUR_TEMPORARY = re.compile(r"^\..+\.partial-cifar10-dist-\d+$")
IGNITE_TEMPORARY = re.compile(r"^tmp[a-z0-9_]{8}$")
ZIP_HEADER = b"PK\x03\x04"
# names that look like a temporary but are not known to be one by their content (older releases' ``.NAME.tmpPID``
# among them): left where they are, and said
LOOKALIKE = re.compile(r"^(\..+\.tmp\d+|tmp[a-z0-9_]{8})$")

# errno values that mean "this file cannot be written here" rather than a bug
UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}


def make_folder(folder: Path, name: str = "output_dir") -> None:
    """The folder, made where missing; one line naming ``name`` when it cannot be (before any work starts)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{name}='{folder}' is not writable ({error.strerror})") from error


def write_file(path: Path, content: str | bytes | Callable[[Path], None]) -> None:
    """Write a file atomically (a temporary name in the same folder, then a rename): the final name is complete
    or absent. A full disk or a read-only folder ends the run with one line (``errors.OutputNotWritable``) and
    leaves no temporary file. ``content`` may be a function that writes to the path it is given."""
    temporary = path.with_name(f".{path.name}.partial-cifar10-dist-{os.getpid()}")  # OUR_TEMPORARY
    with writing(path):
        try:
            if callable(content):
                content(temporary)
            elif isinstance(content, bytes):
                temporary.write_bytes(content)
            else:
                temporary.write_text(content)
            temporary.replace(path)
        finally:
            temporary.unlink(missing_ok=True)


def write_json(path: Path, content: Any) -> None:
    write_file(path, json.dumps(content, indent=2) + "\n")


def write_yaml(path: Path, content: Mapping[str, Any]) -> None:
    write_file(path, yaml.safe_dump(dict(content), sort_keys=False))


def written_partially(path: Path) -> bool:
    """Whether ``path`` is what a write of this package's or Ignite's left when killed mid-way (``OUR_TEMPORARY``,
    ``IGNITE_TEMPORARY`` holding a zip archive's start)."""
    if not path.is_file() or path.is_symlink():
        return False
    if OUR_TEMPORARY.match(path.name):
        return True
    if not IGNITE_TEMPORARY.match(path.name):
        return False
    try:
        with path.open("rb") as file:
            return file.read(len(ZIP_HEADER)) == ZIP_HEADER
    except OSError:
        return False


@dataclass(frozen=True)
class Leftovers:
    """What a look for killed writes' partial files found: what it removed (with sizes) and what it left, files
    whose name looks like a temporary but whose content does not say it is one."""

    removed: list[str]
    left: list[str]


def remove_stale_temporaries(folder: Path) -> Leftovers:
    """Remove the partial files that writes killed mid-way left in ``folder`` (``written_partially``: by name and
    content, never another file). Only for a folder no other process writes to (a run folder its run holds
    locked)."""
    removed, left = [], []
    for path in sorted(folder.iterdir()):
        if written_partially(path):
            size = path.stat().st_size
            path.unlink(missing_ok=True)
            removed.append(f"{path.name} ({size} bytes)")
        elif LOOKALIKE.match(path.name):
            left.append(path.name)
    return Leftovers(removed, left)


def unwritable_cause(error: BaseException | None) -> OSError | None:
    """The OSError (disk full, quota, read-only, ...) behind an exception, following its causes and contexts:
    torch.save, for one, reports a full disk as a RuntimeError whose context is the OSError."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in UNWRITABLE:
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def free_space(folder: Path) -> str:
    """Free space on the filesystem holding folder (or its nearest existing parent), e.g. '1.2 MiB'."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = float(shutil.disk_usage(folder).free)
    except OSError:
        return "unknown space"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if free < 1024 or unit == "GiB":
            return f"{free:.0f} {unit}" if unit == "bytes" else f"{free:.1f} {unit}"
        free /= 1024
    return f"{free:.1f} TiB"


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a failure to write ``path`` (full disk, quota, read-only folder) into OutputNotWritable: one line
    naming the file, its folder and the space left there."""
    try:
        yield
    except OutputNotWritable:
        raise
    except Exception as error:
        cause = unwritable_cause(error)
        if cause is None:
            raise
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        raise OutputNotWritable(
            f"cannot write {path.name} in {path.parent}: {reason} ({free_space(path.parent)} free there); "
            "the files written before it are intact"
        ) from error


def sqlite_lock(url: str) -> contextlib.AbstractContextManager:
    """For a SQLite URL: a lock file next to the database, held while a process creates (or checks) its tables,
    so that processes starting at the same instant do not create them twice ("table ... already exists"); a
    no-op for a database server, which serialises that itself."""
    if not url.startswith("sqlite:///"):
        return contextlib.nullcontext()
    from filelock import FileLock

    database = Path(url[len("sqlite:///") :])
    database.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(f"{database}.lock", timeout=120)

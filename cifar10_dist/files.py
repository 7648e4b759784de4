"""Writing a run's files atomically (a temporary name in the same folder, then a rename): a file is complete or
absent, and a full disk or a read-only folder is one line (``errors.OutputNotWritable``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from cifar10_dist import faults


def write_file(path: Path, content: str | bytes | Callable[[Path], None]) -> None:
    """Write a file atomically (a temporary name in the same folder, then a rename): the final name is complete
    or absent. A full disk or a read-only folder ends the run with one line (``errors.OutputNotWritable``) and
    leaves no temporary file. ``content`` may be a function that writes to the path it is given."""
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with faults.writing(path):
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

"""What the W&B sessions of a run folder recorded, read from their transaction logs (``wandb/*run-*-ID/run-ID.wandb``,
written by W&B online and offline alike): LevelDB's log format of W&B's own protobuf records. W&B's Python reader of
these files (``wandb.sdk.internal.datastore``) left the package when its core moved to Go, so the format is read here
with W&B's record definitions (``wandb.proto``). A resume uses it to send no metric step twice."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

HEADER = 7  # ":W&B", a magic number and a version
BLOCK = 32768  # LevelDB log blocks; a record's pieces: FULL (1), or FIRST (2), MIDDLE (3), LAST (4)
OWN_KEYS = {"step", "_step", "_runtime", "_timestamp"}  # the step axis and W&B's own columns


def records(path: Path) -> list[Any]:
    """Every whole record of one .wandb file (a file cut short by a killed process: those before the cut)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        return []
    found, position, pieces = [], HEADER, b""
    while position + 7 <= len(data):
        left = BLOCK - position % BLOCK
        _, length, kind = struct.unpack("<IHB", data[position : position + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length, kind) == (0, 0):  # the rest of a block is padding
            position += left
            continue
        if position + 7 + length > len(data):
            break
        pieces += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # (generated protobuf)
            record.ParseFromString(pieces)
            found.append(record)
            pieces = b""
    return found


def session_files(run_dir: Path, run_id: str) -> list[Path]:
    """The transaction logs of the run folder's W&B sessions of run ``run_id``, oldest first."""
    return sorted(run_dir.glob(f"wandb/*run-*-{run_id}/run-{run_id}.wandb"))


def history_rows(path: Path) -> list[dict[str, Any]]:
    """The metric rows (``run.log`` calls) of one transaction log, as logged."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def last_steps(run_dir: Path, run_id: str) -> dict[str, int]:
    """Each metric's last step (our ``step`` axis) in what the run folder's W&B sessions of ``run_id`` recorded."""
    last: dict[str, int] = {}
    for path in session_files(run_dir, run_id):
        for row in history_rows(path):
            for key in row.keys() - OWN_KEYS:
                last[key] = max(last.get(key, -1), int(row.get("step", -1)))
    return last

"""What a resume keeps and what it tidies (issue 73): config.yaml is a recipe for a new run, so a resumed run's
replays from the start; a resume that changes a key which shapes training is refused in one line with advice that
works, and the keys that may change are said in the log; the partial files of writes killed mid-way are removed
(their names alone); and every seed draws its own epoch orders, while a run begun with the older order keeps it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from cifar10_dist.config import FIELDS, MAY_CHANGE_ON_RESUME
from cifar10_dist.data.loaders import LEGACY_ORDER, MIXED_ORDER, ResumableSampler
from tests.conftest import LONG, REPO, assert_same_training_state, run_in_this_process

FINAL = "training_checkpoint_72.pt"


@pytest.fixture()
def reference_copy(long_reference, tmp_path) -> Path:
    """A copy of the LONG reference run (checkpoints 50, mid-epoch 3, and 72, the end) to change as a user would."""
    copy = tmp_path / "reference"
    shutil.copytree(long_reference, copy, ignore=shutil.ignore_patterns(".run.lock*"))
    return copy


def test_a_resumed_runs_config_yaml_replays_the_run_from_the_start(reference_copy, small_dataset, tmp_path):
    common = [*LONG, f"--data_path={small_dataset}", f"--output_path={tmp_path}"]
    continued = run_in_this_process(
        "run", *common, "--run_name=continued", f"--resume_from={reference_copy / 'training_checkpoint_50.pt'}"
    )
    assert continued.returncode == 0, continued.stderr[-3000:]
    (reference_copy / "training_checkpoint_50.pt").unlink()  # pruned, as a run's later checkpoints prune it

    replay = run_in_this_process("run", f"--config={tmp_path / 'continued' / 'config.yaml'}", "--run_name=replay")
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert "Resumed from" not in (tmp_path / "replay" / "run.log").read_text()
    assert_same_training_state(reference_copy / FINAL, tmp_path / "replay" / FINAL)
    provenance = json.loads((tmp_path / "continued" / "provenance.json").read_text())
    assert provenance["resumed_from"] == str(reference_copy / "training_checkpoint_50.pt")
    assert provenance["shuffle"] == MIXED_ORDER


def edit(config_yaml: Path, **changes: object) -> None:
    values = yaml.safe_load(config_yaml.read_text())
    config_yaml.write_text(yaml.safe_dump({**values, **changes}, sort_keys=False))


def test_a_resume_that_changes_what_shapes_training_is_refused_in_one_line_and_writes_nothing(reference_copy, tmp_path):
    config_yaml = reference_copy / "config.yaml"
    edit(config_yaml, learning_rate=0.05, num_epochs=6)
    before = {path.name: path.read_bytes() for path in reference_copy.iterdir()}  # the lock's files too
    result = run_in_this_process("run", f"--config={config_yaml}", f"--output_path={tmp_path}", "--resume_from=auto")
    newest = reference_copy / FINAL
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"error: checkpoint '{newest}' was trained with other values of keys that shape training (learning_rate 0.1 "
        "then, 0.05 now, num_epochs 4 then, 6 now): a resume continues the same run; resume with the checkpoint's "
        f"values (--learning_rate=0.1 --num_epochs=4), or train a new run from its weights (--pretrained={newest} "
        "with another --run_name and no --resume_from: its optimizer state, warm-up and learning-rate schedule start "
        "again)"
    )
    after = {path.name: path.read_bytes() for path in reference_copy.iterdir()}
    assert after == before
    into_another = run_in_this_process(
        "run", f"--config={config_yaml}", f"--output_path={tmp_path}", "--run_name=another", f"--resume_from={newest}"
    )
    assert into_another.returncode == 2 and "keys that shape training" in into_another.stderr
    assert not (tmp_path / "another").exists()  # no folder holding only the lock's files

    advised = run_in_this_process(
        "run",
        f"--config={config_yaml}",
        f"--output_path={tmp_path}",
        "--resume_from=auto",
        "--learning_rate=0.1",
        "--num_epochs=4",
    )
    assert advised.returncode == 0, advised.stderr[-2000:]


def test_a_resume_may_change_how_a_run_is_kept_and_says_so(reference_copy, tmp_path):
    edit(reference_copy / "config.yaml", checkpoint_every=9, log_every_iters=3)
    result = run_in_this_process(
        "run", f"--config={reference_copy / 'config.yaml'}", f"--output_path={tmp_path}", "--resume_from=auto"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "resuming with keys changed that may change on a resume: checkpoint_every 9 (was 25), log_every_iters 3 (was 5)"
    ) in (reference_copy / "run.log").read_text()


def test_a_key_that_takes_effect_only_with_another_is_not_compared_without_it(reference_copy, tmp_path):
    """powersgd_rank and powersgd_start_step shape nothing without grad_compression=powersgd: a run without
    compression resumes with other values (the rank's default went from 2 to 32, and older checkpoints hold 2)."""
    result = run_in_this_process(
        "run",
        f"--config={reference_copy / 'config.yaml'}",
        f"--output_path={tmp_path}",
        "--resume_from=auto",
        "--powersgd_rank=2",
        "--powersgd_start_step=20",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in (reference_copy / "run.log").read_text().splitlines() if "resuming with keys" in line]
    assert not any("powersgd" in line for line in said), said


def test_the_docs_list_the_keys_a_resume_may_change():
    page = (REPO / "docs" / "fault-tolerance.md").read_text()
    line = next(line for line in page.splitlines() if line.startswith("Keys a resume may change:"))
    listed = re.findall(r"`(\w+)`", line)
    assert listed == [key for key in MAY_CHANGE_ON_RESUME if not FIELDS[key].metadata["internal"]]


def test_a_resume_removes_the_partial_files_of_killed_writes_and_nothing_else(reference_copy, tmp_path):
    """Recognised by name and content: Ignite's DiskSaver's holds a zip archive's start (torch.save's format), ours
    carries the package's marker in its name. A user's files named alike stay, and the log says so."""
    partial = {"tmpab_c1d2e": b"PK\x03\x04" + bytes(1000), ".config.yaml.partial-cifar10-dist-4242": b"seed:"}
    kept = {
        "tmp_notes.txt": b"mine",
        "tmpabcdefgh.pt": b"mine too",
        "tmp_results": b"accuracy 0.93\n",  # tempfile's shape of name: tmp + 8 of [a-z0-9_]
        "tmp_scratch": b"",
        ".notes.tmp1": b"an editor's",  # the shape of this package's temporaries before they carried its marker
    }
    for name, content in {**partial, **kept}.items():
        (reference_copy / name).write_bytes(content)
    result = run_in_this_process(
        "run", f"--config={reference_copy / 'config.yaml'}", f"--output_path={tmp_path}", "--resume_from=auto"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"removed what writes killed mid-way left in {reference_copy}: "
        ".config.yaml.partial-cifar10-dist-4242 (5 bytes), tmpab_c1d2e (1004 bytes)"
    ) in result.stderr
    assert (
        f"left in {reference_copy}, named like a temporary file but not one of this run's writes by its content: "
        ".notes.tmp1, tmp_results, tmp_scratch"
    ) in result.stderr
    assert not any((reference_copy / name).exists() for name in partial)
    assert all((reference_copy / name).read_bytes() == content for name, content in kept.items())


def epoch_order(seed: int, epoch: int, order: str) -> list[int]:
    sampler = ResumableSampler(list(range(100)), num_replicas=1, rank=0, seed=seed)
    sampler.order = order
    sampler.set_epoch(epoch)
    return list(sampler)


def test_seeds_draw_epoch_orders_of_their_own_where_seed_plus_epoch_shared_them():
    for seed in range(3):
        for epoch in range(1, 4):
            assert epoch_order(seed, epoch, LEGACY_ORDER) == epoch_order(seed + 1, epoch - 1, LEGACY_ORDER)
            assert epoch_order(seed, epoch, MIXED_ORDER) != epoch_order(seed + 1, epoch - 1, MIXED_ORDER)
    orders = {tuple(epoch_order(seed, epoch, MIXED_ORDER)) for seed in range(5) for epoch in range(5)}
    assert len(orders) == 25


def test_the_older_order_is_distributed_samplers_own():
    legacy = torch.utils.data.DistributedSampler(list(range(101)), num_replicas=2, rank=1, seed=7, drop_last=True)
    ours = ResumableSampler(list(range(101)), num_replicas=2, rank=1, seed=7)
    ours.order = LEGACY_ORDER
    for epoch in range(3):
        legacy.set_epoch(epoch)
        ours.set_epoch(epoch)
        assert list(ours) == list(legacy)

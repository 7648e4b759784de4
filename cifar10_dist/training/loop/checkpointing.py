"""Checkpoints: periodic training state, best models by validation accuracy, resume, and safe run_data.

What the files hold is ``checkpoint_layout``'s. Files are written to a temporary name and
renamed (Ignite's DiskSaver with atomic=True), an old file is removed only after its successor is complete
(``KeepUntilSaved``), and files are always loaded with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import ignite.distributed as idist
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, DiskSaver, global_step_from_engine
from ignite.handlers.checkpoint import BaseSaveHandler

from cifar10_dist import checkpoint_layout, models
from cifar10_dist.config import MAY_CHANGE_ON_RESUME, Config, takes_effect
from cifar10_dist.data import cifar, loaders, run_data
from cifar10_dist.errors import UserError, first_line
from cifar10_dist.models import restoring
from cifar10_dist.outputs import files, provenance
from cifar10_dist.outputs.checkpoint_files import BEST_PATTERN, TRAINING_PATTERN, existing_checkpoints, load_checkpoint
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.system import ranks
from cifar10_dist.training.loop.background_writes import BackgroundWrites

logger = logging.getLogger(__name__)

TRAINING_PREFIX = "training"
WHERE_A_RUN_IS = ("output_path", "run_name", "resume_from", "overwrite")  # differ on a resume into another folder


class KeepUntilSaved(BaseSaveHandler):
    """Ignite's Checkpoint removes the oldest file before it writes the new one; this saver removes it only
    after the new one is complete, so a full disk or a kill mid-write never costs an earlier checkpoint.
    A write that fails for lack of space or permission ends the run with one line (``files.writing``)."""

    def __init__(self, saver: BaseSaveHandler, folder: Path) -> None:
        self.saver, self.folder = saver, folder
        self.pending_removals: list[str] = []

    def __call__(self, checkpoint: Mapping, filename: str, metadata: Mapping | None = None) -> None:
        before = set(os.listdir(self.folder))
        try:
            with files.writing(self.folder / filename):
                self.saver(checkpoint, filename, metadata)
        except BaseException:
            # DiskSaver's temporary file survives a full disk (its cleanup flushes, fails again and skips the removal):
            # one of tempfile's names that appeared during this write, empty or not
            for name in set(os.listdir(self.folder)) - before:
                if files.IGNITE_TEMPORARY.match(name):
                    (self.folder / name).unlink(missing_ok=True)
            raise
        for old in self.pending_removals:
            if old != filename:
                self.saver.remove(old)
        self.pending_removals.clear()

    def remove(self, filename: str) -> None:
        self.pending_removals.append(filename)


def _saver(run_dir: Path, saver: BaseSaveHandler | None) -> KeepUntilSaved:
    return KeepUntilSaved(saver or DiskSaver(run_dir, require_empty=False, atomic=True), run_dir)


def create_training_checkpoint(
    to_save: Mapping[str, Any], run_dir: Path, saver: DiskSaver | None = None, in_background: bool = False
) -> Checkpoint:
    """A handler saving ``to_save`` as training_checkpoint_<iteration>.pt, keeping the newest 2 in run_dir.

    Checkpoints already in run_dir (from before a resume) count towards the 2 and get pruned too.
    ``saver`` (default: an atomic DiskSaver on run_dir) may be a ClearMLSaver on the same folder.
    ``in_background`` (``checkpoint_in_background``): plain files are written by ``BackgroundWrites``; a
    tracker's saver (ClearML's hooks on torch.save are process-wide) and XLA's (every process saves together)
    write inline.
    """
    writes: BaseSaveHandler = _saver(run_dir, saver)
    if in_background and saver is None and not idist.has_xla_support:
        writes = BackgroundWrites(writes)
    handler = Checkpoint(
        to_save,
        writes,
        filename_prefix=TRAINING_PREFIX,
        n_saved=2,
        global_step_transform=lambda engine, _: engine.state.iteration,
    )
    handler.load_state_dict({"_saved": existing_checkpoints(run_dir, TRAINING_PATTERN, lambda m: int(m.group(1)))})
    return handler


def written(handler: Checkpoint) -> None:
    """Until the training checkpoints that ``handler`` saved are on disk (at once when written inline)."""
    if isinstance(handler.save_handler, BackgroundWrites):
        handler.save_handler.wait()


def saved_and_written(save: Callable[[Engine], None], handler: Checkpoint) -> Callable[[Engine], None]:
    """``save`` (``handler``, or a wrapper of it), returning once the file is on disk: for a stop's checkpoint."""

    def save_and_wait(engine: Engine) -> None:
        save(engine)
        written(handler)

    return save_and_wait


def attach_training_checkpoints(
    trainer: Engine, save: Callable[[Engine], None], every_iterations: int, handler: Checkpoint
) -> None:
    """Save every N iterations and when training completes (``save``: ``handler``, or a wrapper of it), the last
    one on disk before training completes. Written in the background: a failed write is raised at the next
    iteration, and an epoch's end waits for the write in flight (its evaluation may write a best-model file: the
    two never write into the folder at once)."""
    writes = handler.save_handler
    if isinstance(writes, BackgroundWrites):
        trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda _: writes.raise_if_failed())  # before a save
        trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda _: writes.wait())
    trainer.add_event_handler(Events.ITERATION_COMPLETED(every=every_iterations), save)
    trainer.add_event_handler(Events.COMPLETED, saved_and_written(save, handler))


def attach_best_model_checkpoints(
    evaluator: Engine,
    trainer: Engine,
    to_save: Mapping[str, Any],
    run_dir: Path,
    split: str,
    saver: DiskSaver | None = None,
    metric: str = "accuracy",
) -> Checkpoint:
    """After each evaluation on ``split`` (val or test) keep the 2 models with the highest ``metric`` there."""
    handler = Checkpoint(
        to_save,
        _saver(run_dir, saver),
        filename_pattern="best_model_{global_step}_{score_name}={score}.{ext}",
        n_saved=2,
        score_function=Checkpoint.get_default_score_fn(metric),
        score_name=f"{split}_{metric}",
        global_step_transform=global_step_from_engine(trainer),
    )
    handler.load_state_dict({"_saved": existing_checkpoints(run_dir, BEST_PATTERN, lambda m: float(m.group(2)))})
    evaluator.add_event_handler(Events.COMPLETED, handler)
    return handler


@dataclass(frozen=True)
class Resumed:
    """Where a run continued from: the checkpoint, its iteration, and the world size and global batch (images
    per optimizer step over all processes) it was written at (None in files that do not record them), and its
    epochs' length, which the trainer keeps."""

    path: str
    iteration: int
    world_size: int | None
    batch_size: int | None
    epoch_length: int | None


def resume(to_load: Mapping[str, Any], path: str | Path, config: Config | None = None) -> Resumed:
    """Restore every object in ``to_load`` from a training checkpoint. A checkpoint that does not fit this run
    (another model, optimizer or number of param groups) is one line naming what it records against what this
    run builds."""
    checkpoint = load_checkpoint(path)
    missing = checkpoint_layout.missing_training_keys(checkpoint, to_load)
    if missing:
        raise UserError(
            f"checkpoint '{path}' is not a training checkpoint: missing {', '.join(missing)} "
            f"(found {', '.join(sorted(checkpoint)) or 'nothing'})"
        )
    restoring.check_recorded_model(checkpoint, config.model if config is not None else None, path)
    restoring.check_fits(
        models.unwrap(to_load[checkpoint_layout.MODEL]).state_dict(), checkpoint_layout.model_weights(checkpoint), path
    )
    check_optimizer_fits(
        to_load[checkpoint_layout.OPTIMIZER].state_dict(), checkpoint[checkpoint_layout.OPTIMIZER], path
    )
    try:
        Checkpoint.load_objects(to_load=checkpoint_layout.restorable(to_load, checkpoint), checkpoint=checkpoint)
    except (RuntimeError, KeyError, ValueError, TypeError) as error:
        raise UserError(f"checkpoint '{path}' does not match this run: {first_line(error)}") from error
    iteration = checkpoint_layout.iteration(checkpoint)
    logger.info("Resumed from %s at iteration %d", path, iteration)
    recorded = checkpoint_layout.recorded_config(checkpoint)
    return Resumed(
        str(path),
        iteration,
        checkpoint_layout.recorded_world_size(checkpoint),
        recorded.batch_size if recorded is not None else None,
        checkpoint_layout.epoch_length(checkpoint),
    )


def end_of_training(config: Config, epoch_length: int | None, data_setup: run_data.DataSetup) -> int:
    """The iteration training ends at, in the trainer's epochs (``epoch_length``: theirs, as a checkpoint's run
    counted them and Ignite keeps them on resume; None: the loader's, as a fresh run counts them)."""
    return config.num_epochs * (epoch_length or data_setup.iterations_per_epoch)


def resume_if_asked(to_load: Mapping[str, Any], path: str | Path | None, config: Config) -> Resumed | None:
    """``resume`` from path, when there is one (a fresh run otherwise: None)."""
    return resume(to_load, path, config) if path is not None else None


def check_optimizer_fits(expected: Mapping[str, Any], found: Mapping[str, Any], path: str | Path) -> None:
    """Param groups and their sizes (as ``bias_lr_scale`` and the model decide them) must be the same."""
    sizes = [[len(group["params"]) for group in state.get("param_groups", [])] for state in (found, expected)]
    if sizes[0] != sizes[1]:
        raise UserError(
            f"checkpoint '{path}' holds an optimizer with param groups of {sizes[0]} tensors, and this run "
            f"builds {sizes[1]}: resume with the settings it was made with (its run folder's config.yaml)"
        )


def checked_resume_path(path: str | None, config: Config, record: Provenance) -> str | None:
    """The checkpoint the run continues from (``setup.resumption``), refused in one line when it was made with
    other data (the checksum it records against this run's) unless ``resume_on_changed_data``: then one warning,
    and ``record`` (this run's provenance) keeps what changed."""
    if path is not None:
        refuse_other_classes(path, record)
        refuse_changed_training(path, config)
    change = ranks.from_rank_zero(data_change, path, record) if path is not None else None
    if change is None:
        return path
    difference = (
        f"checkpoint '{path}' was made with other data: sha256 {change.sha256_then[:12]}... then, "
        f"{change.sha256_now[:12]}... now; images then {_counts(change.images_then)}, now {_counts(change.images_now)}"
    )
    if not config.resume_on_changed_data:
        raise UserError(
            f"{difference}: resuming would not continue the same run (another epoch length, another "
            "shuffle); resume on the data it was made with, start afresh (another --run_name, or "
            "--overwrite), or give --resume_on_changed_data=True to go on anyway (recorded in provenance)"
        )
    ranks.on_rank_zero(
        logger.warning,
        "%s: going on as asked (resume_on_changed_data); this is no longer the same "
        "run (recorded in provenance.json: resumed_on_changed_data)",
        difference,
    )
    record.resumed_on_changed_data = change
    return path


def continue_order(path: str | None, data_setup: run_data.DataSetup) -> None:
    """A resumed run draws its epochs' orders the way it began (its checkpoint's provenance says which; a
    checkpoint of a release before it did drew them from seed + epoch); this run's provenance records it."""
    if path is None:
        return
    recorded = ranks.from_rank_zero(lambda: provenance.of_checkpoint(load_checkpoint(path, mmap=True)).shuffle)
    data_setup.provenance.shuffle = recorded or loaders.LEGACY_ORDER
    loaders.keep_order(data_setup.loaders.train, data_setup.provenance.shuffle)


def _recorded_settings(path: str) -> tuple[dict[str, Any] | None, list[str]]:
    """A checkpoint's recorded config as the run records it (``Config.replayable``, JSON-able for the other
    ranks) and the keys the file has (an older release's lacks the keys added since: none of those is compared)."""
    checkpoint = load_checkpoint(path, mmap=True)
    recorded = checkpoint_layout.recorded_config(checkpoint)
    return (
        recorded.replayable() if recorded is not None else None,
        sorted(checkpoint_layout.recorded_keys(checkpoint)),
    )


def refuse_changed_training(path: str, config: Config) -> None:
    """One line, before anything of the run folder is written, when a resume gives a key that shapes training
    another value than the checkpoint's run had (its meta's config against this run's settled one): the run would
    no longer be the one it continues. The keys that may change (``MAY_CHANGE_ON_RESUME``: how the run is launched,
    kept, logged or made fast) are said in the log when they do. The model is ``restoring``'s to check."""
    then, keys = ranks.from_rank_zero(_recorded_settings, path)
    if then is None or then["model"] != config.model:
        return  # nothing recorded, or another model altogether: restoring says so, naming both
    present = config.replayable()
    changed = {
        key: (then[key], value)
        for key, value in present.items()
        if key in keys
        and key != "model"
        and then[key] not in ("auto", "find")
        and then[key] != value
        and takes_effect(key, then)  # (where it took effect then: a change of the key it needs is refused too)
    }
    shaping = [key for key in changed if key not in MAY_CHANGE_ON_RESUME]
    if shaping:
        shown = ", ".join(
            f"{key} {_flag_value(changed[key][0])} then, {_flag_value(changed[key][1])} now" for key in shaping
        )
        restore = " ".join(f"--{key}={_flag_value(changed[key][0])}" for key in shaping)
        raise UserError(
            f"checkpoint '{path}' was trained with other values of keys that shape training ({shown}): "
            f"a resume continues the same run; resume with the checkpoint's values ({restore}), or "
            f"train a new run from its weights (--pretrained={path} with another --run_name and no "
            "--resume_from: its optimizer state, warm-up and learning-rate schedule start again)"
        )
    said = {key: pair for key, pair in changed.items() if key not in WHERE_A_RUN_IS}
    if said:
        ranks.on_rank_zero(
            logger.info,
            "resuming with keys changed that may change on a resume: %s",
            ", ".join(f"{key} {_flag_value(now)} (was {_flag_value(then)})" for key, (then, now) in said.items()),
        )


def _flag_value(value: Any) -> str:
    """A value as a flag takes it: JSON for a mapping, None, and the rest as written."""
    return json.dumps(value) if isinstance(value, dict) else str(value)


def refuse_other_classes(path: str, record: Provenance) -> None:
    """One line, before anything of the run folder is written, when the checkpoint's classes are not this run's
    (a class folder added or removed): its model's head cannot take them, whatever resume_on_changed_data says."""
    now = record.dataset.classes
    then = ranks.from_rank_zero(lambda: cifar.checkpoint_info(load_checkpoint(path, mmap=True)).classes)
    if now is None or then is None or list(then) == list(now):
        return
    removed, added = [name for name in then if name not in now], [name for name in now if name not in then]
    changes = "; ".join(
        part
        for part in (f"removed: {', '.join(removed)}" if removed else "", f"added: {', '.join(added)}" if added else "")
        if part
    )
    raise UserError(
        f"checkpoint '{path}' was trained on {len(then)} classes and the data now has {len(now)} "
        f"({changes or 'the same names in another order'}): its model cannot continue on other classes, "
        "even with resume_on_changed_data; restore the class folders, or start afresh (another "
        "--run_name, or --overwrite; --pretrained=<checkpoint> starts from its weights with a new head)"
    )


def data_change(path: str, record: Provenance) -> provenance.DataChange | None:
    """What differs between the data a checkpoint records and this run's (rank 0: it holds the checksum); None
    when the checksums agree or either is unknown (a file from before they were recorded)."""
    recorded = provenance.of_checkpoint(load_checkpoint(path, mmap=True)).dataset  # its meta only
    then, now = recorded.sha256, record.dataset.sha256
    if then is None or now is None or then == now:
        return None
    return provenance.DataChange(str(path), then, now, recorded.images, record.dataset.images)


def _counts(images: Mapping[str, int] | None) -> str:
    return ", ".join(f"{split} {count}" for split, count in images.items()) if images else "not recorded"

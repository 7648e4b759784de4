"""A resume at another world size: one line saying what the rest of the run sees (the rest of the epoch, or of
the pass over the data, exactly the images an uninterrupted run would, or not; only an evaluation, where training
was finished), and a ``resume`` line in metrics.jsonl (summary.json lists them)."""

from __future__ import annotations

import logging

import ignite.distributed as idist

from cifar10_dist.config import Config
from cifar10_dist.data import loaders, run_data
from cifar10_dist.outputs import scalars
from cifar10_dist.system import ranks
from cifar10_dist.training.loop.checkpointing import Resumed, end_of_training

logger = logging.getLogger("cifar10_dist")


def note_world_size_change(
    resumed: Resumed | None, config: Config, data_setup: run_data.DataSetup, recorder: scalars.Recorder
) -> None:
    """Resuming at another world size: one line saying what follows (a warning, or where training was finished an
    info line), and a ``resume`` line in metrics.jsonl (summary.json lists them). The shuffle of an epoch depends on
    (seed, epoch) alone and each process takes every W-th image of it, so with the same images per step the rest of
    the pass over the data (the epoch, unless epoch_length is set) is exactly the images an uninterrupted run would
    still see; the result differs all the same (augmentation is drawn per process, BatchNorm statistics are per
    process, sums are taken in another order)."""
    now = idist.get_world_size()
    if resumed is None or resumed.world_size is None or resumed.world_size == now:
        return
    before = resumed.world_size
    per_step_before = (resumed.batch_size // before) * before if resumed.batch_size else None
    same_images = per_step_before == data_setup.images_per_iteration
    per_epoch = resumed.epoch_length or data_setup.iterations_per_epoch  # (the checkpoint's epochs go on)
    epoch = resumed.iteration // per_epoch + 1
    if resumed.iteration >= end_of_training(config, resumed.epoch_length, data_setup):
        epoch -= 1
        ranks.on_rank_zero(
            logger.info,
            "resuming at world size %d a run that finished training at world size %d (iteration %d, epoch %d): "
            "this run only evaluates, which gives the same numbers at any world size",
            now,
            before,
            resumed.iteration,
            epoch,
        )
    else:
        rest = _rest_of_the_pass(resumed.iteration, per_epoch, config, data_setup, per_step_before, before)
        ranks.on_rank_zero(
            logger.warning,
            "resuming at world size %d from a checkpoint written at world size %d "
            "(iteration %d, epoch %d): %s; augmentation and BatchNorm statistics are per process, so "
            "the result will differ from an uninterrupted run at world size %d",
            now,
            before,
            resumed.iteration,
            epoch,
            rest,
            before,
        )
    recorder.write_event(
        {
            "event": "resume",
            "iteration": resumed.iteration,
            "epoch": epoch,
            "world_size": now,
            "checkpoint_world_size": before,
            "same_images": same_images,
        }
    )


def _rest_of_the_pass(
    iteration: int,
    per_epoch: int,
    config: Config,
    data_setup: run_data.DataSetup,
    per_step_before: int | None,
    before: int,
) -> str:
    """What the rest of the pass under way sees at the new world size: the rest of the epoch, or of the pass over
    the data where epoch_length is set (passes of the loader's length go on across epochs)."""
    epoch, done = divmod(iteration, per_epoch)
    span = f"epoch {epoch + 1}"
    if config.epoch_length is not None:
        passes, done = divmod(iteration, len(loaders.batch_sampler_of(data_setup.loaders.train)))
        span = f"pass {passes + 1} over the data"
    if not done:
        return f"{span} starts afresh"
    if per_step_before == data_setup.images_per_iteration:
        return f"the rest of {span} sees exactly the images an uninterrupted run would, each once"
    return (
        f"the rest of {span} may repeat or skip images (a step took {per_step_before} images at world "
        f"size {before}, {data_setup.images_per_iteration} now)"
    )

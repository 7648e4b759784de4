"""The training order with ``epoch_length`` set: Ignite takes a new pass over the data when the last one ends, also
mid-epoch, so epochs shorter than a pass continue it and an epoch longer than one spans several. Each pass draws an
order of its own (where an epoch is one pass, the epoch's, as before), and a resumed run starts in the pass an
uninterrupted run is in, after the batches it has seen."""

from __future__ import annotations

import pytest
from ignite.engine import Engine

from cifar10_dist.data import batches, loaders
from cifar10_dist.data.synthetic import make_synthetic
from tests.conftest import TINY, assert_same_training_state, run_in_this_process

PASS = 6  # batches of 32 in a pass over 200 images


def batches_taken(
    epoch_length: int | None, epochs: int, resumed_at: int = 0, checkpoint_epochs: int | None = None
) -> list[list[int]]:
    """The training indices of each batch an Ignite run of ``epochs`` takes (from iteration ``resumed_at`` on, of
    a checkpoint whose epochs had ``checkpoint_epochs`` iterations: by default this run's)."""
    train, test = make_synthetic(200, 40, 0)
    made = loaders.make_loaders(train, test, batch_size=32, num_workers=0, train_eval_size=0, seed=3)
    dataset, taken = made.train.dataset, []
    read = dataset.__getitems__
    dataset.__getitems__ = lambda indices: (taken.append(list(indices)), read(indices))[1]
    trainer = Engine(lambda engine, batch: None)
    batches.position_sampler_each_pass(trainer, made.train, epoch_is_one_pass=epoch_length is None)
    if resumed_at:
        length = checkpoint_epochs or epoch_length or PASS
        trainer.load_state_dict({"iteration": resumed_at, "epoch_length": length, "max_epochs": epochs})
    trainer.run(made.train, max_epochs=epochs, epoch_length=epoch_length)
    return taken


def the_sampler_order(epoch: int) -> list[list[int]]:
    """The batches of one pass of the sampler with the order of ``epoch``."""
    train, test = make_synthetic(200, 40, 0)
    made = loaders.make_loaders(train, test, batch_size=32, num_workers=0, train_eval_size=0, seed=3)
    sampler = loaders.batch_sampler_of(made.train)
    sampler.sampler.set_epoch(epoch)
    return [list(batch) for batch in sampler]


@pytest.mark.parametrize("epoch_length", [None, 4, 15])
def test_each_pass_over_the_data_draws_its_own_order_and_a_resume_continues_it(epoch_length):
    whole = batches_taken(epoch_length, epochs=3 if epoch_length is None else 6)
    assert len(whole) == (3 * PASS if epoch_length is None else 6 * epoch_length)
    passes = [whole[start : start + PASS] for start in range(0, len(whole) - PASS + 1, PASS)]
    assert passes == [the_sampler_order(p) for p in range(len(passes))]  # pass p: the order of epoch p
    assert len({str(one) for one in passes}) == len(passes)  # (two passes of one long epoch differ too)
    for resumed_at in (3, PASS, 2 * PASS + 5):  # mid-pass, at a pass's end, mid-pass later
        assert batches_taken(epoch_length, 3 if epoch_length is None else 6, resumed_at) == whole[resumed_at:]


@pytest.mark.parametrize(
    "epoch_length, epochs, checkpoint_every, resume_at, where",
    [
        (7, 3, 7, 14, "loader"),  # 18 batches a pass: resumed in epoch 3, in the pass that began in epoch 1
        (25, 2, 20, 40, "loader"),  # at 40: mid-pass (the third) and mid-epoch (the second)
        (7, 3, 7, 14, "device"),  # the order and crops drawn on the device, per pass
    ],
)
def test_a_run_with_epoch_length_resumes_bit_exactly(
    small_dataset, tmp_path, epoch_length, epochs, checkpoint_every, resume_at, where
):
    on_device = ["--data_on_device=True", "--augment_per_pass=True"] if where == "device" else []
    common = [
        "run",
        *TINY,
        *on_device,
        f"--num_epochs={epochs}",
        f"--epoch_length={epoch_length}",
        f"--checkpoint_every={checkpoint_every}",
        "--train_eval_size=0",
        f"--validate_every={epochs}",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
    ]
    whole = run_in_this_process(*common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    checkpoint = tmp_path / "whole" / f"training_checkpoint_{resume_at}.pt"
    resumed = run_in_this_process(*common, "--run_name=resumed", f"--resume_from={checkpoint}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = f"training_checkpoint_{epochs * epoch_length}.pt"
    assert_same_training_state(tmp_path / "whole" / last, tmp_path / "resumed" / last)


def test_a_resume_at_another_world_size_continues_the_checkpoints_epoch_in_its_order():
    """Ignite keeps the checkpoint's epoch length: 7 batches where a pass has 6 now (as at another world size).
    Resumed at 9, the run continues epoch 2 in epoch 2's order after its 2 batches seen; each pass after it, begun
    mid-epoch, draws the next order (none is drawn twice)."""
    taken = batches_taken(None, epochs=3, resumed_at=9, checkpoint_epochs=7)
    assert taken[:4] == the_sampler_order(1)[2:]
    assert taken[4:10] == the_sampler_order(2)
    assert taken[10:12] == the_sampler_order(3)[:2]  # (21 steps: the run ends 2 batches into the next pass)

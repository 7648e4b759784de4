"""Training checkpoints written in the background (checkpoint_in_background, on by default): the loop goes on
while the disk works, the file holds the state of the moment it was saved, a failed write ends the run with its
one line without costing the earlier file, and a run writes the same checkpoints either way."""

from __future__ import annotations

import errno
import threading
import time
from collections import OrderedDict

import pytest
import torch
from ignite.engine import Engine
from ignite.handlers import DiskSaver
from torch.utils._pytree import tree_flatten

from cifar10_dist.outputs import checkpoint_files
from cifar10_dist.outputs.files import OutputNotWritable
from cifar10_dist.training.loop import checkpointing
from cifar10_dist.training.loop.background_writes import BackgroundWrites, host_copy
from tests.conftest import TINY, run_in_this_process


def engine_at(iteration: int) -> Engine:
    engine = Engine(lambda engine, batch: None)
    engine.state.iteration = iteration
    return engine


def test_the_loop_goes_on_while_the_disk_writes_and_the_file_holds_the_state_of_the_save(tmp_path, monkeypatch):
    model = torch.nn.Linear(50, 50)
    saved_weight = model.weight.detach().clone()
    handler = checkpointing.create_training_checkpoint(
        {"model": model, "other": torch.nn.Linear(2, 2)}, tmp_path, in_background=True
    )
    disk_may_write, real_save = threading.Event(), torch.save

    def slow_disk(obj, file, **kwargs):
        assert disk_may_write.wait(30)
        real_save(obj, file, **kwargs)

    monkeypatch.setattr(torch, "save", slow_disk)
    handler(engine_at(7))  # returns with the write still waiting for the disk
    assert handler.save_handler.writing and not (tmp_path / "training_checkpoint_7.pt").exists()
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on and changes the weights in place
    disk_may_write.set()
    checkpointing.written(handler)
    weights = checkpoint_files.load_checkpoint(tmp_path / "training_checkpoint_7.pt")["model"]
    assert torch.equal(weights["weight"], saved_weight)
    assert not torch.equal(weights["weight"], model.weight.detach())


def test_a_failed_write_ends_training_at_the_next_iteration_with_one_line_and_keeps_the_earlier_file(
    tmp_path, monkeypatch
):
    model = torch.nn.Linear(4, 4)
    handler = checkpointing.create_training_checkpoint(
        {"model": model, "other": torch.nn.Linear(2, 2)}, tmp_path, in_background=True
    )
    real_save, saves = torch.save, []

    def disk_full_at_the_second_save(obj, file, **kwargs):
        saves.append(file)
        if len(saves) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, file, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_the_second_save)

    def step(engine: Engine, batch: int) -> None:
        while handler.save_handler.writing:  # a step longer than the failing write
            time.sleep(0.001)

    trainer = Engine(step)
    checkpointing.attach_training_checkpoints(trainer, handler, 2, handler)
    with pytest.raises(OutputNotWritable) as failure:
        trainer.run(range(10), max_epochs=1)
    assert trainer.state.iteration == 5  # the iteration after the failed save at 4, not the next save at 6
    assert str(failure.value).startswith(
        f"cannot write training_checkpoint_4.pt in {tmp_path}: No space left on device ("
    )
    assert "\n" not in str(failure.value)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["training_checkpoint_2.pt"]  # no temporary file
    checkpoint_files.load_checkpoint(tmp_path / "training_checkpoint_2.pt")


def test_a_tracker_saver_writes_inline_and_a_plain_run_dir_in_the_background(tmp_path):
    model = torch.nn.Linear(2, 2)
    plain = checkpointing.create_training_checkpoint({"model": model}, tmp_path, in_background=True)
    tracker_like = checkpointing.create_training_checkpoint(
        {"model": model}, tmp_path, DiskSaver(tmp_path, require_empty=False, atomic=True), in_background=True
    )
    inline = checkpointing.create_training_checkpoint({"model": model}, tmp_path, in_background=False)
    assert isinstance(plain.save_handler, BackgroundWrites)
    assert isinstance(tracker_like.save_handler, checkpointing.KeepUntilSaved)
    assert isinstance(inline.save_handler, checkpointing.KeepUntilSaved)


def test_the_host_copy_keeps_the_state_dicts_metadata_and_a_tensor_named_twice_once():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    state = model.state_dict()
    copied = host_copy({"model": state, "tied": [state["0.weight"], state["0.weight"]], "step": 3})
    assert type(copied["model"]) is OrderedDict and copied["model"]._metadata == state._metadata
    assert copied["tied"][0] is copied["tied"][1] is not state["0.weight"]
    assert copied["tied"][0].data_ptr() != state["0.weight"].data_ptr()
    assert torch.equal(copied["tied"][0], state["0.weight"]) and copied["step"] == 3


def test_a_run_writes_the_same_checkpoints_in_the_background_as_inline(small_dataset, tmp_path):
    runs = {}
    for name, setting in (("background", "True"), ("inline", "False")):
        result = run_in_this_process(
            "run",
            *TINY,
            f"--data_path={small_dataset}",
            f"--output_path={tmp_path}",
            f"--run_name={name}",
            "--checkpoint_every=10",
            f"--checkpoint_in_background={setting}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = sorted(path.name for path in (tmp_path / name).glob("training_checkpoint_*.pt"))
    assert runs["background"] == runs["inline"] == ["training_checkpoint_30.pt", "training_checkpoint_36.pt"]
    for name in runs["inline"]:
        background = checkpoint_files.load_checkpoint(tmp_path / "background" / name)
        inline = checkpoint_files.load_checkpoint(tmp_path / "inline" / name)
        assert background.keys() == inline.keys()
        for part in ("model", "optimizer", "trainer", "lr_scheduler"):
            values, layout = tree_flatten(background[part])
            assert layout == tree_flatten(inline[part])[1]
            for value, other in zip(values, tree_flatten(inline[part])[0]):
                assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other

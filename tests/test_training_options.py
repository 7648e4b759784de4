"""Training options researchers expect: gradient accumulation (equivalent to the larger batch at world sizes 1
and 2, no all-reduce on the batches that do not step, GradScaler, exact resume), early stopping (agreed by
all processes, a normal end, a resume that trains no further) and EMA weights."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.distributed as dist
from torch import nn

from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop.step import Accumulation, TrainStep, create_trainer
from tests.conftest import SPAWN_2, TINY, assert_same_training_state, run_in_this_process

# A model without BatchNorm: a batch of 128 and two accumulated batches of 64 compute the same gradient.
NO_BATCHNORM = textwrap.dedent("""\
    from torch import nn


    def net():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(16, 10))
    """)
# 1,280 in-memory images: 10 batches of 128 or 20 of 64 in one epoch; no augmentation (it is drawn per iteration)
# and a constant learning rate (the schedule counts iterations), so that step k of both runs sees the same images
# and lr
EQUIVALENT = [
    "--figures=False",
    "--dataset=synthetic",
    "--synthetic_size=1280",
    "--train_eval_size=0",
    "--num_workers=0",
    "--crop_padding=0",
    "--flip=none",
    "--num_epochs=1",
    "--num_warmup_epochs=0",
    "--lr_end=1.0",
    "--learning_rate=0.05",
    "--checkpoint_every=10",
]


def test_two_accumulated_batches_of_64_train_like_one_batch_of_128_in_one_process_and_in_two(tmp_path):
    """After 10 optimizer steps, 1 process with batches of 128, 1 process accumulating 2 x 64, and 2 gloo processes
    accumulating 2 x 64 (32 each, gradients averaged by DDP) hold the same weights."""
    (tmp_path / "nobn.py").write_text(NO_BATCHNORM)
    common = ["run", *EQUIVALENT, f"--model={tmp_path / 'nobn.py'}:net", f"--output_path={tmp_path}"]
    runs = {
        "large": ["--batch_size=128"],
        "accumulated": ["--batch_size=64", "--accumulation_steps=2"],
        "accumulated-2-processes": ["--batch_size=64", "--accumulation_steps=2", *SPAWN_2],
    }
    for name, args in runs.items():
        result = run_in_this_process(*common, *args, f"--run_name={name}")
        assert result.returncode == 0, result.stderr[-3000:]
    large = torch.load(tmp_path / "large" / "training_checkpoint_10.pt", weights_only=True)["model"]
    for name in ("accumulated", "accumulated-2-processes"):
        accumulated = torch.load(tmp_path / name / "training_checkpoint_20.pt", weights_only=True)["model"]
        assert large.keys() == accumulated.keys()
        for key, value in large.items():
            assert torch.allclose(value, accumulated[key], rtol=1e-4, atol=1e-6), (name, key)
    halfway = torch.load(tmp_path / "accumulated" / "training_checkpoint_10.pt", weights_only=True)["model"]
    assert not torch.allclose(halfway["7.weight"], large["7.weight"], rtol=1e-3)  # it trains: the weights move


def counted_all_reduces(model: nn.Module) -> list[int]:
    """Register a DDP communication hook that counts the buckets it all-reduces (then all-reduces them)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    calls = [0]

    def hook(state, bucket):
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)
    return calls


def test_batches_that_do_not_step_skip_the_gradient_all_reduce(tmp_path):
    """A DDP model on a real gloo group: 6 batches with accumulation_steps=3 all-reduce at the 2 steps only."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(12, 3)))
        calls = counted_all_reduces(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = create_trainer(
            TrainStep(model, optimizer, nn.CrossEntropyLoss(), Precision("cpu", None), Accumulation(3, model)),
            lambda batch, iteration: batch,
        )
        data = [(torch.randn(4, 3, 2, 2), torch.randint(0, 3, (4,))) for _ in range(6)]
        trainer.run(data, max_epochs=1)
        assert calls[0] == 2
    finally:
        dist.destroy_process_group()


def test_accumulation_with_grad_scaler_matches_the_documented_amp_loop():
    """fp16 autocast + GradScaler (on CPU here): the trainer does what PyTorch's AMP docs prescribe for
    accumulation, bit for bit, including the scaler's state."""
    data = [(torch.randn(8, 3, 4, 4), torch.randint(0, 3, (8,))) for _ in range(4)]

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 3))
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), torch.amp.GradScaler("cpu")

    model, optimizer, scaler = build()
    train_step = TrainStep(model, optimizer, nn.CrossEntropyLoss(), Precision("cpu", torch.float16), Accumulation(2))
    train_step.scaler = scaler
    trainer = create_trainer(train_step, lambda batch, iteration: batch)
    trainer.run(data, max_epochs=1)

    reference, reference_optimizer, reference_scaler = build()
    for index, (inputs, targets) in enumerate(data, start=1):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(reference(inputs), targets) / 2
        reference_scaler.scale(loss).backward()
        if index % 2 == 0:
            reference_scaler.step(reference_optimizer)
            reference_scaler.update()
            reference_optimizer.zero_grad(set_to_none=True)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(ours, theirs)
    assert scaler.state_dict() == reference_scaler.state_dict()


def test_a_run_with_accumulation_resumes_to_the_identical_state(small_dataset, tmp_path):
    """Checkpoints are taken after optimizer steps (checkpoint_every is a multiple of accumulation_steps), so a
    resumed run ends bit-identical to the uninterrupted one."""
    common = [
        "run",
        *TINY,
        "--accumulation_steps=3",
        "--checkpoint_every=12",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
    ]
    whole = run_in_this_process(*common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    resumed = run_in_this_process(
        *common, "--run_name=resumed", f"--resume_from={tmp_path / 'whole' / 'training_checkpoint_24.pt'}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training_state(
        tmp_path / "whole" / "training_checkpoint_36.pt", tmp_path / "resumed" / "training_checkpoint_36.pt"
    )


def test_early_stopping_ends_the_run_normally_for_both_processes_and_a_resume_trains_no_further(
    small_dataset, tmp_path
):
    """min_delta 0.5: no validation after the first can count as a gain, so patience 1 stops after epoch 2 of 30;
    the test set is evaluated once, with the model chosen on val; resuming the run only evaluates."""
    args = [
        "run",
        *TINY,
        *SPAWN_2,
        "--val_split=0.1",
        "--validate_every=1",
        "--num_epochs=30",
        "--early_stopping_patience=1",
        "--early_stopping_min_delta=0.5",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=early",
    ]
    result = run_in_this_process(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped early at epoch 2 (early_stopping_patience)" in result.stdout
    run_dir = tmp_path / "early"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_early"] == 2 and summary["epochs"] == 2 and summary["iterations"] == 32
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines if line.get("split") == "val"] == [1, 2]
    assert [line["epoch"] for line in lines if line.get("split") == "test"] == [2]  # once, at the end
    assert summary["final"]["test"]["model"].startswith("best_model_")
    checkpoints = sorted(path.name for path in run_dir.glob("training_checkpoint_*.pt"))
    assert checkpoints[-1] == "training_checkpoint_32.pt"
    stopper = torch.load(run_dir / "training_checkpoint_32.pt", weights_only=True)["early_stopping"]
    assert stopper["counter"] == 1

    resumed = run_in_this_process(*args, "--resume_from=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "stopped early at epoch 2" in resumed.stdout
    assert sorted(path.name for path in run_dir.glob("training_checkpoint_*.pt")) == checkpoints
    assert json.loads((run_dir / "summary.json").read_text())["iterations"] == 32


def test_ema_weights_are_evaluated_checkpointed_resumed_exactly_and_used_by_evaluate(small_dataset, tmp_path):
    """ema_decay: each evaluation reports the model (test) and its average (test_ema); the EMA chooses the best
    model; a run resumed mid warm-up ends with the identical average; evaluate takes the EMA weights of a
    training checkpoint (its test_ema accuracy) unless --raw_weights (the model's test accuracy)."""
    common = [
        "run",
        *TINY,
        "--ema_decay=0.95",
        "--num_warmup_epochs=1.5",
        "--validate_every=1",
        "--checkpoint_every=12",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
    ]
    whole = run_in_this_process(*common, "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    final = tmp_path / "whole" / "training_checkpoint_36.pt"
    state = torch.load(final, weights_only=True)
    assert state["ema_model"].keys() == state["model"].keys()
    assert not torch.equal(state["ema_model"]["0.0.weight"], state["model"]["0.0.weight"])
    assert state["ema_warmup"] == {"warmup_events": 36}
    lines = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    splits = {split: [line for line in lines if line.get("split") == split] for split in ("test", "test_ema")}
    assert [line["epoch"] for line in splits["test"]] == [line["epoch"] for line in splits["test_ema"]] == [1, 2]
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert summary["best"]["split"] == "test_ema" and summary["final"]["test"]["model"] == "ema"
    assert summary["final"]["test"]["accuracy"] == splits["test_ema"][-1]["accuracy"]

    resumed = run_in_this_process(
        *common, "--run_name=resumed", f"--resume_from={tmp_path / 'whole' / 'training_checkpoint_24.pt'}"
    )  # mid warm-up (27)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = torch.load(tmp_path / "resumed" / "training_checkpoint_36.pt", weights_only=True)
    assert all(torch.equal(state["ema_model"][key], again["ema_model"][key]) for key in state["ema_model"])
    assert_same_training_state(final, tmp_path / "resumed" / "training_checkpoint_36.pt")

    for flag, split in (([], "test_ema"), (["--raw_weights"], "test")):
        evaluated = run_in_this_process("evaluate", f"--checkpoint={final}", "--json", "--num_workers=0", *flag)
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        accuracy = json.loads(evaluated.stdout.strip().splitlines()[-1])["accuracy"]
        assert accuracy == pytest.approx(splits[split][-1]["accuracy"]), split
    import cifar10_dist
    from cifar10_dist.data.synthetic import make_synthetic

    images = make_synthetic(1, 8, seed=1)[1].images
    ema, raw = cifar10_dist.predict(final, images), cifar10_dist.predict(final, images, raw_weights=True)
    assert not torch.allclose(ema, raw)  # predict (and export) take the EMA weights too, unless told

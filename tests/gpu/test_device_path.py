"""The device path every GPU user now takes by default, on a real GPU: batches cut and prepared on the device
without a host wait, training iterations that never wait for the GPU (counted by iteration), the warm-up undone
and what it saves, batched random-resized crops under deterministic mode, two processes sharing the one GPU over
gloo (not nccl: one GPU is lent), and a compiled airbench step that does not recompile mid-training. In the order
the third GPU lease runs them (scripts/gpu_lease.sh checks); GPU_CHECK_DEVICE=cpu rehearses them on the CPU."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import torch

from cifar10_dist.data import loaders
from tests.conftest import (
    REPO,
    assert_same_training_state,
    cli_env,
    run_forked,
    run_in_this_process,
    run_new_interpreter,
    run_torchrun_new_interpreter,
    start_new_interpreter,
    stop_all,
    wait_for_file,
)
from tests.gpu.conftest import ON_CUDA, cuda_only, is_real
from tests.gpu.test_gpu_paths import SHORT, checkpoint_inside, final_test, newest_checkpoint, resumed_alike, run
from tests.gpu.waits import HostWaits
from tests.reliability.test_faults import gone, worker_pids

pytestmark = pytest.mark.gpu

FAST = REPO / "configs" / "fast.yaml"


@pytest.mark.parametrize(
    "augment",
    [
        {"crop_padding": 4, "color_jitter": 0.1},  # fast.yaml's pad-crop and flip, with colour jitter
        {"crop_padding": 0, "random_resized_crop": 0.35},  # random-resized crops: one batched kernel on a GPU
        {"crop_padding": 2, "crop_pad_mode": "reflect", "flip": "alternating", "augment_per_pass": True},  # fast.yaml's
    ],
    ids=["pad-crop", "resized-crop", "per-pass"],
)
def test_cutting_and_preparing_a_batch_on_the_device_never_waits_for_it(augment, record):
    """data_on_device: 20 training batches sliced from the images there and prepared (crops, flips, jitter,
    normalisation; or a whole pass cut at once) under torch.cuda.set_sync_debug_mode("error"): no step of it
    makes the host wait for the GPU, so the host can run ahead and queue the next. On the CPU (rehearsal) the
    same code runs without it."""
    from cifar10_dist.config import load_config
    from cifar10_dist.data import batches
    from cifar10_dist.data.datasets import DatasetInfo
    from cifar10_dist.data.synthetic import make_synthetic

    device = torch.device("cuda" if ON_CUDA else "cpu")
    train, test = make_synthetic(1280, 64, 0)
    info = DatasetInfo(tuple("abcdefghij"))
    config = batches.TrainAugmentation.of(load_config(None, data_on_device=True, **augment))
    per_pass = augment.get("augment_per_pass", False)
    made = loaders.make_loaders(
        train,
        test,
        batch_size=64,
        num_workers=0,
        train_eval_size=0,
        seed=0,
        device=device,
        pass_transform=batches.pass_augmentation(config, len(train), info, torch.bfloat16) if per_pass else None,
    )
    prepare = batches.train_batch_preparer(device, config, len(made.train), info, prepared_per_pass=per_pass)
    prepared = []
    if ON_CUDA:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        for iteration, batch in enumerate(made.train, start=1):
            prepared.append(prepare(batch, iteration))
    finally:
        if ON_CUDA:
            torch.cuda.set_sync_debug_mode(0)
    inputs, labels = prepared[-1]
    assert len(prepared) == 20 and inputs.shape == (64, 3, 32, 32) and inputs.device.type == device.type
    assert inputs.dtype == (torch.bfloat16 if per_pass else torch.float32)
    record(f"batches prepared without a host wait ({'-'.join(f'{k}={v}' for k, v in augment.items())})", len(prepared))


WAITING_RUNS = {
    "default": [*SHORT, "--num_epochs=1", "--num_warmup_epochs=0.5"],  # simple_cnn, data_on_device
    "fp16-fused": [*SHORT, "--num_epochs=1", "--num_warmup_epochs=0.5", "--with_amp=True"],  # GradScaler + fused
    "fast.yaml": [
        f"--config={FAST}",
        "--num_epochs=2",
        "--num_warmup_epochs=0.5",
        "--whitening_bias_epochs=1",
        "--tta=0",
        "--validate_every=1",
    ],  # airbench: lookahead, the bias's freeze, a pass at a time
}


@pytest.mark.parametrize("name", list(WAITING_RUNS))
def test_training_iterations_do_not_wait_for_the_gpu(name, check_data, tmp_path, record):
    """One run on the device path in this process under torch.cuda.set_sync_debug_mode("warn"): every host wait
    is filed under the training iteration it happened in (``tests.gpu.waits``); none may happen in an iteration
    that does not end an epoch (logging and checkpoints are pushed past the run's end here). Evaluation and the
    set-up may wait (they are counted apart and recorded)."""
    cuda_only()
    waits = HostWaits()
    with waits.caught():
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = run_in_this_process(
                "run",
                *WAITING_RUNS[name],
                f"--data_path={check_data}",
                f"--output_path={tmp_path}",
                "--run_name=sync",
                "--data_on_device=True",
                "--log_every_iters=100000",
                "--checkpoint_every=100000",
                "--train_eval_size=0",
            )
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "sync" / "summary.json").read_text())
    iterations, per_epoch = summary["iterations"], summary["iterations"] // summary["epochs"]
    epoch_ends = set(range(per_epoch, iterations + 1, per_epoch))
    waiting = waits.iterations_waiting(epoch_ends)
    record(f"{name}: iterations with a host wait (of {iterations}; epoch ends excused)", len(waiting))
    for place, count in waits.places(waiting).most_common(4):
        record(f"{name}: waits in training iterations at {place}", count, "iterations")
    for where, places in waits.elsewhere.items():
        record(f"{name}: host waits in {where}", sum(places.values()), f"at {len(places)} places")
    assert not waiting, {iteration: dict(places) for iteration, places in list(waiting.items())[:5]}


def test_the_warm_up_is_undone_and_what_it_saves_is_timed_with_autotuning_on(check_data, tmp_path, record):
    """warm_up_steps=3 against none: deterministic runs end with the same weights; then, with cuDNN's autotuning
    on (not deterministic, as users train), epoch 1's training seconds with and without the warm-up."""
    for name, steps in (("warm", 3), ("cold", 0)):
        run(
            check_data,
            tmp_path,
            name,
            f"--warm_up_steps={steps}",
            "--deterministic=True",
            "--num_epochs=1",
            "--num_warmup_epochs=0.5",
        )
    final = newest_checkpoint(tmp_path / "warm").name
    assert_same_training_state(tmp_path / "cold" / final, tmp_path / "warm" / final)
    seconds = {}
    for name, steps in (("warm-timed", 3), ("cold-timed", 0)):
        run(
            check_data,
            tmp_path,
            name,
            f"--warm_up_steps={steps}",
            "--num_epochs=1",
            "--num_warmup_epochs=0.5",
            "--data_on_device=True",
        )
        seconds[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert seconds["warm-timed"]["warm_up_time"] > 0 and seconds["cold-timed"]["warm_up_time"] is None
    record("warm-up seconds (3 steps, simple_cnn, autotuning on)", seconds["warm-timed"]["warm_up_time"], "s")
    record("epoch 1 training seconds with a warm-up", seconds["warm-timed"]["training_time"], "s")
    record("epoch 1 training seconds without", seconds["cold-timed"]["training_time"], "s")


def test_batched_resized_crops_under_deterministic_mode_use_torchvisions_kernel(check_data, tmp_path, record):
    """deterministic=True with random_resized_crop on the GPU: torchvision's own roi_align kernel (deterministic
    forward), not its compiled pure-Python stand-in; a run resumed mid-epoch ends as the whole run; the peak
    GPU memory is recorded."""
    crops = [
        "--random_resized_crop=0.35",
        "--data_on_device=True",
        "--deterministic=True",
        checkpoint_inside(check_data),
    ]
    whole = resumed_alike(check_data, tmp_path, crops)
    assert ("random-resized crops and flips: one batched kernel on the GPU" in whole.stderr) == ON_CUDA
    assert "_roi_align" not in whole.stderr
    memory = re.search(r"peak GPU memory (\d+) MiB allocated", whole.stderr)
    if memory:
        record("peak GPU memory, deterministic resized crops, batch 256", float(memory.group(1)), "MiB")
    record("test accuracy, 2 epochs with batched random-resized crops", final_test(tmp_path / "whole")["accuracy"])


TWO = ["--backend=gloo"]


def test_two_processes_share_the_gpu_over_gloo(check_data, tmp_path, record):
    """torchrun --nproc_per_node=2 --backend=gloo on one GPU (replicas per GPU; not nccl, which refuses two
    ranks on one GPU): the run trains with data_on_device agreed by both ranks (one value in config.yaml), its
    checkpoint evaluates identically at world sizes 1 and 2, and a Ctrl-C to the group stops both processes
    with exit code 130 and a checkpoint."""
    trained = run_torchrun_new_interpreter(
        2,
        "run",
        *SHORT,
        "--num_epochs=1",
        "--num_warmup_epochs=0.5",
        *TWO,
        f"--data_path={check_data}",
        f"--output_path={tmp_path}",
        "--run_name=two",
        timeout=1800,
        # (on a GPU, torchrun's own children, as a user runs it)
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "distributed: backend gloo, world size 2" in trained.stderr
    settled = re.search(r"^data_on_device: (\w+)$", (tmp_path / "two" / "config.yaml").read_text(), re.MULTILINE)
    assert settled and settled.group(1) in ("true", "false")
    record("two processes on one GPU: data_on_device settled", float(settled.group(1) == "true"))
    record("two processes on one GPU: test accuracy, 1 epoch", final_test(tmp_path / "two")["accuracy"])
    checkpoint = newest_checkpoint(tmp_path / "two")
    one = run_forked("evaluate", f"--checkpoint={checkpoint}", f"--data_path={check_data}", "--json", timeout=600)
    both = run_torchrun_new_interpreter(
        2, "evaluate", f"--checkpoint={checkpoint}", f"--data_path={check_data}", "--json", *TWO, timeout=600
    )
    # (torchrun's summary of a failed worker fills 2,000 characters: the worker's own last lines come before it)
    assert one.returncode == 0 and both.returncode == 0, (one.stderr[-2000:], both.stderr[-8000:])
    results = [json.loads(done.stdout.strip().splitlines()[-1]) for done in (one, both)]
    assert results[0]["confusion_matrix"] == results[1]["confusion_matrix"]
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-5)
    record("evaluation at world sizes 1 and 2: confusion matrices identical", 1.0)

    job = start_new_interpreter(
        "run",
        *SHORT,
        "--num_epochs=2",
        "--checkpoint_every=20",
        *TWO,
        f"--data_path={check_data}",
        f"--output_path={tmp_path}",
        "--run_name=stopped",
        torchrun=["--nproc_per_node=2", "--standalone"],
        env={"SLOW_STEP_SECONDS": "0.05"} if not is_real(check_data) else None,
        # (its workers counted as torchrun's children)
    )
    try:
        wait_for_file(tmp_path / "stopped", "training_checkpoint_*.pt", job, timeout=600)
        workers = worker_pids(job.pid)
        sent = time.monotonic()
        os.killpg(job.pid, signal.SIGINT)
        _, stderr = job.communicate(timeout=120)
    finally:
        stop_all(job)
    record("two processes on one GPU: seconds from Ctrl-C to the end", time.monotonic() - sent, "s")
    assert len(workers) == 2 and gone(workers), workers
    stopped = re.findall(r"interrupted at epoch \d+, iteration (\d+): checkpoint \S+ written", stderr)
    assert stopped, stderr[-3000:]  # (torchrun's own exit code is its own: 1 after a SIGINT to it)
    assert (tmp_path / "stopped" / f"training_checkpoint_{stopped[0]}.pt").is_file()


@pytest.mark.parametrize(
    "compression",
    [["--grad_compression=bf16"], ["--grad_compression=powersgd", "--powersgd_rank=2", "--powersgd_start_step=4"]],
    ids=["bf16", "powersgd"],
)
def test_two_processes_on_one_gpu_resume_compressed_gradients_exactly(compression, check_data, tmp_path, record):
    """torchrun --nproc_per_node=2 --backend=gloo on the one GPU (this run refuses to spawn two ranks on it),
    gradients compressed by DDP's hook (bf16, or PowerSGD with its error feedback in the checkpoint),
    deterministic: a run resumed from a checkpoint inside its epoch ends with the uninterrupted run's training
    state (weights, optimizer, PowerSGD's state)."""
    name = compression[0].split("=")[1]
    flags = [*SHORT, "--num_epochs=1", "--num_warmup_epochs=0.5", *TWO, *compression, "--deterministic=True"]
    flags += [checkpoint_inside(check_data), f"--data_path={check_data}", f"--output_path={tmp_path}"]
    whole = run_torchrun_new_interpreter(2, "run", *flags, "--run_name=whole", timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "distributed: backend gloo, world size 2" in whole.stderr
    assert f"grad_compression  {name}" in whole.stderr  # the plan's row
    first = min(int(path.stem.rsplit("_", 1)[1]) for path in (tmp_path / "whole").glob("training_checkpoint_*.pt"))
    middle = tmp_path / "whole" / f"training_checkpoint_{first}.pt"
    resumed = run_torchrun_new_interpreter(
        2, "run", *flags, "--run_name=resumed", f"--resume_from={middle}", timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = newest_checkpoint(tmp_path / "whole").name
    assert_same_training_state(tmp_path / "whole" / final, tmp_path / "resumed" / final)
    record(f"two processes on one GPU, {name} gradients: resumed run's training state identical", 1.0)
    record(
        f"two processes on one GPU, {name} gradients: test accuracy, 1 epoch",
        final_test(tmp_path / "whole")["accuracy"],
    )


def test_a_compiled_airbench_step_compiles_both_branches_before_the_timer(check_data, tmp_path, record):
    """fast.yaml with compile=True (2 epochs, the whitening bias frozen after the first): the warm-up compiles
    the forward with the bias trained and frozen, so no recompilation happens between the warm-up and the first
    evaluation (torch's recompile log, TORCH_LOGS=recompiles); the steady epoch's seconds are recorded."""
    cuda_only()
    result = run_new_interpreter(
        "run",
        f"--config={FAST}",
        "--num_epochs=2",
        "--num_warmup_epochs=0.5",
        "--whitening_bias_epochs=1",
        "--tta=0",
        "--compile=True",
        f"--data_path={check_data}",
        f"--output_path={tmp_path}",
        "--run_name=compiled",
        env={**cli_env(), "TORCH_LOGS": "recompiles"},
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    warmed = log.index("warm-up:")
    evaluated = log.find(" test: accuracy", warmed) if " test: accuracy" in log[warmed:] else len(log)
    recompiles = log[warmed:evaluated].count("Recompiling function")
    summary = json.loads((tmp_path / "compiled" / "summary.json").read_text())
    record("compiled fast.yaml: warm-up seconds (both branches)", summary["warm_up_time"], "s")
    record("compiled fast.yaml: recompilations during training", recompiles)
    epochs = [json.loads(line) for line in (tmp_path / "compiled" / "metrics.jsonl").read_text().splitlines()]
    times = [row["epoch_time"] for row in epochs if row.get("event") == "epoch"]
    record("compiled fast.yaml: epoch seconds", times[-1], "s (epoch 2)")
    assert recompiles == 0, log[warmed:evaluated][-3000:]

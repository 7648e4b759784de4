"""Every accelerator path of a run, on a real GPU: nccl under torchrun and spawning, the no-backend path on
cuda:0, fp16 autocast + GradScaler (accuracy band, exact resume), bf16, data_on_device, pinned memory,
channels_last, compile, TF32/cuDNN flags, deterministic mode, GPU evaluation against the CPU, peak GPU memory.
The device path's own checks (host waits, the warm-up, two processes on one GPU) are in test_device_path.
Skipped without CUDA (see conftest); GPU_CHECK_DEVICE=cpu rehearses the device-independent ones on the CPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from cifar10_dist.data import loaders
from tests.conftest import assert_same_training_state, cli_env, run_forked, run_torchrun_new_interpreter
from tests.gpu.conftest import ON_CUDA, cuda_only, gpus, is_real

pytestmark = pytest.mark.gpu

# a short run of simple_cnn: 2 epochs of the data in check_data (real CIFAR-10: 2 x 50,000 images)
SHORT = [
    "--model=simple_cnn",
    "--batch_size=256",
    "--num_workers=2",
    "--num_epochs=2",
    "--num_warmup_epochs=1",
    "--learning_rate=0.2",
    "--train_eval_size=500",
    "--validate_every=2",
    "--checkpoint_every=5",
    "--log_every_iters=50",
]


def run(data: Path, output: Path, name: str, *extra: str, env: dict | None = None):
    result = run_forked(
        "run",
        *SHORT,
        f"--data_path={data}",
        f"--output_path={output}",
        f"--run_name={name}",
        *extra,
        env=env,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def final_test(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())["test"]


def newest_checkpoint(run_dir: Path) -> Path:
    return max(run_dir.glob("training_checkpoint_*.pt"), key=lambda path: int(path.stem.rsplit("_", 1)[1]))


def test_no_backend_run_trains_on_cuda0_and_logs_peak_gpu_memory(check_data, tmp_path, record):
    result = run(check_data, tmp_path, "plain")
    device = "cuda:0" if ON_CUDA else "cpu"
    assert f"device {device}" in result.stderr
    record("test accuracy, 2 epochs fp32", final_test(tmp_path / "plain")["accuracy"])
    speeds = [float(x) for x in re.findall(r"epoch \d+ done in [0-9.]+ s \(([0-9.]+) img/s\)", result.stderr)]
    record("training speed, epoch 2", speeds[-1], "img/s")
    if ON_CUDA:
        memory = re.search(r"peak GPU memory (\d+) MiB allocated, (\d+) MiB reserved", result.stderr)
        assert memory, result.stderr[-2000:]
        record("peak GPU memory allocated, 1 process", float(memory.group(1)), "MiB")


def test_nccl_under_torchrun_with_one_process(check_data, tmp_path):
    cuda_only()
    result = run_torchrun_new_interpreter(
        1,
        "run",
        *SHORT,
        "--num_epochs=1",
        "--num_warmup_epochs=0.5",
        "--backend=nccl",
        f"--data_path={check_data}",
        f"--output_path={tmp_path}",
        "--run_name=nccl1",
        timeout=1800,
        # (on a GPU, torchrun's own children, as a user runs it)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "distributed: backend nccl, world size 1" in result.stderr


def test_two_gpus_nccl_by_torchrun_and_by_spawn_and_evaluation_is_identical_at_world_sizes_1_and_2(
    check_data, tmp_path, record
):
    cuda_only()
    gpus(2)
    mission = run_torchrun_new_interpreter(
        2,
        "run",
        *SHORT,
        "--backend=nccl",
        f"--data_path={check_data}",
        f"--output_path={tmp_path}",
        "--run_name=torchrun2",
        timeout=1800,
        # (on a GPU, torchrun's own children, as a user runs it)
    )  # the README's command
    assert mission.returncode == 0, mission.stderr[-3000:]
    assert "distributed: backend nccl, world size 2" in mission.stderr
    spawned = run(check_data, tmp_path, "spawn2", "--backend=nccl", "--nproc_per_node=2")
    assert "distributed: backend nccl, world size 2" in spawned.stderr
    record("test accuracy, 2 GPUs nccl spawned", final_test(tmp_path / "spawn2")["accuracy"])
    checkpoint = newest_checkpoint(tmp_path / "spawn2")
    results = {}
    for world_size, launch in {1: [], 2: ["--backend=nccl", "--nproc_per_node=2"]}.items():
        evaluated = run_forked("evaluate", f"--checkpoint={checkpoint}", f"--data_path={check_data}", "--json", *launch)
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        results[world_size] = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert results[1]["confusion_matrix"] == results[2]["confusion_matrix"]
    assert results[1]["loss"] == pytest.approx(results[2]["loss"], abs=1e-5)


def test_mixed_precision_trains_to_the_fp32_band_and_resumes_exactly(check_data, tmp_path, record):
    """fp16 autocast + GradScaler on CUDA (bf16 on the CPU): within 3 points of fp32 on a short run; a deterministic
    run resumed mid-epoch from a checkpoint (GradScaler state included) ends bit-identical."""
    run(check_data, tmp_path, "fp32", "--deterministic=True")
    run(check_data, tmp_path, "amp", "--with_amp=True", "--deterministic=True")
    accuracies = {name: final_test(tmp_path / name)["accuracy"] for name in ("fp32", "amp")}
    record("test accuracy fp32", accuracies["fp32"])
    record("test accuracy with_amp", accuracies["amp"])
    band = 0.03 if is_real(check_data) else 0.10
    assert abs(accuracies["amp"] - accuracies["fp32"]) < band, accuracies
    final = newest_checkpoint(tmp_path / "amp")
    state = torch.load(final, weights_only=True)
    if ON_CUDA:
        assert state["scaler"]["scale"] > 0, "fp16 on CUDA checkpoints its GradScaler"
    mid = sorted(int(p.stem.rsplit("_", 1)[1]) for p in (tmp_path / "amp").glob("training_checkpoint_*.pt"))[0]
    resumed = run(
        check_data,
        tmp_path,
        "amp-resumed",
        "--with_amp=True",
        "--deterministic=True",
        f"--resume_from={tmp_path / 'amp' / f'training_checkpoint_{mid}.pt'}",
    )
    assert f"at iteration {mid}" in resumed.stderr
    assert_same_training_state(final, tmp_path / "amp-resumed" / final.name)
    if ON_CUDA:
        assert torch.load(tmp_path / "amp-resumed" / final.name, weights_only=True)["scaler"] == state["scaler"]


def test_bf16_autocast_where_the_gpu_supports_it(check_data, tmp_path, record):
    cuda_only()
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    run(check_data, tmp_path, "bf16", "--with_amp=True", "--amp_dtype=bfloat16")
    record("test accuracy bf16 autocast", final_test(tmp_path / "bf16")["accuracy"])
    assert "scaler" not in torch.load(newest_checkpoint(tmp_path / "bf16"), weights_only=True)  # bf16 needs none


def test_data_on_device_trains_exactly_as_the_loader_does(check_data, tmp_path, record):
    for name, flag in (("loader", "False"), ("device", "True")):
        run(
            check_data,
            tmp_path,
            name,
            f"--data_on_device={flag}",
            "--deterministic=True",
            "--num_epochs=1",
            "--num_warmup_epochs=0.5",
        )
    final = newest_checkpoint(tmp_path / "loader").name
    weights = [torch.load(tmp_path / name / final, weights_only=True)["model"] for name in ("loader", "device")]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


def test_loaders_pin_memory_on_cuda():
    cuda_only()
    from cifar10_dist.data.synthetic import make_synthetic

    train, test = make_synthetic(200, 40, 0)
    made = loaders.make_loaders(train, test, batch_size=32, num_workers=2, train_eval_size=0, seed=0)
    assert made.train.pin_memory and made.test.pin_memory


def test_channels_last_and_compile_train_and_save_plain_checkpoints(check_data, tmp_path, record):
    result = run(check_data, tmp_path, "compiled", "--channels_last=True", "--compile=True", "--with_amp=True")
    keys = torch.load(newest_checkpoint(tmp_path / "compiled"), weights_only=True)["model"].keys()
    assert not any(key.startswith("_orig_mod") or key.startswith("module.") for key in keys)
    speeds = [float(x) for x in re.findall(r"epoch \d+ done in [0-9.]+ s \(([0-9.]+) img/s\)", result.stderr)]
    record("training speed, compile + amp + channels_last, epoch 2", speeds[-1], "img/s")


def test_tf32_and_cudnn_benchmark_switch_the_backend_flags():
    cuda_only()
    from cifar10_dist.config import load_config
    from cifar10_dist.training.setup import process_setup

    device = torch.device("cuda", 0)
    process_setup.configure_device_speed(load_config(None, tf32=True, cudnn_benchmark=True), device)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 and torch.backends.cudnn.benchmark
    process_setup.configure_device_speed(
        load_config(None, tf32=False, cudnn_benchmark=True, deterministic=True), device
    )
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert not torch.backends.cudnn.benchmark  # deterministic mode wins


def test_deterministic_runs_are_bit_identical(check_data, tmp_path):
    for name in ("first", "second"):
        run(check_data, tmp_path, name, "--deterministic=True", "--num_epochs=1", "--num_warmup_epochs=0.5")
    final = newest_checkpoint(tmp_path / "first").name
    assert_same_training_state(tmp_path / "first" / final, tmp_path / "second" / final)


def test_evaluation_on_the_gpu_agrees_with_the_cpu(check_data, tmp_path, record):
    run(check_data, tmp_path, "trained", "--num_epochs=1", "--num_warmup_epochs=0.5")
    checkpoint = newest_checkpoint(tmp_path / "trained")
    results = {}
    for where, env in (("gpu", cli_env()), ("cpu", {**cli_env(), "CUDA_VISIBLE_DEVICES": ""})):
        evaluated = run_forked("evaluate", f"--checkpoint={checkpoint}", f"--data_path={check_data}", "--json", env=env)
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        results[where] = json.loads(evaluated.stdout.strip().splitlines()[-1])
    gpu, cpu = results["gpu"], results["cpu"]
    # cuDNN (TF32 by default) and oneDNN sum in other orders: an image near a tie may change class, no more
    # than 1 in 1,000 (the first H200 check moved 1 of 10,000); the loss agrees to 1e-3
    images = sum(map(sum, cpu["confusion_matrix"]))
    moved = (
        sum(
            abs(g - c)
            for gpu_row, cpu_row in zip(gpu["confusion_matrix"], cpu["confusion_matrix"])
            for g, c in zip(gpu_row, cpu_row)
        )
        // 2
    )
    record("predictions moved between GPU and CPU", moved, f"of {images}")
    record("evaluation loss |gpu - cpu|", abs(gpu["loss"] - cpu["loss"]))
    assert moved <= images / 1000, (gpu["confusion_matrix"], cpu["confusion_matrix"])
    assert gpu["loss"] == pytest.approx(cpu["loss"], abs=1e-3)


def test_the_batch_size_finder_grows_until_out_of_memory_and_keeps_a_margin(record):
    """On CUDA: the largest simple_cnn batch at 128 px that fits, found by doubling until out of memory and
    bisecting back, then 90% of it; a batch that large really trains, and twice the largest does not fit."""
    cuda_only()
    from cifar10_dist import api
    from cifar10_dist.training.before_training import batch_sizes

    result = api.batch_size(
        None, [256], budget_seconds=1.0, model="simple_cnn", image_size=128, dataset="folder", data_path="unused"
    )
    assert result.device == "cuda" and result.batch_size > 256
    record("batch-size finder: suggested batch (simple_cnn, 128 px)", result.batch_size)
    from cifar10_dist.training.setup import plan

    config = api.resolve(None, model="simple_cnn", image_size=128, dataset="folder", data_path="unused")
    the_plan = plan.settle(config, torch.device("cuda"), plan.DataFacts.classes_only(10), report=False)
    config, precision = the_plan.config, the_plan.precision
    fits = batch_sizes.fits_on_gpu(config, torch.device("cuda"), precision)
    assert fits(result.batch_size)
    assert not fits(int(result.batch_size / batch_sizes.GPU_MARGIN) * 2 + 64)


def resumed_alike(data: Path, output: Path, flags: list[str]):
    """A run ("whole") and the run resumed from its first checkpoint ("resumed") end with the same training
    state; the whole run's process result."""
    whole = run(data, output, "whole", *flags)
    steps = re.findall(r"training_checkpoint_(\d+)\.pt", " ".join(p.name for p in (output / "whole").iterdir()))
    middle = min(int(step) for step in steps)
    run(data, output, "resumed", *flags, f"--resume_from={output / 'whole' / f'training_checkpoint_{middle}.pt'}")
    final = newest_checkpoint(output / "whole").name
    assert_same_training_state(output / "whole" / final, output / "resumed" / final)
    return whole


def checkpoint_inside(data: Path) -> str:
    """A checkpoint inside the first epoch: of real CIFAR-10's 195 iterations, or of the rehearsal's 7."""
    return f"--checkpoint_every={150 if is_real(data) else 5}"


def test_progressive_resizing_and_data_selection_train_on_the_gpu_and_resume_exactly(check_data, tmp_path, record):
    """Both levers on the device path (data_on_device, bf16 where the GPU has it): a run resumed mid-epoch, while
    still selecting and at a reduced size, ends with the uninterrupted run's weights; evaluation at full size."""
    levers = [
        "--resize_start=0.5",
        "--resize_until=0.75",
        "--select_hardest_fraction=0.5",
        "--data_on_device=True",
        "--with_amp=auto",
        "--deterministic=True",
        checkpoint_inside(check_data),
    ]
    whole = resumed_alike(check_data, tmp_path, levers)
    assert "progressive resizing: 16 px in epoch 1, 24 px in epoch 2 (full size 32 px)" in whole.stderr
    record("test accuracy, 2 epochs with resizing and selection", final_test(tmp_path / "whole")["accuracy"])

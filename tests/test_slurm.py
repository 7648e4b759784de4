"""The Slurm job scripts: shellcheck, the config keys they pass, and cpu_gloo.sbatch run for real with a
stand-in srun/scontrol (tests/fake_slurm): 2 tasks train, USR1 before the time limit -> checkpoint and
requeue, the requeued job resumes and finishes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from cifar10_dist.config import FIELDS
from tests.conftest import REPO, SLOWLY, TINY_WIDTH, free_slurm_job_id, job_script_environment, stop_all, wait_for_file

SLURM_DIR = REPO / "scripts" / "slurm"
JOB_SCRIPTS = sorted(SLURM_DIR.glob("*.sbatch"))
RUN_SCRIPTS = [script for script in JOB_SCRIPTS if script.name != "tune_array.sbatch"]
SHELL_FILES = [
    *JOB_SCRIPTS,
    SLURM_DIR / "common.sh",
    *sorted((REPO / "scripts").glob("*.sh")),
    REPO / ".ci" / "run",
    REPO / "tests" / "fake_slurm" / "scontrol",
]


def test_shellcheck_passes_on_every_shell_script():
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing: .ci/run installs it (apt-get install shellcheck)")
        pytest.skip("shellcheck is not installed")
    result = subprocess.run(["shellcheck", "-x", *map(str, SHELL_FILES)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def run_command_of(script: Path) -> str:
    """The `cifar10_dist run ...` command of a job script, continuation lines joined."""
    text = script.read_text().replace("\\\n", " ")
    (command,) = [line for line in text.splitlines() if "cifar10_dist run" in line]
    return command[command.index("cifar10_dist run") :]


@pytest.mark.parametrize("script", RUN_SCRIPTS, ids=lambda path: path.name)
def test_job_script_passes_known_keys_and_supports_requeue(script):
    keys = re.findall(r"--(\w+)=", run_command_of(script))
    assert keys and set(keys) <= {*FIELDS, "config"}, set(keys) - FIELDS.keys()
    text = script.read_text()
    assert "--resume_from=auto" in text and '--run_name="job-$SLURM_JOB_ID"' in text
    assert "#SBATCH --requeue" in text and re.search(r"#SBATCH --signal=B:USR1@\d+", text)
    assert ("stage_dataset" in text or '--cache_dir="$(node_local_dir)' in text) and "run_step srun" in text


def test_job_scripts_cover_every_documented_mode():
    assert {path.name for path in JOB_SCRIPTS} == {
        "one_gpu.sbatch",
        "one_node_gpus.sbatch",
        "multi_node.sbatch",
        "cpu_gloo.sbatch",
        "shared_gpu.sbatch",
        "tune_array.sbatch",
        "image_folder.sbatch",
    }
    assert "--gres-flags=allow-task-sharing" in (SLURM_DIR / "shared_gpu.sbatch").read_text()


def job_environment(tmp_path: Path, data: Path, job_id: str, model: str) -> dict[str, str]:
    """The job's variables, with a config of 3 epochs of ``model`` (slow_cnn, SLOWLY: time to signal it)."""
    tiny = {
        "model": model,
        "model_kwargs": {"width": TINY_WIDTH},
        "channels_last": True,
        "batch_size": 32,
        "num_epochs": 3,
        "num_warmup_epochs": 1,
        "learning_rate": 0.1,
        "train_eval_size": 100,
        "checkpoint_every": 5,
        "log_every_iters": 50,
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    return {
        **job_script_environment(),
        "SLURM_JOB_ID": job_id,
        "SLURM_SUBMIT_DIR": str(REPO),
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "2",
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_TMPDIR": str(tmp_path / "node-local"),
        "CIFAR10_DATA": str(data),
        "CONFIG": str(tmp_path / "tiny.yaml"),
        "OUTPUT_PATH": str(tmp_path / "out"),
        "FAKE_SLURM_LOG": str(tmp_path / "slurm.log"),
        **SLOWLY,
    }


@pytest.mark.slow
def test_cpu_job_checkpoints_before_the_time_limit_and_the_requeued_job_finishes(small_dataset, tmp_path, slow_cnn):
    job_id = free_slurm_job_id()
    env = job_environment(tmp_path, small_dataset, job_id, slow_cnn)
    run_dir = tmp_path / "out" / f"job-{job_id}"
    job = subprocess.Popen(
        ["bash", str(SLURM_DIR / "cpu_gloo.sbatch")],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_file(run_dir, "training_checkpoint_*.pt", job)
        job.send_signal(signal.SIGUSR1)  # what `#SBATCH --signal=B:USR1@300` sends before the time limit
        _, stderr = job.communicate(timeout=120)
    finally:
        stop_all(job)
    assert job.returncode == 0, stderr[-3000:]
    assert (tmp_path / "slurm.log").read_text() == f"requeue {job_id}\n"
    assert (tmp_path / "node-local" / "cifar10" / "cifar-10-batches-py" / "data_batch_1").is_file()  # staged
    stopped_at = max(int(p.stem.rsplit("_", 1)[1]) for p in run_dir.glob("training_checkpoint_*.pt"))
    assert 5 <= stopped_at < 54, stopped_at  # 600 images, batch 32: 18 iterations x 3 epochs
    assert "stopping at a checkpoint" in stderr

    requeued = subprocess.run(
        ["bash", str(SLURM_DIR / "cpu_gloo.sbatch")],
        cwd=REPO,
        env={**env, "SLOW_STEP_SECONDS": "0"},  # (nothing to signal in the requeued job)
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert f"at iteration {stopped_at}" in requeued.stderr
    assert "distributed: backend gloo, world size 2" in requeued.stderr
    final = torch.load(run_dir / "training_checkpoint_54.pt", weights_only=True)
    assert final["trainer"]["iteration"] == 54 and final["meta"]["world_size"] == 2

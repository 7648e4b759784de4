"""Every way of starting the same 2-process training gives the same final weights as 2 spawned processes:
two torchrun "nodes" (static and c10d rendezvous), internal spawning over two nodes, file:// init,
and the environment that srun gives its tasks. The "nodes" are two launchers on this machine over loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from tests.conftest import (
    TINY,
    assert_same_training_state,
    cli_env,
    free_slurm_job_id,
    run_in_this_process,
    start_forked,
    stop_all,
)

FINAL = "training_checkpoint_36.pt"  # 600 images, global batch 32, 2 epochs
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # as each of the 2 spawned reference processes has on 2 cores


def reference_checkpoint(spawned_run) -> Path:
    result, output = spawned_run
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = output.iterdir()
    return run_dir / FINAL


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_together(*processes: subprocess.Popen, timeout: float = 300) -> list[tuple[int, str, str]]:
    """Wait for processes started together; kill all of them if any hangs."""
    results = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=timeout)
            results.append((process.returncode, stdout, stderr))
    finally:
        for process in processes:
            stop_all(process)
    for code, _, stderr in results:
        assert code == 0, stderr[-3000:]
    return results


def training_args(data: Path, output: Path) -> list[str]:
    return ["run", *TINY, "--backend=gloo", f"--data_path={data}", f"--output_path={output}", "--run_name=same"]


@pytest.mark.slow
def test_two_torchrun_nodes_with_static_master_match_one_node(spawned_run, small_dataset, tmp_path):
    port = free_port()
    nodes = [
        start_forked(
            *training_args(small_dataset, tmp_path),
            env=ONE_THREAD,
            torchrun=[
                "--nnodes=2",
                f"--node_rank={rank}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
            ],
        )
        for rank in (0, 1)
    ]
    (_, stdout, _), _ = run_together(*nodes)
    assert "final test:" in stdout
    assert_same_training_state(tmp_path / "same" / FINAL, reference_checkpoint(spawned_run))


def srun_environment(task: int, tasks: int, nodes: int, job_id: str, local_task: int) -> dict[str, str]:
    """The SLURM_* variables srun gives task number `task` (what Ignite and our launcher read)."""
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(task),
        "SLURM_LOCALID": str(local_task),
        "SLURM_NODEID": str(task if nodes > 1 else 0),
        "SLURM_NTASKS": str(tasks),
        "SLURM_NPROCS": str(tasks),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_SUBMIT_DIR": str(Path.cwd()),
    }


@pytest.mark.slow
def test_torchrun_rendezvous_inside_a_two_node_slurm_job_matches_one_node(spawned_run, small_dataset, tmp_path):
    """scripts/slurm/multi_node.sbatch: one srun task per node runs torchrun with a c10d rendezvous.
    Ignite alone would refuse (RANK from torchrun differs from SLURM_PROCID in a multi-node job)."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        start_forked(
            *training_args(small_dataset, tmp_path),
            env={**srun_environment(node, tasks=2, nodes=2, job_id="4242", local_task=0)},
            torchrun=[
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                "--rdzv_id=4242",
            ],
        )
        for node in (0, 1)
    ]
    results = run_together(*nodes)
    assert sum("final test:" in stdout for _, stdout, _ in results) == 1
    assert_same_training_state(tmp_path / "same" / FINAL, reference_checkpoint(spawned_run))


@pytest.mark.slow
def test_internal_spawning_over_two_nodes_matches_one_node(spawned_run, small_dataset, tmp_path):
    port = free_port()
    nodes = [
        start_forked(
            *training_args(small_dataset, tmp_path),
            "--nnodes=2",
            f"--node_rank={rank}",
            "--nproc_per_node=1",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            env=ONE_THREAD,
        )
        for rank in (0, 1)
    ]
    run_together(*nodes)
    assert_same_training_state(tmp_path / "same" / FINAL, reference_checkpoint(spawned_run))


def test_file_init_method_matches_env_init(spawned_run, small_dataset, tmp_path):
    init_file = tmp_path / "rendezvous"
    result = run_in_this_process(
        *training_args(small_dataset, tmp_path), "--nproc_per_node=2", f"--init_method=file://{init_file}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_training_state(tmp_path / "same" / FINAL, reference_checkpoint(spawned_run))


@pytest.mark.slow
def test_two_srun_tasks_train_together_like_spawned_processes(spawned_run, small_dataset, tmp_path):
    """scripts/slurm/cpu_gloo.sbatch: srun starts one process per task; nothing but SLURM_* tells them apart."""
    job_id = free_slurm_job_id()
    tasks = [  # two peers that train together, each with its own hash seed, as srun starts them
        start_forked(
            *training_args(small_dataset, tmp_path),
            env={
                **srun_environment(task, tasks=2, nodes=1, job_id=job_id, local_task=task),
                **({"PYTHONHASHSEED": str(task + 1)} if task else {}),  # task 0: the server's random one
            },
        )
        for task in (0, 1)
    ]
    results = run_together(*tasks)
    assert "distributed: backend gloo, world size 2" in results[0][2]
    assert_same_training_state(tmp_path / "same" / FINAL, reference_checkpoint(spawned_run))


def test_local_ranks_beyond_the_gpu_count_share_gpus_round_robin(monkeypatch):
    """scripts/slurm/shared_gpu.sbatch: 4 tasks, 1 GPU; Ignite calls torch.cuda.set_device(local_rank)."""
    import torch

    from cifar10_dist.launch import supervision

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    with supervision._gpus_shared_by_local_ranks():
        for local_rank in range(5):
            torch.cuda.set_device(local_rank)
    torch.cuda.set_device(7)  # outside: untouched
    assert chosen == [0, 1, 0, 1, 0, 7]


@pytest.mark.slow
def test_a_script_that_spawns_without_a_main_guard_stops_before_any_worker_starts(small_dataset, tmp_path):
    """Python's spawn and forkserver import the script again in every worker: without the guard each worker would
    start the launch anew. The launcher says so in one line, and nothing starts or is written."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from cifar10_dist import train\n\n"
        f"result = train(model='simple_cnn', data_path='{small_dataset}', num_workers=0, "
        f"backend='gloo', nproc_per_node=2, output_path='{tmp_path / 'out'}')\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=cli_env(), timeout=120
    )
    assert result.returncode == 1
    quoted = script.read_text().splitlines()[2][:57] + "..."
    assert result.stderr.splitlines()[-1] == (
        f"cifar10_dist.errors.UserError: unguarded.py line 3 ({quoted}) starts 2 worker processes without `if "
        '__name__ == "__main__":`: each worker '
        "imports unguarded.py again and would run that line itself; put the call under "
        '`if __name__ == "__main__":` (Python\'s rule for spawned processes)'
    )
    assert "WorkerLost" not in result.stderr and "Timeout" not in result.stderr
    assert not (tmp_path / "out").exists()
    guarded = tmp_path / "guarded.py"
    lines = script.read_text().splitlines()
    guarded.write_text(
        "\n".join(
            [
                *lines[:2],
                'if __name__ == "__main__":',
                "    "
                + lines[2].replace(
                    ")", ", num_epochs=2, epoch_length=2, train_eval_size=0, model_kwargs={'width': 8}, figures=False)"
                ),
                "    print(result.test.num_samples)",
            ]
        )
        + "\n"
    )
    trained = subprocess.run(
        [sys.executable, str(guarded)], capture_output=True, text=True, cwd=tmp_path, env=cli_env(), timeout=300
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run_dir,) = (tmp_path / "out").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert trained.stdout.strip().splitlines()[-1] == str(summary["final"]["test"]["num_samples"])


def test_a_script_read_from_standard_input_that_spawns_is_refused_before_anything_starts(small_dataset, tmp_path):
    """``python - < script.py`` (a heredoc in a job script): every worker would try to run the main script again from
    a file named <stdin>, and each died of FileNotFoundError. The launcher says so in one line first; nothing is
    started or written, and torch is not imported."""
    script = (
        "import sys\nfrom cifar10_dist import train\n\n"
        f"try:\n    train(model='simple_cnn', data_path='{small_dataset}', num_workers=0, backend='gloo', "
        f"nproc_per_node=2, output_path='{tmp_path / 'out'}')\n"
        "finally:\n    print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-"], input=script, capture_output=True, text=True, cwd=tmp_path, env=cli_env(), timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "cifar10_dist.errors.UserError: the script that starts 2 worker processes was read from <stdin> (standard "
        "input), which the workers cannot read again: each imports the main script anew (Python's rule for spawned "
        'processes); save it to a file, put the launch under `if __name__ == "__main__":`, and run that file'
    )
    assert result.stdout.strip() == "False"  # torch not imported
    assert not (tmp_path / "out").exists()


def test_nodes_without_a_shared_output_folder_are_refused_before_training(small_dataset, tmp_path):
    """Two nodes on loopback, each given a folder of its own as output_path (what nodes without a shared
    filesystem see): both stop with exit 2 before training, node 0 with one line naming the folder and rank 1."""
    port, wait = free_port(), {**ONE_THREAD, "CIFAR10_DIST_SHARED_FOLDER_WAIT": "1"}
    nodes = [
        start_forked(
            "run",
            *TINY,
            "--backend=gloo",
            f"--data_path={small_dataset}",
            "--run_name=apart",
            f"--output_path={tmp_path / f'node{rank}'}",
            "--nnodes=2",
            f"--node_rank={rank}",
            "--nproc_per_node=1",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            env=wait,
        )
        for rank in (0, 1)
    ]
    results = []
    try:
        results = [(node.communicate(timeout=300), node.returncode) for node in nodes]
    finally:
        for node in nodes:
            stop_all(node)
    for (_, stderr), code in results:
        assert code == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert (
        results[0][0][1]
        .strip()
        .splitlines()[-1]
        .startswith(f"error: output_path='{tmp_path / 'node0'}' is not one folder shared by every process: rank 1 on ")
    )
    assert not list((tmp_path / "node0" / "apart").glob("*.pt")) and not (tmp_path / "node1" / "apart").exists()


def _start_a_worker_through_the_forkserver(parents: int) -> int:
    """In a forked child: start one process through the forkserver as a launch does. Its exit code: 0 when it ran
    through a server of the child's own, 4 when starting the server failed (ChildProcessError)."""
    import multiprocessing
    from multiprocessing import forkserver

    from cifar10_dist.launch import start_method

    try:
        start_method.start_forkserver()
    except ChildProcessError:
        return 4
    worker = multiprocessing.get_context("forkserver").Process(target=int)
    worker.start()
    worker.join(60)
    return 3 if worker.exitcode != 0 else 0 if forkserver._forkserver._forkserver_pid != parents else 5


def test_a_process_forked_after_a_launch_starts_a_forkserver_of_its_own():
    """A script that trains with spawned workers, then forks and launches again in the child (a job runner, a
    process pool): the child inherits Python's record of the parent's forkserver, which is not its child
    (python/cpython#86354). It starts its own and its workers run; before, ensure_running failed in it with
    ChildProcessError. A server this test starts is stopped after it (in-process runs keep theirs for reuse)."""
    import multiprocessing
    import os
    from multiprocessing import forkserver

    from cifar10_dist.launch import start_method

    server = forkserver._forkserver
    started_here = server._forkserver_pid is None
    preload = server._preload_modules
    if started_here:  # (a server for this test alone: without the runs' preload, seconds of imports)
        multiprocessing.set_forkserver_preload([])
    start_method.start_forkserver()  # the parent's (this process's), as a launch leaves it
    parents = server._forkserver_pid
    try:
        child = os.fork()
        if child == 0:  # (only the standard library runs here: no thread of torch's is needed)
            code = 6  # (whatever happens, this copy of the test process ends here)
            try:
                multiprocessing.set_forkserver_preload([])  # (the child's own server: no imports of the runs')
                code = _start_a_worker_through_the_forkserver(parents)
                if server._forkserver_pid not in (None, parents):
                    server._stop()  # the child's own server, and its socket
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert server._forkserver_pid == parents  # the parent's own server untouched
    finally:
        if started_here:
            server._stop()
            multiprocessing.set_forkserver_preload(preload)

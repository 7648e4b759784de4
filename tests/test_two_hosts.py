"""Two nodes for real (issue 74): two network namespaces joined by a rate-limited veth pair (benchmarks.two_hosts), a
process in each, cifar10-dist's own multi-node launch across them: a run from the start and a run resumed mid-epoch
end bit-identical to the 2-process reference with the same test numbers; and nothing the harness made outlives it,
also when a test fails inside it. (Nodes without one shared output folder: tests/test_launch_modes.py, on loopback.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from benchmarks.two_hosts import two_hosts, unavailable
from tests.conftest import LONG, REPO, assert_same_training_state, job_script_environment

STAND_IN = REPO / "tests" / "served_python" / "python"

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"two hosts cannot be made here: {unavailable()}")


def run_two_nodes(hosts, *args: str, output: list[Path]) -> list[subprocess.CompletedProcess]:
    """``cifar10-dist run ARGS`` as two nodes, node N writing to output[N]: started in its namespace by the stand-in
    python of job scripts, which the CLI server forks there, each node with a hash seed of its own, as the new
    interpreters of two machines have (tests/cli_server.py)."""
    logs = Path(tempfile.mkdtemp(prefix="two-nodes-"))
    streams = [(open(logs / f"out{node}", "w+"), open(logs / f"err{node}", "w+")) for node in (0, 1)]  # not pipes:
    # a node blocked on a full pipe would hold the other in its collectives
    processes = [
        hosts.start(
            node,
            [
                str(STAND_IN),
                "-m",
                "cifar10_dist",
                "run",
                *args,
                *hosts.node_flags(node),
                f"--output_path={output[node]}",
            ],
            # OMP_NUM_THREADS: as 2 processes of one node
            env={
                **job_script_environment(),
                "OMP_NUM_THREADS": "1",
                **({"PYTHONHASHSEED": str(node + 1)} if node else {}),  # node 0: the server's random one
            },
            stdout=streams[node][0],
            stderr=streams[node][1],
        )
        for node in (0, 1)
    ]
    finished = []
    for process, (out, err) in zip(processes, streams):
        process.wait(timeout=300)
        out.seek(0), err.seek(0)
        finished.append(subprocess.CompletedProcess(process.args, process.returncode, out.read(), err.read()))
        out.close(), err.close()
    shutil.rmtree(logs)
    return finished


def test_two_nodes_train_and_resume_exactly_as_two_local_processes(small_dataset, long_spawned_reference, tmp_path):
    reference = long_spawned_reference.parent
    common = [*LONG, f"--data_path={small_dataset}", "--checkpoint_every=25"]
    with two_hosts("1gbit") as hosts:
        whole = run_two_nodes(hosts, *common, "--run_name=whole", output=[tmp_path, tmp_path])
        resumed = run_two_nodes(
            hosts,
            *common,
            "--run_name=resumed",
            f"--resume_from={reference / 'training_checkpoint_50.pt'}",
            output=[tmp_path, tmp_path],
        )
        sent = hosts.sent_bytes(0)
    for result in (*whole, *resumed):
        assert result.returncode == 0, result.stderr[-3000:]
    assert sent > 100_000  # the gradients went over the link
    expected = json.loads((reference / "summary.json").read_text())["final"]["test"]
    for name in ("whole", "resumed"):
        assert_same_training_state(long_spawned_reference, tmp_path / name / "training_checkpoint_72.pt")
        assert json.loads((tmp_path / name / "summary.json").read_text())["final"]["test"] == expected
    assert whole[0].stdout.count("final test:") == 1 and "final test:" not in whole[1].stdout  # node 0 reports


def test_the_harness_leaves_no_namespace_link_or_process_behind_even_when_the_body_fails():
    names = None
    with pytest.raises(RuntimeError, match="a failing test"):
        with two_hosts("100mbit") as hosts:
            names = hosts.namespaces
            sleeper = hosts.start(1, ["sleep", "600"])
            assert hosts.sent_bytes(0) >= 0
            raise RuntimeError("a failing test")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert names is not None and not any(name in listed for name in names)
    assert sleeper.poll() is not None
    assert shutil.which("ip")

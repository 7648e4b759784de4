"""Two nodes for real (issue 74): two network namespaces joined by a rate-limited veth pair (benchmarks.two_hosts), a
process in each, cifar10-dist's own multi-node launch across them: a run from the start and a run resumed mid-epoch
end bit-identical to the 2-process reference with the same test numbers; and nothing the harness made outlives it,
also when a test fails inside it. (Nodes without one shared output folder: tests/test_launch_modes.py, on loopback.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from benchmarks.two_hosts import two_hosts, unavailable
from tests.conftest import LONG, REPO, SLOWLY, assert_same_training_state, job_script_environment

STAND_IN = REPO / "tests" / "served_python" / "python"
TINY_TWO = [*LONG, "--num_epochs=1", "--num_warmup_epochs=0.5"]

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"two hosts cannot be made here: {unavailable()}")


@dataclass
class Node:
    """One node's process, started in its namespace, and its output (files, not pipes: a node blocked on a full
    pipe would hold the other in its collectives)."""

    process: subprocess.Popen
    out: IO[str]
    err: IO[str]

    def finished(self, timeout: float = 300) -> subprocess.CompletedProcess:
        self.process.wait(timeout=timeout)
        self.out.seek(0), self.err.seek(0)
        done = subprocess.CompletedProcess(self.process.args, self.process.returncode, self.out.read(), self.err.read())
        self.out.close(), self.err.close()
        return done


def start_two_nodes(
    hosts, *args: str, output: list[Path], flags: list[list[str]] | None = None, env=None
) -> list[Node]:
    """``cifar10-dist run ARGS`` as two nodes, node N writing to output[N] (``flags[N]``: its launch flags, by default
    the harness's): started in its namespace by the stand-in python of job scripts, which the CLI server forks
    there, each node with a hash seed of its own, as the new interpreters of two machines have
    (tests/cli_server.py), in a session of its own (``os.killpg`` stops a node)."""
    nodes = []
    for node in (0, 1):
        launch = flags[node] if flags is not None else hosts.node_flags(node)
        command = [str(STAND_IN), "-m", "cifar10_dist", "run", *args, *launch, f"--output_path={output[node]}"]
        environment = {
            **job_script_environment(),
            "OMP_NUM_THREADS": "1",  # as 2 processes of one node
            **({"PYTHONHASHSEED": str(node + 1)} if node else {}),  # node 0: the server's random one
            **(env or {}),
        }
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        process = hosts.start(node, command, env=environment, stdout=out, stderr=err, start_new_session=True)
        nodes.append(Node(process, out, err))
    return nodes


def run_two_nodes(hosts, *args: str, output: list[Path]) -> list[subprocess.CompletedProcess]:
    """``start_two_nodes``, to the end of both."""
    return [node.finished() for node in start_two_nodes(hosts, *args, output=output)]


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


# ---------------------------------------------------------------- faults across hosts (issue 84)

# long: stopped mid-way; dist_timeout also bounds how long node 0 waits for the other to join (a busy machine
# forks and starts a node in seconds)
FAULTY = ["--num_epochs=30", "--checkpoint_every=5", "--run_name=job"]
JOINED_WITHIN = 10  # dist_timeout, where the test does not wait it out


def when_trained(output: Path, nodes: list[Node]) -> None:
    """Wait for the first checkpoint (the group formed and trains)."""
    deadline = time.monotonic() + 120
    while not list((output / "job").glob("training_checkpoint_*.pt")):
        if time.monotonic() > deadline or any(node.process.poll() is not None for node in nodes):
            ended = [node.finished(timeout=60) for node in nodes if node.process.poll() is not None]
            raise AssertionError(f"no checkpoint: {[(done.returncode, done.stderr[-1500:]) for done in ended]}")
        time.sleep(0.05)


def last_line(done: subprocess.CompletedProcess) -> str:
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("dying", [0, 1])
def test_a_node_that_dies_ends_the_other_in_one_line_naming_it_with_exit_4(small_dataset, slow_cnn, tmp_path, dying):
    args = [*LONG, *FAULTY, f"--dist_timeout={JOINED_WITHIN}", f"--model={slow_cnn}", f"--data_path={small_dataset}"]
    with two_hosts("20mbit") as hosts:
        nodes = start_two_nodes(hosts, *args, output=[tmp_path, tmp_path], env=SLOWLY)
        when_trained(tmp_path, nodes)
        hosts.kill_node(dying)
        killed_at = time.monotonic()
        survivor = nodes[1 - dying].finished(timeout=60)
        seconds = time.monotonic() - killed_at
        nodes[dying].finished()
    assert survivor.returncode == 4, survivor.stderr[-3000:]
    assert seconds < 5  # a closed connection, not dist_timeout
    assert "Traceback" not in survivor.stderr
    line = last_line(survivor)
    assert line.startswith(f"error: another process went away: rank {1 - dying}'s connection")
    assert f"(the processes of other nodes: rank {dying} on " in line and f" at 10.77.0.{dying + 1})" in line
    assert line.endswith(
        "the others were stopped: rerun with --resume_from=auto --run_name=job to continue from the last checkpoint"
    )


def test_a_wrong_master_addr_on_one_node_is_one_line_on_each(small_dataset, tmp_path):
    args = [*TINY_TWO, "--dist_timeout=2", f"--data_path={small_dataset}"]
    with two_hosts("20mbit") as hosts:
        wrong = [
            flag if not flag.startswith("--master_addr=") else "--master_addr=10.77.0.2" for flag in hosts.node_flags(1)
        ]
        nodes = start_two_nodes(hosts, *args, output=[tmp_path, tmp_path], flags=[hosts.node_flags(0), wrong])
        first, second = (node.finished(timeout=120) for node in nodes)
    assert (first.returncode, second.returncode) == (4, 2)
    assert first.stderr.strip() == (
        "error: only 1 of 2 processes joined node 0 at 10.77.0.1:29500 within dist_timeout=2 s: start every node "
        "with the same --master_addr and --master_port: node 0's address as the other nodes reach it, and a port open "
        "between them"
    )
    assert second.stderr.strip().startswith("error: this process could not reach node 0 at 10.77.0.2:29500 (")
    assert len(second.stderr.strip().splitlines()) == 1  # torch's retries and their C++ stacks held back
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_cut_link_names_the_node_that_stopped_answering(small_dataset, slow_cnn, tmp_path):
    """Each node waits dist_timeout for the other's collective, then names it. 6 s: node 0 also waits that long for
    node 1 to join, which a busy machine does in a second or two (both are forked from the CLI server)."""
    args = [*LONG, *FAULTY, "--dist_timeout=6", f"--model={slow_cnn}", f"--data_path={small_dataset}"]
    with two_hosts("20mbit") as hosts:
        nodes = start_two_nodes(hosts, *args, output=[tmp_path, tmp_path], env=SLOWLY)
        when_trained(tmp_path, nodes)
        subprocess.run(["ip", "-n", hosts.namespaces[1], "link", "set", hosts.interfaces[1], "down"], check=True)
        ended = [node.finished(timeout=60) for node in nodes]
    for node, done in enumerate(ended):
        assert done.returncode == 4, done.stderr[-3000:]
        assert last_line(done).startswith(
            f"error: a process on another node stopped answering: rank {node} waited 6 s (dist_timeout) for it in a "
            f"collective operation (the processes of other nodes: rank {1 - node} on "
        )
        assert f" at 10.77.0.{2 - node}); the others were stopped" in last_line(done)

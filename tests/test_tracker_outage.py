"""A tracking server that stops answering never ends a run: a real ``mlflow server`` on a loopback port, reached
through a gate (a relay on a port of its own) that is shut mid-run, as a stopped server is: connections refused and
those open cut (the run paused meanwhile with SIGSTOP, so that the order of events is the test's, not the
clock's), opened again, shut for good. One warning per outage naming the store, metrics.jsonl complete, what the store
missed sent once it answers again, and what it never got noted in summary.json and by ``report``."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from cifar10_dist.outputs.tracker_guard import RETRY_VARIABLE
from tests.conftest import TINY, kill_when, run_forked, start_forked, stop_all, wait_until

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("flask") is None,
    reason="mlflow server needs the full mlflow package (the dev extra installs it)",
)

EPOCHS = 8
RUN = [
    *TINY,
    "--dataset=synthetic",
    "--synthetic_size=320",
    "--train_eval_size=0",
    "--validate_every=1",
    f"--num_epochs={EPOCHS}",
    "--checkpoint_every=1000",
    "--with_mlflow",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on 127.0.0.1:port with a SQLite store and artifacts in ``folder``; start and kill."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port, self.process = folder, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{self.folder / 'store.db'}",
            "--artifacts-destination",
            str(self.folder / "artifacts"),
        ]
        log = (self.folder / "server.log").open("ab")
        # without its job runner: 8 more processes importing mlflow (about 16 s of a core on a 2-core machine) for
        # the server's GenAI jobs, which no run uses
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.process = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except OSError:
                assert self.process.poll() is None, (self.folder / "server.log").read_text()[-3000:]
                time.sleep(0.2)
        raise AssertionError(f"mlflow server did not answer on {self.uri} within 120 s")

    def kill(self) -> None:
        if self.process is not None:
            stop_all(self.process)
            self.process = None


class Gate:
    """A loopback port in front of the MLflow server. Open, each connection to it is relayed to the server; shut,
    it refuses connections and cuts the open ones, as a stopped server does, while the server itself keeps running
    (an outage that ends at once, without a restart's seconds)."""

    def __init__(self, server: MlflowServer) -> None:
        self.target, self.port = server.port, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.listener: socket.socket | None = None
        self.relayed: list[socket.socket] = []

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def shut(self) -> None:
        listener, self.listener = self.listener, None
        for one in [*([listener] if listener is not None else []), *self.relayed]:
            with contextlib.suppress(OSError):
                one.shutdown(socket.SHUT_RDWR)  # (wakes the accept, ends both directions of a relayed connection)
            one.close()
        self.relayed.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return  # shut
            self.relayed += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def evaluations(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [json.loads(line)["epoch"] for line in lines if '"evaluation"' in line]


def paused_after_epoch(run: subprocess.Popen, run_dir: Path, epoch: int) -> None:
    """Wait until the run has evaluated epoch ``epoch``, then stop it (SIGSTOP to its process group)."""
    deadline = time.monotonic() + 120
    while epoch not in evaluations(run_dir):
        assert run.poll() is None and time.monotonic() < deadline, f"the run ended before epoch {epoch}"
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGSTOP)


def paused_after_the_warning(run: subprocess.Popen, run_dir: Path) -> int:
    """Wait for the run's warning that the store does not answer, then stop the run at its next evaluation."""
    deadline = time.monotonic() + 120
    while "does not answer" not in ((run_dir / "run.log").read_text() if (run_dir / "run.log").is_file() else ""):
        assert run.poll() is None and time.monotonic() < deadline, "the run ended without the warning"
        time.sleep(0.02)
    epoch = max(evaluations(run_dir)) + 1
    paused_after_epoch(run, run_dir, epoch)
    return epoch


def go_on(run: subprocess.Popen) -> None:
    os.killpg(run.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    """One MlflowServer for this file's tests (its start costs about 10 s) behind one Gate; the server is killed at
    the end whatever they did (it runs in a session of its own)."""
    shared = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    gate = Gate(shared)
    try:
        shared.start()
        yield gate
    finally:
        gate.shut()
        shared.kill()


@pytest.fixture
def server(module_server):
    """The file's server through its gate, opened if a test before this one shut it (the outage test does)."""
    if module_server.listener is None:
        module_server.open()
    return module_server


@pytest.mark.slow
def test_a_run_killed_after_its_store_got_later_steps_and_resumed_logs_no_step_twice(server, tmp_path, slow_cnn):
    """SIGKILL as soon as the store has epoch 2's metrics (10 iterations an epoch, a checkpoint every 15): the store
    then has steps after the newest checkpoint, which the resume trains, evaluates and logs again; the store gets
    none of them a second time, and every step of the run once."""
    from mlflow.tracking import MlflowClient

    command = [
        "run",
        *TINY,
        f"--model={slow_cnn}",
        "--dataset=synthetic",
        "--synthetic_size=320",
        "--train_eval_size=0",
        "--validate_every=1",
        "--num_epochs=6",
        "--checkpoint_every=15",
        "--log_every_iters=1",
        "--with_mlflow",
        f"--mlflow_tracking_uri={server.uri}",
        f"--output_path={tmp_path}",
        "--run_name=k",
    ]
    run_dir, client = tmp_path / "k", MlflowClient(server.uri)
    run = start_forked(*command, env={"SLOW_STEP_SECONDS": "0.1"})  # time to see the store and kill
    try:
        wait_until(run, (run_dir / "mlflow.json").is_file, "the run ended without an MLflow run")
        run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
        kill_when(
            run,
            lambda: 2 in [metric.step for metric in client.get_metric_history(run_id, "test/accuracy")],
            "the run ended before the store got epoch 2",
        )
    finally:
        stop_all(run)
    newest = max(int(path.stem.rsplit("_", 1)[1]) for path in run_dir.glob("training_checkpoint_*.pt"))
    logged = max(metric.step for metric in client.get_metric_history(run_id, "training/batch_loss"))
    assert newest < logged < 60  # the store had steps the resume trains again
    resumed = run_forked(*command, "--resume_from=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    keys = client.get_run(run_id).data.metrics
    assert {"test/accuracy", "training/batch_loss", "training/epoch_loss"} <= set(keys)
    for key in keys:
        steps = [metric.step for metric in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))
    assert sorted(metric.step for metric in client.get_metric_history(run_id, "test/accuracy")) == [1, 2, 3, 4, 5, 6]
    assert sorted(metric.step for metric in client.get_metric_history(run_id, "training/batch_loss")) == list(
        range(1, 61)
    )


@pytest.mark.slow
def test_a_tracking_server_that_stops_answering_mid_run_never_ends_the_run(server, tmp_path):
    back, run_dir = train_through_outages(server, tmp_path / "out", "back", comes_back=True)
    stderr = back.stderr
    assert back.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if "does not answer" in line]
    assert len(warnings) == 1 and f"mlflow: the store at {server.uri} does not answer" in warnings[0], warnings
    assert f"mlflow: the store at {server.uri} answers again" in stderr
    assert evaluations(run_dir) == list(range(1, EPOCHS + 1))
    assert json.loads((run_dir / "summary.json").read_text())["trackers"] == {}  # it got everything in the end
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.uri)
    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    history = client.get_metric_history(run_id, "test/accuracy")
    assert sorted(metric.step for metric in history) == list(range(1, EPOCHS + 1))  # the missed sent when it came back
    assert client.get_run(run_id).info.status == "FINISHED"
    assert {"summary.json", "curves.png"} <= {item.path for item in client.list_artifacts(run_id)}

    gone, run_dir = train_through_outages(server, tmp_path / "out", "gone", comes_back=False)
    assert gone.returncode == 0, gone.stderr[-3000:]
    assert "Traceback" not in gone.stderr, gone.stderr[-3000:]
    assert gone.took < 90, gone.took  # the end waits END_WAIT_SECONDS for the store, not MLflow's minutes of retries
    assert evaluations(run_dir) == list(range(1, EPOCHS + 1))  # the local record is complete
    note = json.loads((run_dir / "summary.json").read_text())["trackers"]["mlflow"]
    assert note["store"] == server.uri and note["unsent_metrics"] > 0 and note["missed"] == ["artifacts", "end"]
    assert (
        f"mlflow: the store at {server.uri} did not get {note['unsent_metrics']} metric values, artifacts, end"
        in gone.stderr
    )
    report = run_forked("report", str(run_dir), f"--output={tmp_path / 'report.png'}")
    assert report.returncode == 0, report.stderr[-2000:]
    assert (
        f"gone: mlflow at {server.uri} did not get {note['unsent_metrics']} metric values, artifacts, end"
        in report.stdout
    )


RETRY = 1.0  # seconds between the run's tries of a store that did not answer (CIFAR10_DIST_TRACKER_RETRY_SECONDS)


def train_through_outages(
    server: Gate, output: Path, name: str, comes_back: bool
) -> tuple[subprocess.CompletedProcess, Path]:
    """A run whose store stops after epoch 1 and, ``comes_back``, answers again two or more epochs later (the test
    waits RETRY seconds meanwhile, so the run's next flush tries it; MLflow retries no request there, so the outage
    is seen before MLflow's own retries could hide it). ``took``: seconds from the outage to the end."""
    run_dir = output / name
    env = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", RETRY_VARIABLE: str(RETRY)} if comes_back else None
    where = (f"--mlflow_tracking_uri={server.uri}", f"--output_path={output}", f"--run_name={name}")
    run = start_forked("run", *RUN, "--figures=True", *where, env=env)  # (curves.png among the artifacts)
    try:
        paused_after_epoch(run, run_dir, 1)
        server.shut()
        killed_at = time.monotonic()
        go_on(run)
        if comes_back:
            assert paused_after_the_warning(run, run_dir) < EPOCHS
            paused_at = time.monotonic()
            server.open()
            time.sleep(max(0.0, RETRY - (time.monotonic() - paused_at)))
            go_on(run)
        stdout, stderr = run.communicate(timeout=300)
    finally:
        stop_all(run)
    result = subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)
    result.took = time.monotonic() - killed_at
    return result, run_dir

"""Weights & Biases tracking, offline (no WANDB_API_KEY here), read back from the run's own .wandb files: the
config with the provenance, the metrics TensorBoard gets at the same steps, the summary, the run's files and the
best model as artifacts, one W&B run continued by a resume, tuning trials grouped under their study, and one line
when W&B is missing, and a resume after a SIGKILL that sends no step twice. The files are W&B's transaction log
(LevelDB's log format of W&B's protobuf records), read with outputs.wandb_history."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from cifar10_dist.outputs import wandb_history
from tests.conftest import TINY, cli_env, kill_when, run_forked, run_in_this_process, start_forked, stop_all

# (wandb imported by the runs that use it: not by collection, in every test process)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="the wandb extra is not installed")

RUN = [
    *TINY,
    "--dataset=synthetic",
    "--synthetic_size=320",
    "--train_eval_size=0",
    "--validate_every=1",
    "--checkpoint_every=10",
    "--with_wandb",
]


def sessions(run_dir: Path) -> list[list]:
    """The records of each W&B session of the run folder (one per launch), oldest first."""
    return [wandb_history.records(path) for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))]


def of_kind(found: list, kind: str) -> list:
    return [getattr(record, kind) for record in found if record.WhichOneof("record_type") == kind]


def values(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def rows(found: list) -> list[dict]:
    """The metric rows (run.log calls) of one session's records."""
    return [values(history.item) for history in of_kind(found, "history")]


def environment() -> dict[str, str]:
    return {key: value for key, value in cli_env().items() if not key.startswith("WANDB_")}


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """2 epochs, then, as if stopped after the first (its checkpoint the newest), resumed with wandb_log_model: one
    W&B run (id) for the run folder."""
    output = tmp_path_factory.mktemp("wandb")
    first = run_forked("run", *RUN, "--num_epochs=2", f"--output_path={output}", "--run_name=r", env=environment())
    assert first.returncode == 0, first.stderr[-3000:]
    (output / "r" / "training_checkpoint_20.pt").unlink()
    second = run_forked(
        "run",
        *RUN,
        "--num_epochs=2",
        "--resume_from=auto",
        "--wandb_log_model",
        "--figures=True",  # (the pictures among the artifacts)
        f"--output_path={output}",
        "--run_name=r",
        env=environment(),
    )
    assert second.returncode == 0, second.stderr[-3000:]
    return output / "r"


def test_a_run_and_its_resume_are_one_wandb_run_with_config_metrics_summary_and_artifacts(resumed_run):
    run_dir = resumed_run
    kept = json.loads((run_dir / "wandb.json").read_text())
    assert kept["mode"] == "offline" and kept["project"] == "cifar10_dist"
    first, second = sessions(run_dir)  # one per launch, the same W&B run
    for session in (first, second):
        (run,) = of_kind(session, "run")
        assert (run.run_id, run.project, run.display_name) == (kept["id"], "cifar10_dist", "r")
        assert [end.exit_code for end in of_kind(session, "exit")] == [0]
    config = values(of_kind(first, "run")[0].config.update)
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert config["learning_rate"] == 0.1 and config["model"] == "simple_cnn"
    assert config["provenance"]["dataset"]["sha256"] == provenance["dataset"]["sha256"]

    history = [values(record.item) for session in (first, second) for record in of_kind(session, "history")]
    accuracy = {row["step"]: row["test/accuracy"] for row in history if "test/accuracy" in row}
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = {e["epoch"]: e["accuracy"] for e in events if e["event"] == "evaluation" and e["split"] == "test"}
    assert accuracy == pytest.approx(evaluations) and sorted(accuracy) == [1, 2]
    losses = sorted(row["step"] for row in history if "training/batch_loss" in row)
    assert losses == list(range(5, 21, 5))  # every log_every_iters=5 of both epochs (10 per epoch)

    summary = {}  # the W&B run's summary: what its sessions set, the later over the earlier
    for record in of_kind(first, "summary") + of_kind(second, "summary"):
        summary.update(values(record.update))
    final = json.loads((run_dir / "summary.json").read_text())["final"]["test"]["accuracy"]
    assert summary["final/test_accuracy"] == pytest.approx(final)

    artifacts = {artifact.type: artifact for artifact in of_kind(second, "artifact")}
    files = {entry.path for entry in artifacts["run-record"].manifest.contents}
    assert {"config.yaml", "provenance.json", "summary.json", "metrics.json", "curves.png", "mistakes.png"} <= files
    best = max(run_dir.glob("best_model_*.pt"), key=lambda path: float(path.stem.rsplit("=", 1)[1]))
    assert [entry.path for entry in artifacts["model"].manifest.contents] == [best.name]


def newest_checkpoint(run_dir: Path) -> int:
    return max([int(path.stem.rsplit("_", 1)[1]) for path in run_dir.glob("training_checkpoint_*.pt")], default=0)


def recorded_batch_loss(run_dir: Path) -> int:
    """The last training/batch_loss step in the run folder's W&B transaction logs (0 before there is one)."""
    if not (run_dir / "wandb.json").is_file():
        return 0
    run_id = json.loads((run_dir / "wandb.json").read_text())["id"]
    return wandb_history.last_steps(run_dir, run_id).get("training/batch_loss", 0)


def test_a_run_killed_after_wandb_recorded_later_steps_and_resumed_logs_no_step_twice(tmp_path, slow_cnn):
    """SIGKILL once W&B's transaction log holds iterations after the newest checkpoint (10 iterations an epoch, a
    checkpoint every 15; W&B writes its log in blocks of bytes, and held step 48 of this run's at the first, on a
    Zen 4, so the first launch may run up to 20 epochs of 0.1 s steps for that, and the resume runs without the
    sleep): the resume trains and logs them again, and W&B gets none of
    them a second time, and every step of the run once (the two sessions' .wandb files read back)."""
    command = [
        "run",
        *TINY,
        f"--model={slow_cnn}",
        "--dataset=synthetic",
        "--synthetic_size=320",
        "--train_eval_size=0",
        "--validate_every=5",
        "--num_epochs=20",
        "--checkpoint_every=15",
        "--log_every_iters=1",
        "--with_wandb",
        f"--output_path={tmp_path}",
        "--run_name=k",
    ]
    run_dir = tmp_path / "k"
    run = start_forked(*command, env={**environment(), "SLOW_STEP_SECONDS": "0.1"})
    try:
        kill_when(
            run,
            lambda: recorded_batch_loss(run_dir) > newest_checkpoint(run_dir),
            "the run ended before W&B recorded more",
            seconds=180,
        )
    finally:
        stop_all(run)
    assert newest_checkpoint(run_dir) < recorded_batch_loss(run_dir) < 200  # steps the resume trains again
    resumed = run_forked(*command, "--resume_from=auto", env=environment())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps: dict[str, list[int]] = {}
    for session in sessions(run_dir):
        for row in rows(session):
            for key in row.keys() - wandb_history.OWN_KEYS:
                steps.setdefault(key, []).append(row["step"])
    assert {"test/accuracy", "training/batch_loss", "training/epoch_loss"} <= steps.keys()
    for key, logged in steps.items():
        assert len(logged) == len(set(logged)), (key, sorted(logged))
    assert max(steps["training/batch_loss"]) == 200 and max(steps["test/accuracy"]) == 20


def test_tuning_trials_are_wandb_runs_grouped_under_their_study(small_dataset, tmp_path):
    from tests.test_tuning import tune_args, write_space

    space = write_space(tmp_path)
    result = run_forked(
        *tune_args(
            small_dataset,
            tmp_path,
            space,
            "s",
            "--trials=2",
            "--sampler=random",
            "--sampler_seed=0",
            "--pruner=none",
            "--num_epochs=1",
            "--num_warmup_epochs=0.5",
            "--with_wandb",
        ),
        env=environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [of_kind(session, "run")[0] for number in (0, 1) for session in sessions(tmp_path / "s" / f"trial-{number}")]
    assert [(run.display_name, run.run_group, run.job_type) for run in runs] == [
        ("trial-0", "s", "trial"),
        ("trial-1", "s", "trial"),
    ]


def test_with_wandb_but_no_wandb_installed_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)
    result = run_in_this_process("run", *RUN, f"--output_path={tmp_path}")
    assert result.returncode == 2
    assert result.stderr == (
        "error: with_wandb needs Weights & Biases: pip install 'cifar10-dist[wandb]' (or pip install wandb)\n"
    )
    assert not any(tmp_path.iterdir())


def test_an_online_server_that_does_not_answer_leaves_one_offline_run_and_a_prompt_end(tmp_path):
    """W&B online (an API key) against a loopback port nobody listens on: one warning at the start naming the store,
    the same run tracked offline in the run folder (one W&B run, its id in wandb.json, for wandb sync), every
    metric in it, and the run ends without waiting out W&B's own 90 s."""
    import socket
    import time

    from cifar10_dist.outputs import wandb_tracking

    with socket.socket() as closed:  # a free port, closed again: connections to it are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {
        **environment(),
        "WANDB_BASE_URL": f"http://127.0.0.1:{port}",
        "WANDB_API_KEY": "0" * 40,
        "WANDB_INIT_TIMEOUT": "3",
    }  # W&B's own setting wins over our 10 s (a shorter test)
    started = time.monotonic()
    result = run_forked(
        "run", *RUN, "--num_epochs=1", "--num_warmup_epochs=0.5", f"--output_path={tmp_path}", "--run_name=w", env=env
    )
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
    assert (
        len(warnings) == 1
        and "W&B online (project cifar10_dist): the server did not answer within 3 s" in warnings[0]
        and "this run is tracked offline in" in warnings[0]
    ), warnings
    kept = json.loads((tmp_path / "w" / "wandb.json").read_text())
    assert kept["mode"] == "offline"
    assert [path.name.split("-")[-1] for path in (tmp_path / "w" / "wandb").glob("*run-*")] == [kept["id"]]
    [found] = sessions(tmp_path / "w")
    logged = [values(history.item) for history in of_kind(found, "history")]
    assert any("training/epoch_loss" in step for step in logged) and any("test/accuracy" in step for step in logged)
    assert seconds < 30 and wandb_tracking.INIT_TIMEOUT_SECONDS == 10  # (before: about 95 s)

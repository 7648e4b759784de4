"""MLflow tracking read back from its SQLite store with MlflowClient: the config as parameters, the metrics that
TensorBoard gets at the same steps, provenance tags, artifacts, one MLflow run continued by a resume, its status
after a stop, tuning trials as children of their study's run, and one line when MLflow is missing."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from cifar10_dist.config import Config, load_config
from cifar10_dist.errors import Preempted
from cifar10_dist.outputs import mlflow_tracking
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.outputs.tracker_guard import Guarded
from tests.conftest import TINY, run_in_this_process

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# (mlflow imported by the tests that use it: not by collection, in every test process)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="the mlflow extra is not installed")

RUN = [
    *TINY,
    "--dataset=synthetic",
    "--synthetic_size=320",
    "--train_eval_size=0",
    "--validate_every=1",
    "--checkpoint_every=10",
    "--with_mlflow",
]


def the_runs(output: Path) -> tuple[MlflowClient, list]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cifar10_dist")
    return client, client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"])


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """2 epochs, then, as if stopped after the first (its checkpoint the newest), resumed with mlflow_log_model: one
    MLflow run for the run folder."""
    output = tmp_path_factory.mktemp("mlflow")
    first = run_in_this_process("run", *RUN, "--num_epochs=2", f"--output_path={output}", "--run_name=r")
    assert first.returncode == 0, first.stderr[-3000:]
    (output / "r" / "training_checkpoint_20.pt").unlink()
    second = run_in_this_process(
        "run",
        *RUN,
        "--num_epochs=2",
        "--resume_from=auto",
        "--mlflow_log_model",
        "--figures=True",  # (the pictures among the artifacts)
        f"--output_path={output}",
        "--run_name=r",
    )
    assert second.returncode == 0, second.stderr[-3000:]
    return output, output / "r"


def test_a_run_and_its_resume_are_one_mlflow_run_with_config_metrics_tags_and_artifacts(resumed_run):
    output, run_dir = resumed_run
    client, runs = the_runs(output)
    assert len(runs) == 1  # the resume continued the run, it did not add one
    run = runs[0]
    assert run.info.run_name == "r" and run.info.status == "FINISHED"
    assert json.loads((run_dir / "mlflow.json").read_text())["run_id"] == run.info.run_id
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    params = run.data.params
    assert params["learning_rate"] == str(config["learning_rate"]) and params["model"] == "simple_cnn"
    assert params["num_epochs"] == "2"  # the parameters of the run's start; the resume is a tag
    assert run.data.tags["cifar10_dist.resumed_from"] == str(run_dir / "training_checkpoint_10.pt")  # auto, settled
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert run.data.tags["cifar10_dist.dataset_sha256"] == provenance["dataset"]["sha256"]
    assert run.data.tags["cifar10_dist.precision"] == provenance["precision"]
    assert run.data.tags["cifar10_dist.git_commit"] == str(provenance["package"]["git_commit"])
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = [(e["epoch"], e["accuracy"]) for e in events if e["event"] == "evaluation" and e["split"] == "test"]
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "test/accuracy")]
    assert dict(history) == pytest.approx(dict(evaluations)) and sorted(dict(history)) == [1, 2]
    losses = [m.step for m in client.get_metric_history(run.info.run_id, "training/batch_loss")]
    assert sorted(losses) == list(range(5, 21, 5))  # every log_every_iters=5 of both epochs (10 per epoch)
    for name in ("test/macro_f1", "test/balanced_accuracy", "training/epoch_loss", "final/test_accuracy"):
        assert name in run.data.metrics, name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert run.data.metrics["final/test_accuracy"] == pytest.approx(summary["final"]["test"]["accuracy"])
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "provenance.json", "summary.json", "metrics.json", "curves.png", "model"} <= artifacts
    assert {"mistakes.png", "mistakes.json"} <= {path.name for path in run_dir.glob("mistakes.*")}
    assert "mistakes.png" in artifacts  # the test set's most confident mistakes, the picture
    model = [item.path for item in client.list_artifacts(run.info.run_id, "model")]
    best = max(run_dir.glob("best_model_*.pt"), key=lambda path: float(path.stem.rsplit("=", 1)[1]))
    assert model == [f"model/{best.name}"]  # the best of the kept best-model files
    assert (output / "mlartifacts").is_dir()  # beside the store, not in the working directory


def test_a_stopped_run_is_killed_in_mlflow_and_running_again_when_resumed(tmp_path):
    config = load_config(None, with_mlflow=True, output_path=str(tmp_path))
    run_dir = tmp_path / "stopped"
    run_dir.mkdir()
    with pytest.raises(Preempted), tracked(config, run_dir):
        raise Preempted("stopped at iteration 3 on SIGTERM")
    client, runs = the_runs(tmp_path)
    assert [run.info.status for run in runs] == ["KILLED"]
    with tracked(dataclasses.replace(config, resume_from="auto"), run_dir) as guarded:
        guarded.jobs.join()  # the start, in the background
        assert guarded.tracker.run_id == runs[0].info.run_id
        assert client.get_run(guarded.tracker.run_id).info.status == "RUNNING"
    with pytest.raises(RuntimeError), tracked(config, run_dir):
        raise RuntimeError("a bug")
    assert client.get_run(runs[0].info.run_id).info.status == "FAILED"


def tracked(config: Config, run_dir: Path) -> Guarded:
    return Guarded(mlflow_tracking.MLflow(config, run_dir, Provenance.from_dict({})), "mlflow", run_dir)


def test_tuning_trials_are_child_runs_of_the_studys_run(small_dataset, tmp_path):
    from tests.test_tuning import tune_args, write_space

    space = write_space(tmp_path)
    result = run_in_this_process(
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
            "--with_mlflow",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client, runs = the_runs(tmp_path)  # the store of the base output_path, not of the study folder
    parents = [run for run in runs if run.data.tags.get("cifar10_dist.study") == "s"]
    assert len(parents) == 1
    parent = parents[0]
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(run.info.run_name for run in children) == ["trial-0", "trial-1"]
    assert all(run.info.status == "FINISHED" for run in children)
    assert parent.data.params["space.learning_rate"].startswith("Dimension(")
    best = max(
        float(json.loads((tmp_path / "s" / f"trial-{n}" / "summary.json").read_text())["best"]["value"]) for n in (0, 1)
    )
    assert parent.data.metrics["study/best_value"] == pytest.approx(best)
    assert "trial" in children[0].data.params and "mlflow_parent_run" not in children[0].data.params


def test_with_mlflow_but_no_mlflow_installed_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    result = run_in_this_process("run", *RUN, f"--output_path={tmp_path}")
    assert result.returncode == 2
    assert "with_mlflow needs MLflow: pip install 'cifar10-dist[mlflow]'" in result.stderr
    assert "Traceback" not in result.stderr

"""cifar10-dist tune: trials that are real runs ranked on val, one final test, pruning agreed inside spawned gloo
workers, several workers on one study (SQLite, journal file, a real PostgreSQL server), a killed worker's trial
retried from its checkpoint, the report, and optuna-dashboard reading a study made here."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from cifar10_dist import api
from cifar10_dist.config import load_config
from cifar10_dist.errors import UserError
from cifar10_dist.results import TuneResult
from tests.conftest import (
    REPO,
    SLOWLY,
    TINY,
    TINY_WIDTH,
    job_script_environment,
    run_in_this_process,
    start_forked,
    stop_all,
    wait_for_file,
)

optuna = pytest.importorskip("optuna", reason="the tune extra is not installed")

SPACE = {
    "learning_rate": {"type": "float", "low": 0.02, "high": 0.3, "log": True},
    "batch_size": {"type": "categorical", "choices": [32, 64]},
}
IN_MEMORY = ["--dataset=synthetic", "--synthetic_size=400"]  # 320 training images after val_split=0.2
TRIAL = [*TINY, "--val_split=0.2", "--validate_every=1", "--train_eval_size=0", "--checkpoint_every=5"]


def write_space(folder: Path, space: dict | None = None) -> Path:
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(space or SPACE))
    return path


def tune_args(data: Path, output: Path, space: Path, study: str, *extra: str) -> list[str]:
    return [
        "tune",
        f"--space={space}",
        f"--study={study}",
        f"--data_path={data}",
        f"--output_path={output}",
        *TRIAL,
        *extra,
    ]


def load_study(output: Path, study: str, storage: str | None = None):
    return optuna.load_study(study_name=study, storage=storage or f"sqlite:///{output / study / 'study.db'}")


@pytest.fixture(scope="module")
def finished_study(small_dataset, tmp_path_factory):
    """3 random-sampler trials in this process (no pruning), then the report and the final test."""
    output = tmp_path_factory.mktemp("tune")
    space = write_space(output)
    result = run_in_this_process(
        *tune_args(
            small_dataset,
            output,
            space,
            "s",
            "--trials=3",
            "--sampler=random",
            "--sampler_seed=0",
            "--pruner=none",
            "--figures=True",  # (the study's plots)
        )
    )
    return result, output


def test_trials_are_runs_ranked_on_val_and_the_test_set_is_used_once(finished_study):
    result, output = finished_study
    assert result.returncode == 0, result.stderr[-3000:]
    study_dir = output / "s"
    study = load_study(output, "s")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    for trial in study.trials:
        run_dir = study_dir / f"trial-{trial.number}"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
        assert config["trial"]["number"] == summary["trial"]["number"] == trial.number
        assert config["trial"]["params"] == summary["trial"]["params"] == trial.params
        assert config["learning_rate"] == trial.params["learning_rate"]
        assert trial.value == summary["best"]["accuracy"] and summary["best"]["split"] == "val"
        assert sorted(trial.intermediate_values) == [1, 2]  # reported after each validation
        splits = {
            json.loads(line)["split"]
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if "split" in json.loads(line)
        }
        assert "test" not in splits and "val" in splits, splits  # no trial evaluates the test set
        assert summary["final"].keys() == {"val"} and summary["pruned_at_epoch"] is None
    best = max(study.trials, key=lambda t: t.value)
    assert result.stdout.count("final test") == 1
    assert f"final test (trial {best.number}'s best model, the test set's only use in this study)" in result.stdout
    final = study.user_attrs[f"final_test:trial-{best.number}"]
    assert final["num_samples"] == 301 and Path(final["checkpoint"]).parent == study_dir / f"trial-{best.number}"
    table = result.stdout[result.stdout.index("trial  state") :].splitlines()
    assert [int(line.split()[0]) for line in table[1:4]] == [
        t.number for t in sorted(study.trials, key=lambda t: -t.value)
    ]


def test_best_config_runs_as_is_and_plots_are_written(finished_study):
    _, output = finished_study
    study = load_study(output, "s")
    best_config = load_config(output / "s" / "best_config.yaml")  # run --config= reads it as it is
    assert best_config.learning_rate == study.best_params["learning_rate"]
    assert best_config.batch_size == study.best_params["batch_size"]
    assert best_config.trial is None and best_config.run_name is None and best_config.output_path == str(output)
    for plot in ("optimization_history", "param_importances", "parallel_coordinate"):
        assert (output / "s" / f"{plot}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((output / "s" / "tuning_summary.json").read_text())
    assert summary["best_trial"] == study.best_trial.number and summary["states"]["COMPLETE"] == 3
    reported = api.tune(
        None, study="s", output_path=str(output), report_only=True, final_test=False, echo=lambda line: None
    )  # the API's typed result: what tuning_summary.json holds
    assert isinstance(reported, TuneResult) and reported.best_trial == summary["best_trial"]
    assert reported.best_params == study.best_params and reported.states == summary["states"]


def test_report_only_does_not_use_the_test_set_again(finished_study):
    _, output = finished_study
    result = run_in_this_process("tune", "--study=s", f"--output_path={output}", "--report_only")
    assert result.returncode == 0, result.stderr
    assert "evaluated once earlier" in result.stdout
    assert sum(key.startswith("final_test:") for key in load_study(output, "s").user_attrs) == 1


def test_optuna_dashboard_serves_the_study(finished_study):
    _, output = finished_study
    if shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("optuna-dashboard is not installed (pip install 'cifar10-dist[tune]')")
    from cifar10_dist.launch.supervision import free_port

    port = free_port()
    dashboard = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "optuna-dashboard"),
            f"sqlite:///{output / 's' / 'study.db'}",
            "--host=127.0.0.1",
            f"--port={port}",
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        studies = _get_json(f"http://127.0.0.1:{port}/api/studies", dashboard)["study_summaries"]
        (study,) = [s for s in studies if s["study_name"] == "s"]
        detail = _get_json(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}", dashboard)
    finally:
        stop_all(dashboard)
    expected = {t.number: t.value for t in load_study(output, "s").trials}
    assert {t["number"]: t["values"][0] for t in detail["trials"]} == expected
    assert {t["state"] for t in detail["trials"]} == {"Complete"}


def _get_json(url: str, server: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"optuna-dashboard did not answer: {server.stderr.read().decode()[-2000:]}")
            time.sleep(0.2)


@pytest.mark.slow
def test_pruning_is_agreed_by_spawned_gloo_workers_reaching_a_journal_study(small_dataset, tmp_path):
    """Two workers of one study on a journal file, each with its own launch: the first trains learning_rate 0.2
    in its own process; the second, with 2 spawned gloo processes, gets 1e-6 (a grid, seed 1), which cannot beat
    it after epoch 1: its processes report to the study through the storage URL and stop together, pruned."""
    space = write_space(tmp_path, {"learning_rate": {"type": "categorical", "choices": [0.2, 1e-6]}})
    journal = tmp_path / "journal.log"
    args = tune_args(
        small_dataset,
        tmp_path,
        space,
        "p",
        "--trials=1",
        "--sampler=grid",
        "--sampler_seed=1",
        "--pruner_startup_trials=1",
        "--final_test=False",
        f"--storage=journal:{journal}",
    )
    first = run_in_this_process(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    result = run_in_this_process(*args, "--backend=gloo", "--nproc_per_node=2")
    assert result.returncode == 0, result.stderr[-3000:]
    study = load_study(
        tmp_path, "p", optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    )
    states = {t.params["learning_rate"]: (t.state.name, t.last_step) for t in study.trials}
    assert states == {0.2: ("COMPLETE", 2), 1e-6: ("PRUNED", 1)}, states
    pruned = next(t for t in study.trials if t.state.name == "PRUNED")
    summary = json.loads((tmp_path / "p" / f"trial-{pruned.number}" / "summary.json").read_text())
    assert summary["pruned_at_epoch"] == 1 and summary["epochs"] == 1 and summary["world_size"] == 2
    assert f"trial {pruned.number}: PRUNED at epoch 1" in result.stdout
    assert "final test" not in result.stdout and not (tmp_path / "p" / "study.db").exists()


# ---------------------------------------------------------------- several workers, one study


@pytest.fixture(scope="module")
def postgresql(tmp_path_factory):
    """A PostgreSQL server of its own on a free loopback port (run as the postgres user when this is root)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        pytest.skip("PostgreSQL server binaries are absent (apt-get install postgresql)")
    pytest.importorskip("psycopg2", reason="psycopg2 is not installed (pip install psycopg2-binary)")
    bin_dir = found[-1].parent
    folder = Path(tempfile.mkdtemp(prefix="cifar10_dist-postgres-"))  # /tmp/pytest-of-root is closed to others
    as_user: list[str] = []
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(folder, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    from cifar10_dist.launch.supervision import free_port

    port = free_port()
    data = folder / "data"

    def server(tool: str, *args: str, check: bool = True) -> None:
        done = subprocess.run([*as_user, str(bin_dir / tool), *args], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0 or not check, f"{tool}: {done.stdout}{done.stderr}"

    server("initdb", "-D", str(data), "-U", "tune", "--auth=trust")
    server(
        "pg_ctl", "-D", str(data), "-w", "-l", str(folder / "log"), "-o", f"-p {port} -k {folder} -h 127.0.0.1", "start"
    )
    try:
        server("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "tune", "study")
        yield f"postgresql+psycopg2://tune@127.0.0.1:{port}/study"
    finally:
        server("pg_ctl", "-D", str(data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "journal", "postgresql"])
def test_two_workers_share_one_study(kind, small_dataset, tmp_path, request):
    storage = {"sqlite": None, "journal": f"journal:{tmp_path / 'study.journal'}"}.get(kind)
    if kind == "postgresql":
        storage = request.getfixturevalue("postgresql")
    space = write_space(tmp_path)
    extra = [
        "--trials=1",
        "--sampler=random",
        "--pruner=none",
        "--final_test=False",
        "--num_epochs=1",
        "--num_warmup_epochs=0",
        *IN_MEMORY,
        *([f"--storage={storage}"] if storage else []),
    ]
    # one worker in a process of its own, the other in this one, at the same time
    other = start_forked(*tune_args(small_dataset, tmp_path, space, "shared", *extra, "--sampler_seed=1"))
    try:
        here = run_in_this_process(*tune_args(small_dataset, tmp_path, space, "shared", *extra, "--sampler_seed=2"))
        _, stderr = other.communicate(timeout=300)
    finally:
        stop_all(other)
    assert other.returncode == 0, stderr[-3000:]
    assert here.returncode == 0, here.stderr[-3000:]
    if kind == "journal":
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage[8:]))
    trials = load_study(tmp_path, "shared", storage).trials
    assert sorted(t.number for t in trials) == [0, 1]
    assert [t.state.name for t in trials] == ["COMPLETE"] * 2
    for trial in trials:  # each in its own folder, made by one worker
        config = yaml.safe_load((tmp_path / "shared" / f"trial-{trial.number}" / "config.yaml").read_text())
        assert config["trial"]["params"] == trial.params
    assert not list((tmp_path / "shared").glob("*.png"))  # figures=False (TINY): the study's plots are not drawn
    assert json.loads((tmp_path / "shared" / "tuning_summary.json").read_text())["plots"] == []


@pytest.mark.slow
def test_a_killed_workers_trial_is_retried_from_its_checkpoint(small_dataset, tmp_path, slow_cnn):
    space = write_space(tmp_path, {"learning_rate": SPACE["learning_rate"]})
    args = tune_args(
        small_dataset,
        tmp_path,
        space,
        "k",
        "--trials=1",
        "--heartbeat=1",
        "--final_test=False",
        "--num_epochs=3",
        f"--model={slow_cnn}",
        *IN_MEMORY,
    )
    worker = start_forked(*args, env=SLOWLY)
    try:
        checkpoint = wait_for_file(tmp_path / "k" / "trial-0", "training_checkpoint_*.pt", worker)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    finally:
        stop_all(worker)
    time.sleep(3.2)  # its heartbeat (1 s) goes stale after 2 beats (SQLite compares whole seconds)
    second = run_in_this_process(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    trials = load_study(tmp_path, "k").trials
    assert [(t.number, t.state.name) for t in trials] == [(0, "FAIL"), (1, "COMPLETE")]
    assert trials[1].system_attrs["failed_trial"] == 0 and trials[1].params == trials[0].params
    resumed = [line for line in second.stderr.splitlines() if "Resumed from" in line]
    assert len(resumed) == 1 and str(tmp_path / "k" / "trial-0" / "training_checkpoint_") in resumed[0], second.stderr[
        -3000:
    ]
    assert int(resumed[0].rsplit(" ", 1)[1]) >= int(checkpoint.stem.rsplit("_", 1)[1])  # not from zero
    summary = json.loads((tmp_path / "k" / "trial-1" / "summary.json").read_text())
    assert summary["iterations"] == 3 * 10  # 320 training images, batch 32


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "space, message",
    [
        (
            {"learning_rat": {"type": "float", "low": 0.1, "high": 1}},
            "unknown config key 'learning_rat': did you mean 'learning_rate'?",
        ),
        ({"output_path": {"type": "categorical", "choices": ["a"]}}, "output_path cannot be tuned"),
        ({"momentum": {"type": "uniform", "low": 0.1, "high": 1}}, "momentum needs type: float, int or categorical"),
        (
            {"momentum": {"type": "float", "low": 0.9, "high": 0.5}},
            "low and high must be finite numbers with low < high",
        ),
        (
            {"batch_size": {"type": "int", "low": 16, "high": 64}, "momentum": {"type": "float", "high": float("inf")}},
            "space.yaml' line 5: momentum: low and high must be finite numbers with low < high "
            "(got low=None, high=inf)",
        ),
        (
            {"momentum": {"type": "float", "low": 0.5, "high": 1.5}},
            "space: momentum=1.5 is outside what the config accepts: momentum=1.5 must be in [0, 1)",
        ),
        ({"learning_rate": {"type": "float", "low": 0, "high": 1, "log": True}}, "log: true needs low > 0"),
        ({"batch_size": {"type": "categorical", "choices": []}}, "choices must be a non-empty list"),
        (
            {"batch_size": {"type": "int", "low": 16, "high": 64, "choices": [1]}},
            "'choices' is not accepted for type int",
        ),
        ({"learning_rate": {"type": "float", "low": 0.1, "high": 1}}, "sampler=grid needs a finite set of values"),
    ],
)
def test_a_bad_space_is_one_line_before_any_trial(space, message, tmp_path):
    path = write_space(tmp_path, space)
    result = run_in_this_process(
        "tune",
        f"--space={path}",
        "--study=x",
        f"--output_path={tmp_path / 'out'}",
        "--dataset=synthetic",
        "--val_split=0.1",
        "--sampler=grid",
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"error: {result.stderr.splitlines()[0][7:]}"]
    assert message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_every_key_tune_sets_for_its_trials_is_refused_in_a_space(tmp_path):
    """The keys a trial's config gets from tune itself (its folder, name, resume, seed count, the trial, the MLflow
    parent and store) are found by building one trial's config, not listed here: each must be refused in a space
    (their role is on their field, config.fields: tunable=False, per_tuning_worker or internal)."""
    import types

    from cifar10_dist.config import PrunerSpec
    from cifar10_dist.tuning import search_space, studies

    base = load_config(None, val_split=0.1, output_path=str(tmp_path), seeds=2, overwrite=True)
    objective = studies.Objective(
        base=base,
        space={},
        study_dir=tmp_path / "s",
        url=f"sqlite:///{tmp_path}/s.db",
        study=types.SimpleNamespace(study_name="s"),
        pruner=PrunerSpec(),
        mlflow_parent=("sqlite:///elsewhere.db", "parent-run-id"),
    )
    trial = objective.trial_config(3, {}, str(tmp_path / "training_checkpoint_9.pt"))
    set_by_tune = sorted(key for key in base.to_dict() if getattr(trial, key) != getattr(base, key))
    assert {
        "trial",
        "mlflow_parent_run",
        "mlflow_tracking_uri",
        "output_path",
        "run_name",
        "resume_from",
        "seeds",
        "overwrite",
    } <= set(set_by_tune)
    for key in set_by_tune:
        path = write_space(tmp_path, {key: {"type": "categorical", "choices": [getattr(base, key)]}})
        with pytest.raises(UserError, match=f"{key} cannot be tuned"):
            search_space.read_space(path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--val_split=0"], "tune needs val_split > 0 (got 0.0)"),
        (["--sampler=bayes"], "sampler='bayes' is unknown: choose one of tpe, random, grid"),
        (["--pruner=asha"], "pruner='asha' is unknown: choose one of median, hyperband, none"),
        (["--trials=-1"], "trials=-1 must be a whole number >= 0"),
        (["--storage=mysql:/x"], "storage='mysql:/x' is not accepted: give journal:PATH"),
        (["--backend=gloo"], "tune starts each trial's processes itself"),
    ],
)
def test_bad_tune_options_are_one_line(args, message, tmp_path):
    path = write_space(tmp_path)
    result = run_in_this_process(
        "tune",
        f"--space={path}",
        "--study=x",
        f"--output_path={tmp_path / 'out'}",
        "--dataset=synthetic",
        "--val_split=0.1",
        *args,
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_worker_with_another_config_is_refused(finished_study, small_dataset):
    _, output = finished_study  # its own data_path, num_workers or launch are a worker's own: num_epochs is not
    result = run_in_this_process(
        *tune_args(
            small_dataset, output, output / "space.yaml", "s", "--num_epochs=3", "--num_workers=1", "--figures=True"
        )
    )
    assert result.returncode == 2
    assert "study 's' was created with another base config: num_epochs is 2 there and 3 here" in result.stderr
    assert len(load_study(output, "s").trials) == 3


def test_a_worker_may_differ_in_a_key_that_takes_effect_in_neither_config(finished_study, small_dataset):
    """powersgd_rank shapes nothing without grad_compression=powersgd: passed over. The check goes on to the keys
    after it in order, and weight_decay is refused."""
    _, output = finished_study
    extra = ("--figures=True", "--powersgd_rank=2", "--weight_decay=0.123")
    result = run_in_this_process(*tune_args(small_dataset, output, output / "space.yaml", "s", *extra))
    assert result.returncode == 2
    assert "study 's' was created with another base config: weight_decay is " in result.stderr
    assert " and 0.123 here" in result.stderr


def test_missing_optuna_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    result = run_in_this_process(
        "tune",
        f"--space={write_space(tmp_path)}",
        "--study=x",
        "--dataset=synthetic",
        "--val_split=0.1",
        f"--output_path={tmp_path / 'out'}",
    )
    assert result.returncode == 2
    assert result.stderr == (
        "error: tune needs the optuna package, which is not installed: pip install 'cifar10-dist[tune]'\n"
    )


def test_shipped_spaces_fit_their_configs():
    from cifar10_dist.tuning import search_space

    for config, space in (("default.yaml", "space_resnet18.yaml"), ("fast.yaml", "space_fast.yaml")):
        base = load_config(REPO / "configs" / config, val_split=0.1)
        dimensions = search_space.read_space(REPO / "configs" / space)
        search_space.check_space(base, dimensions)
        assert len(dimensions) >= 3


def test_the_recipe_options_are_searchable_and_their_bounds_checked(tmp_path):
    """lr_schedule, mixup_alpha, auto_augment ... are ordinary keys of a space; a bound the config refuses is one
    line."""
    from cifar10_dist.tuning import search_space

    base = load_config(None, val_split=0.1)
    (tmp_path / "space.yaml").write_text(
        "lr_schedule: {type: categorical, choices: [linear, cosine]}\n"
        "mixup_alpha: {type: float, low: 0.0, high: 0.4}\n"
        "auto_augment: {type: categorical, choices: [none, trivialaugment]}\n"
    )
    search_space.check_space(base, search_space.read_space(tmp_path / "space.yaml"))
    (tmp_path / "bad.yaml").write_text("random_erasing: {type: float, low: 0.0, high: 1.5}\n")
    with pytest.raises(UserError, match=r"random_erasing=1.5 must be a probability in 0..1"):
        search_space.check_space(base, search_space.read_space(tmp_path / "bad.yaml"))


# ---------------------------------------------------------------- Slurm job arrays


@pytest.mark.slow
def test_a_preempted_array_task_requeues_itself_and_continues_its_trial(small_dataset, tmp_path, slow_cnn):
    """scripts/slurm/tune_array.sbatch with the stand-in scontrol: USR1 before the time limit -> the running trial
    stops at a checkpoint and is queued again in the study (a journal file), the array task is requeued by its
    own id (ARRAYJOB_TASK), and the requeued task continues the trial from that checkpoint, then tests once."""
    (tmp_path / "base.yaml").write_text(
        yaml.safe_dump(
            {
                "model": slow_cnn,
                "model_kwargs": {"width": TINY_WIDTH},
                "channels_last": True,
                "batch_size": 32,
                "num_workers": 0,
                "num_epochs": 3,
                "num_warmup_epochs": 1,
                "learning_rate": 0.1,
                "train_eval_size": 0,
                "validate_every": 1,
                "checkpoint_every": 5,
            }
        )
    )
    env = {
        **job_script_environment(),
        "SLURM_JOB_ID": "7001",
        "SLURM_ARRAY_JOB_ID": "7000",
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_SUBMIT_DIR": str(REPO),
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_TMPDIR": str(tmp_path / "node-local"),
        "CIFAR10_DATA": str(small_dataset),
        "CONFIG": str(tmp_path / "base.yaml"),
        "SPACE": str(write_space(tmp_path)),
        "STUDY": "array",
        "TRIALS_PER_TASK": "1",
        "VAL_SPLIT": "0.2",
        "OUTPUT_PATH": str(tmp_path / "out"),
        "FAKE_SLURM_LOG": str(tmp_path / "slurm.log"),
        **SLOWLY,
    }
    script = REPO / "scripts" / "slurm" / "tune_array.sbatch"
    job = subprocess.Popen(
        ["bash", str(script)],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_file(tmp_path / "out" / "array" / "trial-0", "training_checkpoint_*.pt", job)
        job.send_signal(signal.SIGUSR1)  # what `#SBATCH --signal=B:USR1@300` sends to the batch shell
        _, stderr = job.communicate(timeout=120)
    finally:
        stop_all(job)
    assert job.returncode == 0, stderr[-3000:]
    assert (tmp_path / "slurm.log").read_text() == "requeue 7000_1\n"
    assert "trial 0 stopped at iteration" in stderr and "queued again in study array" in stderr
    requeued = subprocess.run(
        ["bash", str(script)],
        cwd=REPO,
        env={**env, "SLOW_STEP_SECONDS": "0"},  # (nothing to signal in the requeued task)
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    journal = optuna.storages.journal.JournalFileBackend(str(tmp_path / "out" / "array" / "journal.log"))
    trials = load_study(tmp_path / "out", "array", optuna.storages.JournalStorage(journal)).trials
    assert [(t.number, t.state.name) for t in trials] == [(0, "FAIL"), (1, "COMPLETE")]
    assert trials[1].params == trials[0].params
    assert str(tmp_path / "out" / "array" / "trial-0" / "training_checkpoint_") in requeued.stderr
    assert "final test (trial 1's best model" in requeued.stdout


def test_a_failing_trial_is_reported_with_its_reason(small_dataset, tmp_path):
    space = write_space(tmp_path, {"learning_rate": {"type": "categorical", "choices": [1.0e4]}})
    result = run_in_this_process(
        *tune_args(small_dataset, tmp_path, space, "f", "--trials=1", "--sampler=grid", "--clip_grad_norm=None")
    )  # unclipped, 1e4 diverges
    assert result.returncode == 2
    assert re.search(
        r"trial 0: FAIL \(\d\.\d min\) learning_rate=1e\+04: training stopped at iteration \d+ \(epoch "
        r"\d\): "
        "the (loss|weights) became",
        result.stdout,
    ), result.stdout
    assert result.stderr.splitlines()[-1] == (
        "error: no trial of study f has completed (1 failed, the reasons are above): no best config"
    )
    assert load_study(tmp_path, "f").trials[0].state.name == "FAIL"


def _open_study_at_the_barrier(
    barrier, folder: str, urls: list[str], worker: int, without: str | None = None
) -> list[str]:
    """One tune worker's start: for each storage URL (a fresh database), wait for the others, then open the study
    and run one (instant) trial in it. Returns each round's outcome: "ok" or the one-line error. ``without``: "lock"
    (the lock file is a no-op) or "retry" (one attempt only), to check the other mechanism alone."""
    from cifar10_dist.outputs import files
    from cifar10_dist.training.loop import trials
    from cifar10_dist.tuning import opening, search_space

    if without == "lock":
        files.sqlite_lock = lambda url: contextlib.nullcontext()
    elif without == "retry":
        trials.CREATION_ATTEMPTS = 1

    base = load_config(val_split=0.1, output_path=folder)
    space = {"learning_rate": search_space.Dimension("learning_rate", "float", 0.01, 0.1)}
    outcomes = []
    for url in urls:
        options = opening.TuneOptions(study="race", storage=url, sampler="random", pruner="none")
        barrier.wait(timeout=60)
        time.sleep(0.01 * worker * urls.index(url))  # each round a different stagger
        try:
            study, _ = opening.open_study(options, base, space)
            study.optimize(lambda trial: trial.suggest_float("x", 0, 1) + worker, n_trials=1)
            outcomes.append("ok")
        except UserError as error:
            outcomes.append(str(error))
    return outcomes


def _start_together(folder: Path, urls: list[str], workers: int, without: str | None = None) -> list[list[str]]:
    """``workers`` processes opening each fresh database at the same instant: each one's outcomes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork")  # the workers use Optuna and the database only, not torch
    barrier = context.Manager().Barrier(workers)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(
            pool.map(
                _open_study_at_the_barrier,
                [barrier] * workers,
                [str(folder)] * workers,
                [urls] * workers,
                range(workers),
                [without] * workers,
            )
        )


def _assert_each_study_has_every_trial(urls: list[str], workers: int) -> None:
    for url in urls:
        study = optuna.load_study(study_name="race", storage=url)
        assert sorted(t.state.name for t in study.trials) == ["COMPLETE"] * workers


@pytest.mark.parametrize("without", ["retry", "lock"], ids=["the-lock-alone", "the-retry-alone"])
def test_workers_starting_together_on_a_fresh_sqlite_study_all_run_their_trials(tmp_path, without):
    """Three workers open the same new SQLite file at the same instant, three times over: none of them trips over
    another creating the schema or the study, and every trial lands in the one study of each file. Each of the
    two mechanisms is enough on its own, and each is checked alone: the lock file beside the database (the retry
    off), and the retry after a lost creation race (the lock off; a database server has no lock file). With
    neither, 8 of the 15 starts failed here ("table studies already exists")."""
    rounds, workers = 3, 3
    urls = [f"sqlite:///{tmp_path}/round-{number}.db" for number in range(rounds)]
    assert _start_together(tmp_path, urls, workers, without) == [["ok"] * rounds] * workers
    _assert_each_study_has_every_trial(urls, workers)


@pytest.mark.slow
def test_workers_starting_together_on_a_fresh_postgresql_database_all_run_their_trials(postgresql, tmp_path):
    """The same on a PostgreSQL server, where only the retry helps: the losers of the race to create the schema
    see a unique-key violation on pg_type (without the retry 9 to 24 of 36 starts failed so here), and open the
    storage again once the winner's tables are there."""
    import psycopg2

    rounds, workers = 4, 3
    server, _, _ = postgresql.rpartition("/")
    connection = psycopg2.connect(server.replace("postgresql+psycopg2", "postgresql") + "/study")
    connection.autocommit = True
    with connection.cursor() as cursor:
        for number in range(rounds):
            cursor.execute(f"CREATE DATABASE round{number}")
    connection.close()
    urls = [f"{server}/round{number}" for number in range(rounds)]
    assert _start_together(tmp_path, urls, workers) == [["ok"] * rounds] * workers
    _assert_each_study_has_every_trial(urls, workers)


@pytest.mark.slow
def test_postgresqls_already_exists_errors_count_as_a_lost_creation_race(postgresql):
    """The race's rarer loser, seen once in CI (two tune workers on one fresh database): it checked for the enum type
    before the winner committed and created it after, and PostgreSQL says "type ... already exists" as a
    ProgrammingError (SQLite says "already exists" as an OperationalError). The real errors from the server: both
    losing errors are a lost race (retried), a missing database is not (reported at once)."""
    import sqlalchemy

    from cifar10_dist.training.loop import trials

    def error_of(url: str, *statements: str) -> Exception:
        engine = sqlalchemy.create_engine(url)
        try:
            with engine.begin() as connection:
                for statement in statements:
                    connection.execute(sqlalchemy.text(statement))
        except Exception as error:
            return error
        finally:
            engine.dispose()
        raise AssertionError(f"no error from {statements}")

    duplicate_type = error_of(
        postgresql, "CREATE TYPE direction AS ENUM ('up')", "CREATE TYPE direction AS ENUM ('up')"
    )
    duplicate_table = error_of(postgresql, "CREATE TABLE twice (x int)", "CREATE TABLE twice (x int)")
    missing = error_of(postgresql.rpartition("/")[0] + "/absent", "SELECT 1")
    assert type(duplicate_type).__name__ == "ProgrammingError" and "already exists" in str(duplicate_type)
    assert trials._lost_creation_race(duplicate_type)
    assert trials._lost_creation_race(duplicate_table)
    assert not trials._lost_creation_race(missing), str(missing)


@pytest.mark.slow
def test_a_study_whose_mlflow_store_does_not_answer_goes_on_with_one_warning_of_its_own(
    small_dataset, tmp_path, monkeypatch
):
    """with_mlflow against a loopback port nobody listens on: the study's own calls (its parent run, its best value)
    are warned about once; the trial runs (its run's tracker warns as a run's does). A user's own MLflow retry
    setting wins over ours (mlflow_tracking.HTTP_BOUNDS): no retries here, so no request waits out a backoff."""
    import socket

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    space = write_space(tmp_path)
    result = run_in_this_process(
        *tune_args(
            small_dataset,
            tmp_path / "out",
            space,
            "down",
            "--trials=1",
            "--num_epochs=1",
            "--num_warmup_epochs=0",
            "--sampler=random",
            "--pruner=none",
            "--with_mlflow",
            f"--mlflow_tracking_uri=http://127.0.0.1:{port}",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count(f"MLflow: the store at http://127.0.0.1:{port} does not answer") == 1, result.stderr
    assert "the study goes on without its own run (the trials' parent)" in result.stderr
    assert "trials: 1 complete" in result.stdout

"""What a run leaves behind for the user: TensorBoard scalars, metrics.jsonl, summary.json, curves.png,
ClearML's offline session, `report`, and the console (progress bar on a terminal, lines otherwise)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import struct
import sys
import termios
from pathlib import Path

import ignite.distributed as idist
import pytest
import torch
import torch.distributed as dist

from cifar10_dist.config import Config
from cifar10_dist.outputs import log_lines
from tests.conftest import TINY, cli_env, run_forked, run_in_this_process, start_forked, stop_all


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


@pytest.fixture(scope="module")
def tracked_run(small_dataset, tmp_path_factory):
    """2 gloo processes, validation every epoch, ClearML in offline mode (session kept under tmp); a global batch
    of 33 that 2 processes cannot split: each takes 16, so 32 images are trained on per step."""
    output = tmp_path_factory.mktemp("tracked")
    # ClearML's reporting subprocess makes an offline task's close wait 10 s for an answer that never comes;
    # its documented setting for thread-based reporting closes at once and records the same session.
    conf = output / "clearml.conf"
    conf.write_text("sdk { development { report_use_subprocess: false } }\n")
    env = {**cli_env(), "CLEARML_CACHE_DIR": str(output / "clearml-cache"), "CLEARML_CONFIG_FILE": str(conf)}
    result = run_forked(
        "run",
        *TINY,
        "--batch_size=33",
        "--backend=gloo",
        "--nproc_per_node=2",
        "--validate_every=1",
        "--with_clearml=True",
        "--clearml_offline=True",
        "--clearml_project=tests",
        "--figures=True",
        f"--data_path={small_dataset}",
        f"--output_path={output}",
        "--run_name=tracked",
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, output / "tracked"


def jsonl(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


SCALARS = {
    "training/batch_loss",
    "training/lr",
    "training/grad_norm",
    "training/epoch_loss",
    "training/epoch_time",
    "training/images_per_second",
    "test/accuracy",
    "test/top5_accuracy",
    "test/loss",
    "test/duration",
    "train_subset/accuracy",
    "train_subset/top5_accuracy",
    "train_subset/loss",
    "train_subset/duration",
    "test/balanced_accuracy",
    "test/macro_f1",
    "train_subset/balanced_accuracy",
    "train_subset/macro_f1",
    "test/ece",
    "train_subset/ece",
}


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: {event.step: event.value for event in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_tensorboard_holds_each_quantity_once_under_its_documented_name(tracked_run):
    from ignite.handlers import PiecewiseLinear

    _, run_dir = tracked_run
    logged = scalars(run_dir)
    assert set(logged) - {tag for tag in logged if tag.startswith(("final/", "best/"))} == SCALARS
    # lr logged every 5 iterations equals the schedule's value at that iteration (warmup 18, decay to 36)
    schedule = PiecewiseLinear.simulate_values(36, param_name="lr", milestones_values=[(0, 0.0), (18, 0.1), (36, 0.0)])
    assert sorted(logged["training/lr"]) == [5, 10, 15, 20, 25, 30, 35]
    for step, value in logged["training/lr"].items():
        assert value == pytest.approx(schedule[step - 1][1], abs=1e-6)
    lines = jsonl(run_dir)
    for line in lines:  # metrics.jsonl: the same numbers under the same names (event/key = tag)
        group = "training" if line["event"] == "epoch" else line["split"]
        names = (
            ("epoch_loss", "epoch_time", "images_per_second")
            if group == "training"
            else ("accuracy", "top5_accuracy", "loss", "duration")
        )
        for name in names:
            assert logged[f"{group}/{name}"][line["epoch"]] == pytest.approx(line[name], rel=1e-6), (group, name)


def test_images_per_second_counts_the_images_actually_trained_on(tracked_run):
    result, run_dir = tracked_run
    assert "batch_size=33 does not divide by 2 processes: each takes 16 images, 32 per step" in result.stderr
    for line in jsonl(run_dir):
        if line["event"] == "epoch":
            assert line["images_per_second"] == pytest.approx(18 * 32 / line["epoch_time"], rel=1e-6)


def test_hyperparameters_and_final_metrics_reach_tensorboards_hparams_tab(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    _, run_dir = tracked_run
    events = EventAccumulator(str(run_dir))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = session.session_start_info.hparams
    assert hparams["learning_rate"].number_value == pytest.approx(0.1) and hparams["model"].string_value == "simple_cnn"
    assert hparams["batch_size"].number_value == 33 and hparams["run_name"].string_value == "tracked"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {metric.name.tag for metric in experiment.metric_infos} == {
        "final/test_accuracy",
        "final/test_top5_accuracy",
        "final/test_loss",
        "final/train_accuracy",
        "final/train_top5_accuracy",
        "final/train_loss",
        "best/test_accuracy",
    }
    final = scalars(run_dir)["final/test_accuracy"]
    assert list(final.values()) == [pytest.approx(summary["final"]["test"]["accuracy"])]


def test_metrics_jsonl_has_a_line_per_epoch_and_per_evaluation(tracked_run):
    _, run_dir = tracked_run
    lines = jsonl(run_dir)
    assert [(line["event"], line["epoch"], line.get("split")) for line in lines] == [
        ("epoch", 1, None),
        ("evaluation", 1, "train_subset"),
        ("evaluation", 1, "test"),
        ("epoch", 2, None),
        ("evaluation", 2, "train_subset"),
        ("evaluation", 2, "test"),
    ]
    for line in lines:
        if line["event"] == "epoch":
            assert line["iteration"] == 18 * line["epoch"] and line["epoch_time"] > 0
            assert line["epoch_loss"] > 0 and 0 <= line["lr"] <= 0.1
        else:
            assert line["duration"] > 0 and line["num_samples"] == (301 if line["split"] == "test" else 100)
    final = json.loads((run_dir / "metrics.json").read_text())
    assert lines[-1]["accuracy"] == final["test"]["accuracy"]


def test_summary_json_tells_the_whole_story(tracked_run):
    _, run_dir = tracked_run
    summary = json.loads((run_dir / "summary.json").read_text())
    tests = [line for line in jsonl(run_dir) if line.get("split") == "test"]
    best = max(tests, key=lambda line: line["accuracy"])
    assert summary["best"] == {
        "split": "test",
        "accuracy": best["accuracy"],
        "epoch": best["epoch"],
        "metric": "accuracy",
        "value": best["accuracy"],
    }
    assert summary["final"]["test"] == json.loads((run_dir / "metrics.json").read_text())["test"]
    assert (summary["world_size"], summary["backend"], summary["epochs"], summary["iterations"]) == (2, "gloo", 2, 36)
    epochs = [line for line in jsonl(run_dir) if line["event"] == "epoch"]
    assert summary["training_time"] == pytest.approx(sum(line["epoch_time"] for line in epochs))
    assert 0 < summary["training_time"] < summary["total_time"]
    assert sum(summary["devices"].values()) == 2 and summary["versions"]["torch"]
    assert summary["checkpoints"]
    assert all(Path(path).is_file() for path in summary["checkpoints"] + summary["best_models"])


def test_curves_png_is_rendered(tracked_run):
    _, run_dir = tracked_run
    assert png_size(run_dir / "curves.png") == (1000, 400)
    assert (run_dir / "curves.png").stat().st_size > 20_000


def test_without_figures_a_run_writes_their_json_files_and_draws_nothing(tracked_run, small_dataset, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    drawn = EventAccumulator(str(tracked_run[1]))
    drawn.Reload()
    assert {"test/mistakes", "test/calibration"} <= set(drawn.Tags()["images"])
    run_dir = tmp_path / "undrawn"
    args = (f"--data_path={small_dataset}", f"--output_path={tmp_path}", "--run_name=undrawn")
    result = run_in_this_process("run", *TINY, "--figures=False", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    names = {path.name for path in run_dir.iterdir()}
    assert {"mistakes.json", "calibration.json", "metrics.json", "summary.json"} <= names
    assert not [name for name in names if name.endswith(".png")]
    undrawn = EventAccumulator(str(run_dir))
    undrawn.Reload()
    assert undrawn.Tags()["images"] == [] and "test/accuracy" in undrawn.Tags()["scalars"]


def test_clearml_offline_session_gets_each_quantity_once_under_the_same_names(tracked_run):
    result, run_dir = tracked_run
    folder = Path(json.loads((run_dir / "summary.json").read_text())["clearml_offline_folder"])
    assert folder.is_dir() and folder.with_suffix(".zip").is_file()  # the zip is what a server imports
    task = (folder / "task.json").read_text()
    assert '"learning_rate"' in task and "tracked" in task  # the connected config; named after the run folder
    reported = set()
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        for event in json.loads(line):
            if event.get("type") == "training_stats_scalar":
                reported.add((f"{event['metric']}/{event['variant']}", event["iter"]))
    names = {name for name, _ in reported}
    headline = {name for name in names if name.startswith(("final/", "best/"))}  # as TensorBoard's, at the end
    assert headline == {
        f"final/{split}_{metric}" for split in ("test", "train") for metric in ("accuracy", "top5_accuracy", "loss")
    } | {"best/test_accuracy"}
    assert names - headline == SCALARS, names ^ SCALARS  # no second copy under another name (lr/0, training/loss)
    assert sorted(step for name, step in reported if name == "training/lr") == [5, 10, 15, 20, 25, 30, 35]
    assert "[rank 1] INFO" not in result.stderr  # other ranks only warn


def test_report_compares_runs_in_a_table_and_a_plot(tracked_run, spawned_run, tmp_path):
    _, run_dir = tracked_run
    _, spawn_output = spawned_run
    (other,) = spawn_output.iterdir()
    result = run_in_this_process("report", str(run_dir), str(other), f"--output={tmp_path / 'cmp.png'}")
    assert result.returncode == 0, result.stderr
    for folder in (run_dir, other):
        summary = json.loads((folder / "summary.json").read_text())
        row = next(line for line in result.stdout.splitlines() if line.startswith(folder.name))
        assert f"{summary['best']['accuracy']:.4f} (test)" in row
        assert f"{summary['final']['test']['accuracy']:.4f}" in row and f"{summary['training_time']:.1f}" in row
        assert f"mistakes of {folder.name}: {folder / 'mistakes.png'}" in result.stdout
    assert png_size(tmp_path / "cmp.png") == (1000, 400)


def test_report_names_each_damaged_file_in_one_line_and_reports_the_other_runs(tracked_run, spawned_run, tmp_path):
    """A summary.json cut short (a full disk) and a metrics.jsonl with a broken line: one line each naming the
    file; the first run is still reported from its metrics.jsonl, the second left out, the third reported."""
    _, run_dir = tracked_run
    _, spawn_output = spawned_run
    (other,) = spawn_output.iterdir()
    cut, broken = tmp_path / "cut", tmp_path / "broken"
    shutil.copytree(run_dir, cut)
    shutil.copytree(other, broken)
    (cut / "summary.json").write_text('{"run_dir": ')
    with (broken / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"event": "epo\n')
    lines = len((broken / "metrics.jsonl").read_text().splitlines())
    result = run_in_this_process("report", str(cut), str(broken), str(other), f"--output={tmp_path / 'cmp.png'}")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {cut / 'summary.json'} is damaged: not valid JSON (Expecting value at line 1, column 13; 12 bytes): "
        "cut reported from metrics.jsonl alone",
        f"error: {broken / 'metrics.jsonl'} is damaged at line {lines}: not valid JSON (Unterminated string starting "
        'at): \'{"event": "epo\': broken left out',
    ]
    names = [
        line.split()[0] for line in result.stdout.splitlines()[1:] if not line.startswith(("*", "plot:", "mistakes"))
    ]
    assert names == ["cut", other.name]  # in the order given, the unreadable one left out
    assert result.stdout.splitlines()[1].startswith("cut *")  # numbers so far, as for an unfinished run
    assert png_size(tmp_path / "cmp.png") == (1000, 400)
    nothing = run_in_this_process("report", str(broken), f"--output={tmp_path / 'none.png'}")
    assert nothing.returncode == 2 and not (tmp_path / "none.png").exists()
    assert nothing.stderr.splitlines()[-1] == (
        "error: nothing to report: none of the 1 run folder(s) could be read (see above)"
    )


def test_progress_in_a_log_is_a_line_every_n_iterations_with_the_eta(tracked_run):
    result, _ = tracked_run  # stderr is a pipe there, as in a Slurm log
    lines = re.findall(
        r"epoch (\d)/2 iter (\d+)/18: loss [0-9.]+, lr [0-9.e-]+, \d+ img/s, ETA 0:\d\d:\d\d", result.stderr
    )
    assert [(int(epoch), int(step)) for epoch, step in lines] == [
        (1, 5),
        (1, 10),
        (1, 15),
        (2, 2),
        (2, 7),
        (2, 12),
        (2, 17),
    ]  # every 5 iterations of 36
    assert len(re.findall(r"epoch \d done in [0-9.]+ s \(\d+ img/s\)", result.stderr)) == 2


def test_progress_on_a_terminal_is_a_bar(small_dataset, tmp_path):
    args = ["run", *TINY, "--epoch_length=6", "--train_eval_size=0", f"--data_path={small_dataset}"]
    main, secondary = os.openpty()  # stderr on a terminal, as in an interactive shell
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a new pty is 0 x 0
    process = start_forked(*args, f"--output_path={tmp_path}", stderr=secondary)
    try:
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # (EIO: no process holds the terminal any more)
                break
            if not chunk:
                break
            chunks.append(chunk)
        process.wait(timeout=300)
    finally:
        stop_all(process)
        process.stdout.close()
        os.close(main)
    terminal = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0
    assert re.search(r"Epoch \[1/2\].*\d+/6", terminal) and "ETA" not in terminal


def write_run(folder: Path, accuracies: list[float], epoch_time: float, eval_time: float) -> Path:
    """A run folder holding only metrics.jsonl: one epoch line and one test evaluation per accuracy."""
    folder.mkdir()
    lines = []
    for epoch, accuracy in enumerate(accuracies, start=1):
        lines.append(
            {
                "event": "epoch",
                "epoch": epoch,
                "iteration": epoch * 10,
                "lr": 0.1,
                "epoch_loss": 1.0,
                "epoch_time": epoch_time,
                "images_per_second": 100.0,
            }
        )
        lines.append(
            {
                "event": "evaluation",
                "split": "test",
                "epoch": epoch,
                "iteration": epoch * 10,
                "accuracy": accuracy,
                "loss": 1.0,
                "num_samples": 100,
                "duration": eval_time,
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def test_report_targets_give_time_to_accuracy_per_run_and_over_runs(tmp_path):
    fast = write_run(tmp_path / "fast", [0.85, 0.91, 0.935, 0.94], epoch_time=60, eval_time=6)
    slow = write_run(tmp_path / "slow", [0.80, 0.89, 0.92, 0.93], epoch_time=120, eval_time=6)
    result = run_in_this_process(
        "report", str(fast), str(slow), "--targets=0.9,0.93,0.94", f"--output={tmp_path / 'r.png'}"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    fast_row = [line for line in lines if line.startswith("fast ")][-1]  # the second table's row
    # 90% after epoch 2: 2 min of training, 2.2 with evaluations; 93% after epoch 3; 94% after epoch 4
    assert fast_row.split()[1:7] == ["2.0", "(2.2)", "3.0", "(3.3)", "4.0", "(4.4)"]
    slow_row = [line for line in lines if line.startswith("slow ")][-1]
    assert slow_row.split()[1:5] == ["6.0", "(6.3)", "8.0", "(8.4)"] and "never" in slow_row
    mean_row = next(line for line in lines if line.startswith("mean +- std"))
    assert mean_row.split()[3:6] == ["4.0+-2.8", "5.5+-3.5", "4.0+-0.0"]  # 94%: one run of two got there
    assert "[1/2]" in mean_row and "0.9350+-0.0071" in mean_row
    from cifar10_dist.outputs import reading

    rows = [reading.time_to_accuracy(folder, [0.99]) for folder in (fast, slow)]
    assert reading.format_time_to_accuracy(rows, [0.99]).splitlines()[-2].split()[3] == "never"


def test_report_rejects_targets_that_are_not_accuracies(tmp_path):
    run = write_run(tmp_path / "run", [0.5], epoch_time=1, eval_time=1)
    result = run_in_this_process("report", str(run), "--targets=93")
    assert result.returncode == 2
    assert "targets=93 must be accuracies in (0, 1]" in result.stderr


def test_summary_json_is_written_and_read_through_one_record(tracked_run, tmp_path):
    """RunSummary writes summary.json and reads it back unchanged; a summary from an older version (without the
    newer keys) reads with their defaults, and one that is not a summary is a DamagedFile naming the file."""
    from cifar10_dist.outputs import reading
    from cifar10_dist.results import RunSummary

    _, run_dir = tracked_run
    written = json.loads((run_dir / "summary.json").read_text())
    summary = reading.read_summary(run_dir)
    assert isinstance(summary, RunSummary) and summary.to_dict() == written
    assert "trial" not in written and summary.best.split == "test" and summary.final["test"].num_samples > 0
    older = tmp_path / "older"
    older.mkdir()
    kept = ("run_dir", "best", "final", "epochs")
    (older / "summary.json").write_text(json.dumps({key: written[key] for key in kept}))
    old = reading.read_summary(older)
    assert (old.precision, old.hardware, old.world_size_changes, old.best) == (None, {}, [], summary.best)
    (older / "summary.json").write_text(json.dumps({"best": {"split": "test"}}))
    with pytest.raises(reading.DamagedFile, match=r"summary.json is damaged: not a run summary"):
        reading.read_summary(older)


def test_the_worker_names_no_tracker_and_each_checks_its_install_through_the_same_interface(monkeypatch, tmp_path):
    """Trackers are opened through outputs.trackers (TRACKERS): the training worker and its run end know none by
    name, and a tracker that is on but not installed is one line before anything starts."""
    from cifar10_dist.outputs import trackers

    repo = Path(__file__).resolve().parents[1]
    for module in ("training/run.py", "training/loop/run_end.py"):
        source = (repo / "cifar10_dist" / module).read_text().lower()
        assert not [name for name in trackers.TRACKERS if name in source], module
    monkeypatch.setitem(sys.modules, "clearml", None)
    result = run_in_this_process(
        "run", *TINY, "--dataset=synthetic", "--synthetic_size=64", "--with_clearml", f"--output_path={tmp_path}"
    )
    assert result.returncode == 2
    assert (
        result.stderr == "error: with_clearml needs ClearML: pip install 'cifar10-dist[clearml]' (or pip install "
        "clearml)\n"
    )
    assert not any(tmp_path.iterdir())


def test_the_environment_line_names_the_backend_also_with_one_process(tmp_path, caplog):
    """torchrun with one process still runs a process group: the log says so (a GPU check found it silent)."""
    caplog.set_level(logging.INFO, logger=log_lines.logger.name)
    log_lines.log_environment(Config(), torch.device("cpu"))
    assert "distributed:" not in caplog.text and "device cpu," in caplog.text
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        log_lines.log_environment(Config(), torch.device("cpu"))
    finally:
        idist.finalize()  # the group and idist's view of it (a bare destroy_process_group leaves idist native)
    assert "distributed: backend gloo, world size 1, 1 processes per node, 1 nodes" in caplog.text


def test_the_config_line_of_the_log_names_only_what_differs_from_the_defaults(caplog):
    config = Config(model="airbench", batch_size=1024)
    assert log_lines.changed_keys(config.to_dict()) == {"model": "airbench", "batch_size": 1024}
    with caplog.at_level("INFO", logger="cifar10_dist"):
        log_lines.log_environment(config, torch.device("cpu"))
    assert (
        "config (what differs from the defaults; every key is in the run folder's config.yaml): model=airbench, "
        "batch_size=1024"
    ) in caplog.text
    assert log_lines.changed_keys(Config().to_dict()) == {}


@pytest.mark.parametrize(
    "given, seconds, warned",
    [(None, 10.0, False), ("2.5", 2.5, False), ("0", 0.0, False), ("-1", 10.0, True), ("soon", 10.0, True)],
)
def test_the_seconds_between_tries_of_a_store_come_from_the_environment_or_the_default(
    given, seconds, warned, monkeypatch, caplog
):
    from cifar10_dist.outputs import tracker_guard

    if given is not None:
        monkeypatch.setenv(tracker_guard.RETRY_VARIABLE, given)
    assert tracker_guard.retry_seconds() == seconds
    assert (f"{tracker_guard.RETRY_VARIABLE}={given!r} is not a number of seconds >= 0" in caplog.text) == warned


def test_the_epoch_clock_counts_the_iterations_each_epoch_ran_for_the_log_and_the_record():
    """One count per epoch (outputs.progress.EpochClock), read by the progress line and the Recorder alike: the
    iterations since the epoch started (a resumed run's first epoch runs fewer than its length) times the images
    of an iteration, over Ignite's own epoch time."""
    from ignite.engine import Engine, Events

    from cifar10_dist.outputs.progress import EpochClock

    trainer = Engine(lambda engine, batch: None)
    clock = EpochClock(images_per_iteration=64).attach(trainer)
    seen = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda engine: seen.append(clock.timing(engine)))
    trainer.run(range(5), max_epochs=2)
    assert [timing.iterations for timing in seen] == [5, 5]
    for timing in seen:
        assert timing.images_per_second == pytest.approx(5 * 64 / max(timing.seconds, 1e-9))
    trainer.state.iteration, trainer.state.epoch = 7, 1  # as a resume from iteration 7 of 5-iteration epochs
    trainer.run(range(5), max_epochs=3)
    assert [timing.iterations for timing in seen[2:]] == [3, 5]  # the rest of epoch 2, then all of epoch 3

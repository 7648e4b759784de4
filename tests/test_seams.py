"""Rough edges at the seams, third round (issue 66): a mistyped flag suggests what the command takes, export's help
without torch, a bad device in one line, a closed pipe ends quietly, a refused resume writes nothing, a switch
before a path stays a switch, a full disk under the image cache is one line, a rerun study draws anew and calls
a stopped trial interrupted, threads never outnumber the CPU mask, config.yaml records what ran, report keeps
splits apart, predict names a broken link, and an export without room for its sidecar leaves nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.conftest import REPO, TINY, cli_env, run_forked, run_in_this_process
from tests.reliability.test_outputs import fill, small_filesystem  # noqa: F401 - a fixture
from tests.test_image_folders import write_image_folder


@pytest.fixture(scope="module")
def best_model(long_reference) -> Path:
    """A best-model file of the LONG reference run (simple_cnn on small_dataset)."""
    return sorted(long_reference.glob("best_model_*.pt"))[-1]


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["lr-find", "--num_iters=5"],
            "lr-find does not take --num_iters (did you mean --num_iter?): it takes its flags "
            "(--start_lr, --end_lr, --num_iter, --diverge_threshold, --rule, --smoothing, "
            "--output_dir) and the config keys (cifar10-dist lr-find --help)",
        ),
        (
            ["batch-size", "--budget_second=1"],
            "batch-size does not take --budget_second (did you mean --budget_seconds?)",
        ),
        (["evaluate", "--raw_weight"], "evaluate does not take --raw_weight (did you mean --raw_weights?)"),
        (["tune", "--trails=2"], "tune does not take --trails (did you mean --trials?)"),
        (
            ["run", "--trials=3"],
            "run does not take --trials (tune takes it: cifar10-dist tune --trials=...): it takes the "
            "config keys (cifar10-dist run --help)",
        ),
        (["run", "--tria=3"], "unknown config key 'tria': run with --help to list the valid keys"),  # trial: tune's own
    ],
)
def test_a_mistyped_flag_is_matched_against_what_the_command_takes(args, line):
    result = run_in_this_process(*args)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith(f"error: {line}"), (
        result.stderr[-600:]
    )


def test_exports_help_page_and_a_mistyped_export_flag_answer_without_importing_torch():
    code = (
        "import io, contextlib, sys\nfrom cifar10_dist import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    codes = [cli.main(['export', '--help']), cli.main(['export', '--quantise=int8'])]\n"
        "print(codes, 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "[0, 2] False", result.stderr[-2000:]


@pytest.mark.parametrize(
    "device, line",
    [
        ("gpu", "device='gpu' is not a device name: "),
        ("cuda:99", "device='cuda:99' is not on this machine (torch "),
        ("mps", "device='mps' is not on this machine (torch "),
    ],
)
def test_a_device_this_machine_lacks_is_one_line_naming_what_it_has(device, line, best_model, tmp_path):
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has a GPU: the devices it lacks differ")
    result = run_in_this_process("predict", f"--checkpoint={best_model}", f"--device={device}", str(tmp_path))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith(f"error: {line}") and last.endswith("give one of cpu"), last
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["predict", "--help"], ["run", "--help"]])
def test_a_reader_that_went_away_ends_the_command_quietly(args):
    """``cifar10-dist ... | head -1``: the pipe's reader is gone before the page is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cifar10_dist", *args],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.close()  # the reader went away before the child writes
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141 and stderr == "", stderr[-2000:]


def test_a_best_model_file_given_to_resume_from_is_refused_before_anything_is_written(
    best_model, small_dataset, tmp_path
):
    result = run_in_this_process(
        "run",
        *TINY,
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=job",
        f"--resume_from={best_model}",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: resume_from='{best_model}' is a best-model file (one epoch's weights, no optimizer or trainer "
        "state), and a run continues from a training checkpoint: --resume_from takes a training_checkpoint_*.pt file "
        f"or auto; to start a new run from these weights, give --pretrained={best_model}"
    )
    assert list(tmp_path.iterdir()) == []  # no run folder: the same command without resume_from may start it
    taken = run_in_this_process(
        "run",
        *TINY,
        "--num_epochs=1",
        "--num_warmup_epochs=0.5",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=job",
        f"--pretrained={best_model}",
        "--with_amp=auto",
    )
    assert taken.returncode == 0, taken.stderr[-2000:]  # the advice works
    settled = (tmp_path / "job" / "config.yaml").read_text()  # what ran, not "auto"
    assert "\nwith_amp: auto" not in settled and "\nwarm_up_steps: 0\n" in settled
    assert ("\nwith_amp: true\namp_dtype: bfloat16\n" in settled) or "\nwith_amp: false\n" in settled


def test_a_switch_before_a_path_is_a_switch(best_model, tmp_path):
    image = tmp_path / "img.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(image)
    result = run_in_this_process("predict", f"--checkpoint={best_model}", "--json", str(image))
    assert result.returncode == 0, result.stderr[-1500:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["path"] == str(image)
    worded = run_in_this_process("predict", f"--checkpoint={best_model}", "--json", "false", str(image))
    assert worded.returncode == 0 and worded.stdout.startswith(f"{image}: "), worded.stderr[-800:]


def test_an_image_cache_without_room_is_one_line_and_leaves_no_partial_build(tmp_path, small_filesystem):  # noqa: F811
    data = write_image_folder(tmp_path / "data", train=40, test=10)
    fill(small_filesystem)
    result = run_forked(
        "prepare-data", "--dataset=folder", f"--data_path={data}", f"--cache_dir={small_filesystem}", "--image_size=64"
    )
    last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    assert result.returncode == 2, (result.returncode, result.stderr[-1500:])  # not a SIGBUS (135)
    assert (
        last.startswith("error: the image cache needs ") and " MiB in " in last and " MiB free: free some space" in last
    ), last
    assert not [path.name for path in small_filesystem.rglob("*building*")]


def test_a_cache_copied_to_a_full_disk_is_the_same_one_line(tmp_path, small_filesystem):  # noqa: F811
    data = write_image_folder(tmp_path / "data", train=40, test=10)
    assert run_forked("prepare-data", "--dataset=folder", f"--data_path={data}", "--image_size=64").returncode == 0
    fill(small_filesystem)
    result = run_forked(
        "prepare-data", "--dataset=folder", f"--data_path={data}", f"--cache_dir={small_filesystem}", "--image_size=64"
    )
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith("error: the image cache needs ") and len(last) < 300, last
    assert "make it writable" not in last and "[(" not in last


def test_a_memory_mapped_array_on_a_full_disk_fails_with_an_error_not_a_sigbus(small_filesystem):  # noqa: F811
    fill(small_filesystem)
    code = (
        "import errno, sys\nfrom cifar10_dist.data.cache_builds import allocated_memmap\n"
        "try:\n    allocated_memmap(__import__('pathlib').Path(sys.argv[1]) / 'x.npy', (4096, 3, 64, 64), "
        "'uint8')\n"
        "except OSError as error:\n    print(errno.errorcode[error.errno])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(small_filesystem)],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ENOSPC"), (done.returncode, done.stderr[-1000:])


def test_a_rerun_study_draws_anew_and_calls_the_stopped_trial_interrupted(tmp_path):
    """Trial 0 stopped (as a Ctrl-C leaves it: failed, marked interrupted); the same tune command again draws
    other values than trial 0's (a seeded sampler repeated its first draw), the same ones for the same history."""
    optuna = pytest.importorskip("optuna")
    from cifar10_dist.config import load_config
    from cifar10_dist.tuning import opening, reporting
    from cifar10_dist.tuning.search_space import Dimension

    base = load_config(None, output_path=str(tmp_path), val_split=0.1)
    space = {"learning_rate": Dimension("learning_rate", "float", low=1e-3, high=1.0, log=True)}
    options = opening.TuneOptions(study="cc", trials=2, sampler="random", sampler_seed=0)
    study, _ = opening.open_study(options, base, space)
    first = study.ask()
    drawn = space["learning_rate"].suggest(first)
    first.set_user_attr(reporting.INTERRUPTED, True)
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    draws = []
    for _ in range(2):  # the rerun, twice from the same history
        again, _ = opening.open_study(options, base, space)
        draws.append(
            again.sampler.sample_independent(
                again,
                again.get_trials()[0],
                "learning_rate",
                optuna.distributions.FloatDistribution(1e-3, 1.0, log=True),
            )
        )
    assert draws[0] != drawn and draws[0] == draws[1]
    table = reporting.trial_table(study.get_trials())
    assert "INTERRUPTED" in table and "FAIL" not in table
    assert reporting.format_trial_line(study.get_trials()[0]).startswith("trial 0: INTERRUPTED")


def test_threads_never_outnumber_the_cores_the_cpu_mask_allows(monkeypatch):
    from cifar10_dist.system import cpu

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # taskset -c 0
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cpu.cpu_threads_per_process() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert cpu.cpu_threads_per_process() == 4  # Slurm's 8, shared by 2


def test_report_averages_runs_of_one_split_only():
    from cifar10_dist.outputs import reading

    def row(name: str, split: str, final: float, minutes: float) -> dict:
        return {
            "run": name,
            "split": split,
            "final_accuracy": final,
            "total_time": 600.0,
            "reached": {0.5: {"epoch": 1, "training_time": minutes * 60, "with_evaluation": minutes * 60}},
        }

    text = reading.format_time_to_accuracy(
        [row("a", "val", 0.6, 1.0), row("b", "test", 0.8, 3.0), row("c", "test", 0.7, 5.0)], [0.5]
    )
    lines = text.splitlines()
    assert not any(line.startswith("mean +- std") for line in lines)
    assert next(line for line in lines if line.startswith("mean (test)")).split()[-2:] == ["4.0+-1.4", "0.7500+-0.0707"]
    assert next(line for line in lines if line.startswith("mean (val)")).split()[-1] == "0.6000+-0.0000"
    assert lines[-1].endswith("the runs chose on different splits (test, val): each split's runs are averaged apart")


def test_predict_names_a_broken_link_among_the_images(tmp_path):
    from cifar10_dist.deployment import inference

    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    (tmp_path / "b.png").symlink_to(tmp_path / "gone.png")
    found = inference.find_images([tmp_path])
    assert found.files == [tmp_path / "a.png"]
    assert found.failures == [(str(tmp_path / "b.png"), "a broken link (it points to nothing)")]


def test_an_export_without_room_for_its_sidecar_leaves_neither_file(best_model, tmp_path, small_filesystem):  # noqa: F811
    size = len(run_export(best_model, tmp_path / "probe.safetensors").read_bytes())
    filler = fill(small_filesystem)
    pages = -(-size // 4096) * 4096  # room for the model file's pages and not one more
    os.truncate(filler, filler.stat().st_size - pages)
    target = small_filesystem / "model.safetensors"
    result = run_in_this_process("export", f"--checkpoint={best_model}", "--format=safetensors", f"--output={target}")
    assert result.returncode == 2, result.stderr[-1500:]
    assert "model.safetensors, written before it, was removed" in result.stderr.strip().splitlines()[-1]
    assert not target.exists() and not target.with_name("model.safetensors.json").exists()


def run_export(checkpoint: Path, output: Path) -> Path:
    done = run_in_this_process("export", f"--checkpoint={checkpoint}", "--format=safetensors", f"--output={output}")
    assert done.returncode == 0, done.stderr[-1500:]
    return output

"""A catalogue of wrong inputs: each gives a one-line error naming the value and what is accepted,
exit code 2, no traceback, and no output folder. The catalogue runs in-process through ``cli.main`` (every case
fails before training starts); one real CLI subprocess per kind of failure proves the exit code and the line."""

from __future__ import annotations

import pickle
import shutil
import socket
from pathlib import Path

import pytest

from cifar10_dist import cli
from tests.conftest import TINY, run_forked

TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "test", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}


def damaged_copy(data_path: Path, target: Path, damage) -> Path:
    shutil.copytree(data_path, target)
    damage(target / "cifar-10-batches-py")
    return target


def truncate(folder: Path) -> None:
    path = folder / "data_batch_4"
    path.write_bytes(path.read_bytes()[:1000])


def not_a_dict(folder: Path) -> None:
    (folder / "data_batch_1").write_bytes(pickle.dumps([1, 2, 3]))


def label_out_of_range(folder: Path) -> None:
    entry = pickle.loads((folder / "test_batch").read_bytes())
    entry["labels"][7] = 12
    (folder / "test_batch").write_bytes(pickle.dumps(entry))


# (case id, extra arguments, environment, expected message); "{data}" is a valid small dataset
CATALOGUE = [
    ("unknown key", ["--zzz=1"], {}, "unknown config key 'zzz': run with --help to list the valid keys"),
    ("misspelled key", ["--learning_rat=0.1"], {}, "unknown config key 'learning_rat': did you mean 'learning_rate'?"),
    ("wrong type int", ["--batch_size=abc"], {}, "batch_size='abc' has the wrong type: expected int"),
    ("wrong type bool", ["--nesterov=maybe"], {}, "nesterov='maybe' has the wrong type: expected bool"),
    ("out of range", ["--momentum=1.5"], {}, "momentum=1.5 must be in [0, 1)"),
    (
        "warmup too long",
        ["--num_epochs=3", "--num_warmup_epochs=3"],
        {},
        "num_warmup_epochs=3.0 must be at least 0 and less than num_epochs=3",
    ),
    (
        "batch below world size",
        ["--backend=gloo", "--nproc_per_node=3", "--batch_size=2"],
        {},
        "batch_size=2 is smaller than the world size 3",
    ),
    (
        "unknown model",
        ["--model=resnet19"],
        {},
        "model='resnet19' is unknown (did you mean 'resnet18'?): choose one of",
    ),
    ("unknown backend", ["--backend=mpi"], {}, "backend='mpi' is unknown: choose one of gloo, nccl, xla-tpu, horovod"),
    (
        "missing data folder",
        ["--data_path={tmp}/nowhere", "--download=False"],
        {},
        "CIFAR-10 not found: put cifar-10-python.tar.gz",
    ),
    ("truncated batch file", ["--data_path={truncated}"], {}, "data_batch_4 is not a readable CIFAR-10 batch file"),
    (
        "malformed batch file",
        ["--data_path={not_a_dict}"],
        {},
        "data_batch_1 is not a CIFAR-10 batch file: expected a dict, found list",
    ),
    ("label out of range", ["--data_path={bad_label}"], {}, "label 12 is out of range: labels must be 0..9"),
    (
        "output path under a file",
        ["--output_path={tmp}/a_file/out"],
        {},
        "output_path='{tmp}/a_file/out' is not writable: Not a directory",
    ),
    ("nccl without CUDA", ["--backend=nccl"], {}, "backend='nccl' needs CUDA GPUs, but none is available here"),
    (
        "xla-tpu without torch_xla",
        ["--backend=xla-tpu"],
        {},
        "backend='xla-tpu' needs torch_xla, which is not installed",
    ),
    (
        "master port in use",
        ["--backend=gloo", "--nproc_per_node=2", "--master_port={busy_port}"],
        {},
        "is already in use on this machine",
    ),
    (
        "nproc_per_node under torchrun",
        ["--backend=gloo", "--nproc_per_node=2"],
        TORCHRUN_ENV,
        "nproc_per_node=2 cannot be used under torchrun, which already started 2 processes",
    ),
    ("no backend under torchrun", [], TORCHRUN_ENV, "torchrun started 2 processes but backend is None"),
    ("missing resume checkpoint", ["--resume_from={tmp}/nope.pt"], {}, "nope.pt' does not exist"),
    ("auto resume without run name", ["--resume_from=auto"], {}, "resume_from=auto needs run_name"),
    ("missing config file", ["--config={tmp}/nope.yaml"], {}, "nope.yaml' does not exist"),
    ("config file is a folder", ["--config={tmp}"], {}, "is a folder: give a YAML file"),
    (
        "missing init folder",
        ["--backend=gloo", "--nproc_per_node=2", "--init_method=file://{tmp}/nowhere/init"],
        {},
        "/nowhere does not exist",
    ),
    (
        "tcp init method",
        ["--backend=gloo", "--nproc_per_node=2", "--init_method=tcp://127.0.0.1:29500"],
        {},
        "init_method='tcp://127.0.0.1:29500' is not accepted: use env:// or file:///path/on/a/shared/filesystem",
    ),
    (
        "stale init file",
        ["--backend=gloo", "--nproc_per_node=2", "--init_method=file://{tmp}/a_file"],
        {},
        "the file already exists (left by an earlier run?)",
    ),
    ("file init without backend", ["--init_method=file://{tmp}/init"], {}, "needs backend gloo or nccl"),
    ("val split out of range", ["--val_split=1.5"], {}, "val_split=1.5 must be in [0, 1), e.g. 0.1"),
    ("no seeds", ["--seeds=0"], {}, "seeds=0 must be at least 1"),
    (
        "seeds with one checkpoint",
        ["--seeds=2", "--resume_from={tmp}/a_file"],
        {},
        "one checkpoint cannot continue several runs; use auto",
    ),
]


@pytest.fixture(scope="module")
def inputs(small_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    (root / "a_file").write_text("a file, not a folder")
    listener = socket.socket()
    listener.bind(("", 0))
    listener.listen()
    values = {
        "data": str(small_dataset),
        "truncated": str(damaged_copy(small_dataset, root / "truncated", truncate)),
        "not_a_dict": str(damaged_copy(small_dataset, root / "not_a_dict", not_a_dict)),
        "bad_label": str(damaged_copy(small_dataset, root / "bad_label", label_out_of_range)),
        "busy_port": str(listener.getsockname()[1]),
    }
    yield root, values
    listener.close()


@pytest.mark.parametrize(("case", "args", "env", "message"), CATALOGUE, ids=[case[0] for case in CATALOGUE])
def test_bad_input_gives_one_line_exit_2_and_no_output(inputs, tmp_path, monkeypatch, capsys, case, args, env, message):
    root, values = inputs
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    output = tmp_path / "out"
    filled = [arg.format(tmp=root, **values) for arg in args]
    before = (root / "a_file").read_text()
    code = cli.main(["run", *TINY, f"--data_path={values['data']}", f"--output_path={output}", *filled])
    stderr = capsys.readouterr().err
    assert code == 2, stderr[-2000:]
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: ") and message.format(tmp=root) in last_line, last_line
    assert "Traceback" not in stderr
    assert not output.exists()
    assert (root / "a_file").read_text() == before and (root / "a_file").is_file()


# one real process per kind of failure: a config value, the data, the launch environment, the output folder
PROCESS_CASES = [
    (["--momentum=1.5"], "error: momentum=1.5 must be in [0, 1)"),
    (["--data_path={truncated}"], "data_batch_4 is not a readable CIFAR-10 batch file"),
    (["--backend=nccl"], "error: backend='nccl' needs CUDA GPUs, but none is available here"),
    (["--output_path={tmp}/a_file/out"], "is not writable: Not a directory"),
]


@pytest.mark.parametrize(("args", "message"), PROCESS_CASES, ids=["config", "data", "launch", "output"])
def test_each_kind_of_bad_input_ends_the_cli_process_with_exit_2_and_one_line(inputs, tmp_path, args, message):
    root, values = inputs
    output = tmp_path / "out"
    filled = [arg.format(tmp=root, **values) for arg in args]
    result = run_forked("run", *TINY, f"--data_path={values['data']}", f"--output_path={output}", *filled, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: ") and message in last_line, last_line
    assert "Traceback" not in result.stderr and not output.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["evaluate"], "error: evaluate needs --checkpoint=PATH"),
        (["evaluate", "--checkpoint=nope.pt"], "error: checkpoint 'nope.pt' does not exist"),
        (
            ["fly"],
            "error: unknown command 'fly': choose one of run, lr-find, batch-size, evaluate, predict, export, "
            "tune, prepare-data, report",
        ),
        (["report"], "error: report needs at least one run folder"),
        (["report", "nowhere"], "error: run folder 'nowhere' does not exist"),
        (["prepare-data", "--synthetic=-5"], "error: synthetic=-5, synthetic_test=1: both must be whole numbers >= 1"),
    ],
)
def test_bad_commands_give_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    code = cli.main(args)
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in stderr

"""README.md is a door whose commands work: every command of "The jobs people come for" runs as written (made tiny:
a few synthetic images, one epoch, a small CNN, outputs in a temporary folder), and its sample output has the fields
a real run prints. A command added to that section without a way to run it here fails the test."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from cifar10_dist.config import shipped_configs
from tests.conftest import REPO, TINY_WIDTH, run_in_this_process, run_torchrun_forked, start_forked, stop_all

README = (REPO / "README.md").read_text()
SECTION = README[README.index("## The jobs people come for") : README.index("## From Python")]
COMMANDS = [
    line
    for block in re.findall(r"```bash\n(.*?)```", SECTION, re.DOTALL)
    for line in block.splitlines()
    if line.strip() and not line.startswith("#")
]
# what makes each command tiny, appended after it (the command's own words stay as written)
TINY = [
    "--synthetic_size=160",
    "--num_epochs=1",
    "--num_warmup_epochs=0.5",
    "--train_eval_size=32",
    "--figures=False",
    "--model=simple_cnn",
    f'--model_kwargs={{"width": {TINY_WIDTH}}}',
    "--batch_size=32",
    "--num_workers=0",
]


def words(command: str) -> list[str]:
    return shlex.split(command)


def test_the_door_shows_the_headline_jobs_in_its_first_60_lines_with_one_spelling_of_config():
    first = "\n".join(README.splitlines()[:60])
    for job in ("--nproc_per_node=2", "torchrun --nproc_per_node=2", "--nnodes=2", "--dataset=folder"):
        assert job in first, job
    spelled = re.findall(r"--config[= ]([^\s`]+)", README)
    assert spelled and set(spelled) <= set(shipped_configs())  # one spelling: a shipped config's name
    assert len(COMMANDS) == 10, COMMANDS  # each is run below


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Where the commands run: output_path and my_images (two classes of a few images each) inside."""
    root = tmp_path_factory.mktemp("readme")
    for split, count in (("train", 24), ("test", 8)):
        for number, colour in enumerate(((200, 40, 40), (40, 40, 200))):
            place = root / "my_images" / split / f"class{number}"
            place.mkdir(parents=True)
            for index in range(count):
                Image.new("RGB", (32, 32), tuple(c + index for c in colour)).save(place / f"{index}.png")
    return root


def run_readme(command: str, folder: Path, *extra: str):
    """One README command in this process (the CLI's entry point), with its paths made to live in ``folder``."""
    args = [word.replace("demo-output/", f"{folder}/demo-output/") for word in words(command)[1:]]
    args = [arg.replace("my_images", str(folder / "my_images")) for arg in args]
    return run_in_this_process(*args, *extra)


@pytest.fixture(scope="module")
def trained(folder) -> tuple[subprocess.CompletedProcess, Path]:
    """The first command (one process): what it printed, and its run folder, which the evaluate, predict and
    export commands read."""
    result = run_readme(COMMANDS[0], folder, *TINY, f"--output_path={folder / 'demo-output'}")
    assert result.returncode == 0, result.stderr[-3000:]
    return result, folder / "demo-output" / "one"


def test_one_process_runs_and_prints_what_the_sample_output_shows(trained):
    result, run_dir = trained
    sample = re.search(r"Every run ends with lines like these.\n\n```\n(.*?)```", README, re.DOTALL).group(1)
    pattern = re.escape(sample.strip())
    for number in sorted(set(re.findall(r"\d+\.\d+", sample)), key=len, reverse=True):
        pattern = pattern.replace(re.escape(number), r"\d+\.\d+")
    pattern = re.sub(r"\\\(\d+\\ images", r"\\(\\d+\\ images", pattern)
    printed = result.stdout.strip().replace(str(run_dir.parent) + "/", "demo-output/")
    assert re.fullmatch(pattern, printed), (pattern, printed)


@pytest.mark.parametrize("index", [1])
def test_two_processes_run_as_written(folder, index):
    result = run_readme(COMMANDS[index], folder, *TINY, f"--output_path={folder / 'demo-output'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (folder / "demo-output" / "two" / "summary.json").is_file()


def test_torchrun_runs_as_written(folder):
    command = words(COMMANDS[2])
    assert command[:3] == ["torchrun", "--nproc_per_node=2", "-m"] and command[3] == "cifar10_dist"
    result = run_torchrun_forked(2, *command[4:], *TINY, f"--output_path={folder / 'demo-output'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (folder / "demo-output" / "torchrun" / "summary.json").is_file()


def test_two_nodes_run_as_written_on_this_machine(folder):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nodes = []
    try:
        for command in COMMANDS[3:5]:
            args = [word.replace("10.0.0.1", "127.0.0.1").replace("29500", str(port)) for word in words(command)[1:]]
            nodes.append(start_forked(*args, *TINY, f"--output_path={folder / 'demo-output'}"))
        ended = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            stop_all(node)
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in ended]
    assert (folder / "demo-output" / "nodes" / "summary.json").is_file()


def test_the_slurm_command_names_a_script_the_slurm_tests_run():
    command = words(COMMANDS[5])
    assert command[0] == "sbatch" and (REPO / command[1]).is_file()
    assert Path(command[1]).name in (REPO / "tests" / "test_slurm.py").read_text()


def test_own_images_run_as_written(folder):
    result = run_readme(COMMANDS[6], folder, *TINY, f"--output_path={folder / 'demo-output'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((folder / "demo-output" / "mine" / "summary.json").read_text())["final"]["test"]


def test_evaluate_predict_and_export_take_the_run_folder_as_written(folder, trained):
    _, run_dir = trained
    evaluated = run_readme(COMMANDS[7], folder)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    listed = re.search(
        r"`evaluate --json`'s last line is one JSON object with these keys: (.*?)\.\n", README, re.DOTALL
    )
    keys = re.findall(r"`(\w+)`", listed.group(1))
    assert list(json.loads(evaluated.stdout.strip().splitlines()[-1])) == keys
    predicted = run_readme(COMMANDS[8], folder)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert len(predicted.stdout.strip().splitlines()) == 48  # a line per image of my_images/train
    exported = run_readme(COMMANDS[9], folder)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert list(run_dir.glob("best_model_*.onnx"))

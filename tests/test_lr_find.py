"""lr-find and learning_rate=find: the sweep on a problem whose good range is known, the model and optimizer
restored, every rank agreeing, an early stop on divergence, the plot, and a run that trains with the suggestion."""

from __future__ import annotations

import json
import math
import os
import re
import signal
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from torch import nn

from cifar10_dist import api
from cifar10_dist.config import LrSweep
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.before_training import lr_finding
from cifar10_dist.training.loop.step import TrainStep, create_trainer
from tests.conftest import SPAWN_2, TINY, assert_same_nested, run_in_this_process, start_forked, stop_all
from tests.reliability.test_faults import gone, worker_pids

SYNTHETIC = ["--dataset=synthetic", "--synthetic_size=320", *TINY]


def regression(count: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear regression in 8 dimensions with input scales 0.5..2 and a little noise: least squares, whose good
    learning rates are known exactly (below)."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(count, 8, generator=generator) * torch.linspace(0.5, 2.0, 8)
    targets = inputs @ torch.randn(8, 1, generator=generator) + 0.1 * torch.randn(count, 1, generator=generator)
    return inputs, targets


def batches_of(inputs: torch.Tensor, targets: torch.Tensor, seed: int = 0) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        list(zip(inputs, targets)), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )


def sweep_of(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module, loader, settings: LrSweep):
    step = TrainStep(model, optimizer, loss_fn, Precision("cpu", None))
    trainer = create_trainer(step, lambda batch, iteration: (batch[0], batch[1]))
    return lr_finding.sweep(trainer, {"model": model, "optimizer": optimizer}, optimizer, loader, [1.0], settings)


def test_the_suggestion_lies_in_the_range_where_sgd_solves_least_squares():
    """The mean squared error's Hessian is 2 E[x x^T]: plain SGD diverges above 2 over its largest eigenvalue
    and crawls far below it (a hundredth of it needs hundreds of steps per e-fold on the flattest direction).
    Both rules must land in [1/100, 1] of the stability limit, and the sweep must stop on the divergence."""
    inputs, targets = regression()
    stable_below = 2 / torch.linalg.eigvalsh(2 * inputs.T @ inputs / len(inputs)).max().item()
    torch.manual_seed(0)
    model = nn.Linear(8, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    learning_rates, losses, stopped = sweep_of(
        model, optimizer, nn.MSELoss(), batches_of(inputs, targets), LrSweep(num_iter=100, end_lr=10.0)
    )
    found = lr_finding.suggestions(learning_rates, losses)
    assert stable_below / 100 <= found["steepest"] <= stable_below, (found, stable_below)
    assert stable_below / 100 <= found["minimum"] <= stable_below, (found, stable_below)
    assert stopped in ("diverged", "not finite"), stopped  # 10 is far past stability: stopped early
    assert len(losses) < 100
    assert learning_rates == sorted(learning_rates) and learning_rates[0] == pytest.approx(1e-6, rel=0.2)


def test_the_model_and_the_optimizer_are_as_before_the_sweep():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(64, 8)).logsumexp(1).mean().backward()
    optimizer.step()  # momentum buffers to restore
    before_model = {key: value.clone() for key, value in model.state_dict().items()}
    before_optimizer = json.loads(json.dumps(optimizer.state_dict(), default=lambda t: t.tolist()))
    inputs = torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
    loader = batches_of(inputs, (inputs[:, 0] > 0).long() + 2 * (inputs[:, 1] > 0).long())
    sweep_of(model, optimizer, nn.CrossEntropyLoss(), loader, LrSweep(num_iter=20))
    assert_same_nested(before_model, model.state_dict(), "model")
    assert json.loads(json.dumps(optimizer.state_dict(), default=lambda t: t.tolist())) == before_optimizer


def test_a_loss_that_never_falls_is_one_line_naming_the_range(tmp_path):
    # every iteration the same 32 images, unaugmented: at these rates the loss stays where it starts (its noise over
    # other batches would read as a fall or a rise by chance)
    result = run_in_this_process(
        "lr-find",
        *SYNTHETIC,
        "--synthetic_size=32",
        "--crop_padding=0",
        "--flip=none",
        "--start_lr=1e-9",
        "--end_lr=1e-8",
        "--num_iter=8",
        f"--output_path={tmp_path}",
    )
    assert result.returncode == 2
    assert "the loss did not fall between learning_rate 1e-09 and" in result.stderr
    assert "start lower (--start_lr)" in result.stderr
    assert not list(tmp_path.iterdir())  # no empty lr_find-* folder left behind


NAN_MODEL = """
from torch import nn


class NotANumber(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 10)

    def forward(self, images):
        return self.head(images.mean(dim=(2, 3))) * float("nan")
"""


def test_a_loss_that_is_nan_from_the_first_iteration_is_not_blamed_on_the_learning_rate(tmp_path):
    (tmp_path / "broken.py").write_text(NAN_MODEL)
    output = tmp_path / "out"
    result = run_in_this_process(
        "lr-find",
        *SYNTHETIC,
        f"--model={tmp_path / 'broken.py'}:NotANumber",
        "--model_kwargs={}",
        "--num_iter=8",
        f"--output_path={output}",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: lr-find: the loss was nan at the first iteration, at learning_rate 1e-06, before any learning rate "
        "could matter: the model or the data gives no finite loss (check the model's output on a batch, the data's "
        "values, with_amp), and no learning rate will fix that"
    )
    assert not output.exists() or not list(output.iterdir())


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--start_lr=1", "--end_lr=0.1"], "start_lr=1.0 and end_lr=0.1: the sweep needs 0 < start_lr < end_lr"),
        (["--num_iter=2000"], "num_iter=2000 must be a whole number in 5..1000"),
        (["--rule=valley"], "rule='valley' is unknown: choose steepest or minimum"),
        (["--diverge_threshold=1"], "diverge_threshold=1.0 must be greater than 1"),
        (["--smoothing=1"], "smoothing=1.0 must be in (0, 1), e.g. 0.05"),
    ],
)
def test_bad_sweep_settings_are_refused_in_one_line(flags, message, tmp_path):
    result = run_in_this_process("lr-find", *SYNTHETIC, *flags, f"--output_path={tmp_path}")
    assert result.returncode == 2
    assert message in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_lr_find_writes_its_plot_and_record_and_prints_the_suggestion(tmp_path):
    folder = tmp_path / "sweep"
    result = run_in_this_process(
        "lr-find", *SYNTHETIC, "--num_iter=30", "--end_lr=10", f"--output_dir={folder}", f"--output_path={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((folder / "lr_find.json").read_text())
    assert f"suggested learning_rate: {record['suggestion']:.3g} (steepest" in result.stdout
    assert f"train with: --learning_rate={record['suggestion']:.3g}" in result.stdout
    assert record["learning_rates"][0] == pytest.approx(1e-6, rel=0.8)
    assert len(record["losses"]) == len(record["learning_rates"]) <= 30
    assert record["suggestion"] in record["learning_rates"]
    assert record["group_ratios"] == [1.0]
    with Image.open(folder / "lr_find.png") as image:
        assert image.format == "PNG" and image.size[0] > 300
        image.verify()


def test_param_groups_are_swept_at_their_ratios_and_muon_lr_keeps_its_own(tmp_path):
    result = api.lr_find(
        None,
        num_iter=10,
        rule="minimum",
        output_dir=tmp_path / "sweep",
        dataset="synthetic",
        synthetic_size=320,
        model="simple_cnn",
        model_kwargs={"width": 8},
        batch_size=32,
        num_workers=0,
        learning_rate=0.2,
        muon_lr=0.05,
        bias_lr_scale=4.0,
        backbone_lr_scale=0.1,
        freeze_epochs=1,
        num_epochs=3,
        output_path=str(tmp_path),
    )
    ratios = sorted({round(ratio, 6) for ratio in result.group_ratios})
    # head 1; backbone 0.1; backbone norm biases 4 x 0.1; head has no norm; the filters (Muon) 0.05 / 0.2 x 0.1
    assert ratios == [0.025, 0.1, 0.4, 1.0], result.group_ratios
    assert result.muon_lr == pytest.approx(result.suggestion * 0.05 / 0.2)


def test_smoothing_sets_how_much_of_each_loss_the_smoothed_curve_takes(tmp_path):
    """Each point of the smoothed loss takes ``smoothing`` of its iteration's loss and the rest from the point
    before: the raw losses read back from a sweep at 0.5 give the default sweep's (0.05) points, the same seed's."""
    common = dict(
        num_iter=10,
        rule="minimum",
        dataset="synthetic",
        synthetic_size=320,
        model="simple_cnn",
        model_kwargs={"width": 8},
        batch_size=32,
        num_workers=0,
        output_path=str(tmp_path),
    )
    half = api.lr_find(None, smoothing=0.5, output_dir=tmp_path / "half", **common).losses
    default = api.lr_find(None, output_dir=tmp_path / "default", **common).losses
    raw = [half[0]] + [(half[step] - 0.5 * half[step - 1]) / 0.5 for step in range(1, len(half))]
    assert default[0] == pytest.approx(raw[0]) and len(default) == len(half) == 10
    for step in range(1, len(default)):
        assert default[step] == pytest.approx(0.05 * raw[step] + 0.95 * default[step - 1], rel=1e-4)


class RankRecordingWorker(lr_finding.LrFindWorker):
    """The lr-find worker, also writing each rank's suggestion (the launcher returns rank 0's alone)."""

    def __call__(self, config):
        import ignite.distributed as idist

        result = super().__call__(config)
        Path(self.folder, f"rank{idist.get_rank()}.json").write_text(json.dumps(result["suggestion"]))
        return result


def test_two_gloo_processes_agree_on_the_suggestion(tmp_path):
    from cifar10_dist.launch import spawn

    config = api.resolve(
        None,
        dataset="synthetic",
        synthetic_size=320,
        model="simple_cnn",
        model_kwargs={"width": 8},
        batch_size=32,
        num_workers=0,
        output_path=str(tmp_path),
        backend="gloo",
        nproc_per_node=2,
    )
    spawn.run(RankRecordingWorker(LrSweep(num_iter=20, end_lr=10.0), str(tmp_path)), config)
    suggestions = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert suggestions[0] == suggestions[1] and math.isfinite(suggestions[0])


def test_lr_find_runs_over_spawned_gloo_processes(tmp_path):
    result = run_in_this_process(
        "lr-find",
        *SYNTHETIC,
        *SPAWN_2,
        "--num_iter=12",
        "--end_lr=10",
        f"--output_dir={tmp_path / 'sweep'}",
        f"--output_path={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "sweep" / "lr_find.png").is_file()


def test_learning_rate_find_trains_exactly_as_with_the_suggestion_given_and_records_it(tmp_path):
    found = run_in_this_process(
        "run", *SYNTHETIC, "--learning_rate=find", f"--output_path={tmp_path}", "--run_name=found"
    )
    assert found.returncode == 0, found.stderr[-2000:]
    run_dir = tmp_path / "found"
    summary = json.loads((run_dir / "summary.json").read_text())
    suggestion = summary["learning_rate_found"]["suggestion"]
    assert summary["learning_rate_found"]["rule"] == "steepest"
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["lr_found"]["suggestion"] == suggestion
    assert "learning_rate_found" not in json.loads((run_dir / "provenance.json").read_text())  # not provenance
    assert (run_dir / "lr_find.png").is_file() and (run_dir / "lr_find.json").is_file()
    given = run_in_this_process(
        "run", *SYNTHETIC, f"--learning_rate={suggestion!r}", f"--output_path={tmp_path}", "--run_name=given"
    )
    assert given.returncode == 0, given.stderr[-2000:]
    [a], [b] = (sorted((tmp_path / name).glob("training_checkpoint_*.pt")) for name in ("found", "given"))
    assert_same_nested(torch.load(a, weights_only=True)["model"], torch.load(b, weights_only=True)["model"], "model")
    # resumed, it trains on with the learning rate it found, without a new sweep
    resumed = run_in_this_process(
        "run", *SYNTHETIC, "--learning_rate=find", f"--output_path={tmp_path}", "--run_name=found", "--resume_from=auto"
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    log = (run_dir / "run.log").read_text()
    assert f"learning_rate=find: {suggestion:.4g}, as the run being resumed found it" in log
    assert log.count("lr-find: iteration") == 10  # the first launch's sweep alone (100 iterations, a line per 10)
    # the run's best model as a pretrained start of a sweep (the head new, the weights loaded before it)
    [best] = sorted(run_dir.glob("best_model_*.pt"))
    started = run_in_this_process(
        "lr-find",
        *SYNTHETIC,
        f"--pretrained={best}",
        "--num_iter=10",
        "--rule=minimum",
        f"--output_dir={tmp_path / 'pretrained'}",
        f"--output_path={tmp_path}",
    )
    assert started.returncode == 0, started.stderr[-2000:]
    assert json.loads((tmp_path / "pretrained" / "lr_find.json").read_text())["losses"][0] < math.log(10) - 0.5


def test_learning_rate_find_with_muon_lr_is_refused_in_one_line():
    result = run_in_this_process("run", "--learning_rate=find", "--muon_lr=0.1")
    assert result.returncode == 2
    assert "learning_rate=find with muon_lr=0.1: the sweep keeps muon_lr's ratio to learning_rate" in result.stderr


def test_the_recorded_loss_is_the_ranks_mean_not_their_sum(tmp_path):
    """Ignite's finder sums the ranks' losses; the record and the plot show their mean: the first point of a
    sweep over two processes is near ln(10), the loss of a fresh 10-class network, not twice it."""
    result = api.lr_find(
        None,
        num_iter=5,
        rule="minimum",
        output_dir=tmp_path / "sweep",
        dataset="synthetic",
        synthetic_size=320,
        model="simple_cnn",
        model_kwargs={"width": 8},
        batch_size=32,
        num_workers=0,
        output_path=str(tmp_path),
        backend="gloo",
        nproc_per_node=2,
    )
    assert abs(result.losses[0] - math.log(10)) < 0.7, result.losses


def test_a_steepest_fall_next_to_the_lowest_loss_is_warned_about():
    """The steepest rule on a curve that falls fastest right before it turns up: the suggestion is at the edge."""
    learning_rates = [10 ** (-4 + index / 10) for index in range(41)]  # 1e-4 .. 1
    losses = [2.3 - 0.001 * index for index in range(30)] + [1.5, 0.7] + [3.0 + index for index in range(9)]
    found = lr_finding.suggestions(learning_rates, losses)
    warning = lr_finding.edge_warning(found, "steepest")
    assert warning.startswith(f"the loss fell fastest at {found['steepest']:.3g}, within 2x of where it was lowest")
    assert f"--rule=minimum suggests {found['minimum']:.3g}" in warning
    assert lr_finding.edge_warning(found, "minimum") is None
    assert lr_finding.edge_warning({"steepest": 0.01, "minimum": 0.0025}, "steepest") is None  # lowest at 0.025: 2.5x


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop_signal", "to_group", "code", "line"),
    [
        (
            signal.SIGINT,
            True,
            130,
            r"lr-find interrupted at iteration \d+: nothing written; run the same command again",
        ),
        (
            signal.SIGTERM,
            False,
            75,
            r"lr-find stopped on SIGTERM at iteration \d+: nothing written; run the same command again",
        ),
    ],
)
def test_a_stop_signal_ends_a_two_process_sweep_with_one_line_that_fits_it(stop_signal, to_group, code, line, tmp_path):
    """Ctrl-C to the process group (a terminal) and SIGTERM to the launcher alone (a scheduler): every process
    ends at once, with 130 or 75 and a line about lr-find (no checkpoint to resume from), and no folder left."""
    sweep = start_forked(
        "lr-find", *SYNTHETIC, "--synthetic_size=2000", "--num_iter=1000", *SPAWN_2, f"--output_path={tmp_path}"
    )
    try:
        for text in sweep.stderr:  # the sweep is under way in both processes
            if "lr-find: iteration 20/1000" in text:
                break
        workers = worker_pids(sweep.pid)
        os.killpg(sweep.pid, stop_signal) if to_group else sweep.send_signal(stop_signal)
        _, rest = sweep.communicate(timeout=60)
    finally:
        stop_all(sweep)
    assert sweep.returncode == code, rest[-2000:]
    assert re.fullmatch(line, rest.strip().splitlines()[-1]), rest[-2000:]
    assert "Traceback" not in rest and gone(workers)
    assert not list(tmp_path.iterdir())

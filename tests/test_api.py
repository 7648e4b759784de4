"""The Python API in-process, as a notebook uses it: a Config object or a YAML path, typed results, and the
caller's process left as it was found (signal handlers, logging, matplotlib, torch settings)."""

from __future__ import annotations

import logging
import signal
import sys

import pytest
import torch

from cifar10_dist import api, load_config
from cifar10_dist.results import EvaluationResult, RunResult

SMALL = {
    "model": "simple_cnn",
    "dataset": "synthetic",
    "synthetic_size": 256,
    "batch_size": 32,
    "num_workers": 0,
    "num_epochs": 1,
    "num_warmup_epochs": 0.5,
    "train_eval_size": 32,
    "log_every_iters": 4,
}


def test_importing_the_package_or_its_command_line_does_not_import_torch():
    import subprocess

    probe = "import sys, cifar10_dist, cifar10_dist.cli; print('torch' in sys.modules)"  # --help pages stay instant
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"


def test_train_in_process_returns_typed_results_and_leaves_the_caller_as_it_was(tmp_path, monkeypatch):
    import matplotlib

    user_logger = logging.getLogger("cifar10_dist")
    user_handler = logging.StreamHandler(sys.stdout)
    user_logger.addHandler(user_handler)  # the notebook user configured the package's logger
    user_logger.setLevel(logging.ERROR)

    def user_handler_of_sigterm(signum, frame):  # pragma: no cover - never called
        pass

    signal.signal(signal.SIGTERM, user_handler_of_sigterm)
    backend, threads = matplotlib.get_backend(), torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # unset-like: let the run choose its threads
    monkeypatch.delenv("OMP_NUM_THREADS")
    try:
        config = load_config(**SMALL, output_path=str(tmp_path), run_name="api", deterministic=True)
        result = api.train(config)
        assert isinstance(result, RunResult) and result.iterations == 8 and result.epochs == 1
        assert result.test.num_samples == 51 and 0 <= result.test.accuracy <= 1 and result.run_dir.endswith("api")
        assert (tmp_path / "api" / "curves.png").is_file()
        assert user_logger.handlers == [user_handler] and user_logger.level == logging.ERROR
        assert signal.getsignal(signal.SIGTERM) is user_handler_of_sigterm
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
        assert matplotlib.get_backend() == backend
        assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()

        evaluated = api.evaluate(tmp_path / "api" / "training_checkpoint_8.pt", num_workers=0, batch_size=32)
        assert isinstance(evaluated, EvaluationResult)
        assert evaluated.accuracy == pytest.approx(result.test.accuracy) and evaluated.num_samples == 51
        assert sum(map(sum, evaluated.confusion_matrix)) == 51
    finally:
        user_logger.removeHandler(user_handler)
        user_logger.setLevel(logging.NOTSET)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_yaml_path_with_overrides_and_a_config_object_resolve_alike(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batch_size: 64\nnum_epochs: 7\n")
    from_path = api.resolve(path, num_epochs=9)
    from_object = api.resolve(load_config(batch_size=64, num_epochs=7), num_epochs=9)
    assert from_path == from_object and from_path.num_epochs == 9 and from_path.batch_size == 64


def test_prepare_data_report_and_evaluate_files_are_api_calls_the_cli_only_prints(tmp_path):
    """The CLI's prepare-data, report and evaluate's confusion files go through api.prepare_data, api.report and
    api.evaluate(output_dir=...): typed results, the same files."""
    from cifar10_dist.results import PreparedData, ReportResult

    prepared = api.prepare_data(tmp_path / "data", synthetic=320, synthetic_test=64, seed=1)
    assert prepared == PreparedData(str(tmp_path / "data" / "cifar-10-batches-py"), 320, 64, synthetic=True)
    run = api.train(
        load_config(
            None,
            **{**SMALL, "dataset": "cifar10"},
            data_path=str(tmp_path / "data"),
            output_path=str(tmp_path / "out"),
            run_name="r",
            checkpoint_every=5,
        )
    )
    checked = api.prepare_data(tmp_path / "data")
    assert (checked.train_images, checked.test_images, checked.synthetic, checked.official) == (320, 64, False, False)
    problems = []
    result = api.report([run.run_dir], tmp_path / "cmp.png", targets=[0.05], warn=problems.append)
    assert isinstance(result, ReportResult) and problems == [] and result.plot == str(tmp_path / "cmp.png")
    assert result.table.splitlines()[1].startswith("r ") and "reached" not in result.table and result.times
    checkpoint = f"{run.run_dir}/training_checkpoint_10.pt"
    metrics = api.evaluate(checkpoint, output_dir=tmp_path / "confusion", num_workers=0, batch_size=32)
    assert isinstance(metrics, EvaluationResult) and metrics.num_samples == 64
    assert sorted(path.name for path in (tmp_path / "confusion").iterdir()) == [
        "calibration_training_checkpoint_10.json",
        "calibration_training_checkpoint_10.png",
        "confusion_training_checkpoint_10.json",
        "confusion_training_checkpoint_10.png",
        "mistakes_training_checkpoint_10.json",
        "mistakes_training_checkpoint_10.png",
    ]
    with pytest.raises(api.UserError, match="^run folder '.*missing' does not exist$"):
        api.report([tmp_path / "missing"])


def test_a_run_in_this_process_ends_its_dataloader_workers_before_it_returns(tmp_path):
    """The workers a run keeps between epochs (persistent_workers) end with the run (``Loaders.close``); left to a
    later garbage collection, DataLoader would wait 5 s for each (its queues are closed first), 30 s for this run in
    a notebook's next cell, or in a study's next trial."""
    import multiprocessing

    before = set(multiprocessing.active_children())
    result = api.train(**{**SMALL, "num_workers": 2}, output_path=str(tmp_path))
    assert result.test is not None and result.test.num_samples > 0
    assert set(multiprocessing.active_children()) - before == set()  # no DataLoader worker left running

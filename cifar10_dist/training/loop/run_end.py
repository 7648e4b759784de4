"""The end of a run (``training.run``): every rank's memory, the final test evaluation's most confident mistakes
and reliability diagram, metrics.json, summary.json, curves.png and the hyperparameters (rank 0), and the run's
files for the trackers."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import ignite.distributed as idist

from cifar10_dist.config import Config
from cifar10_dist.data import run_data
from cifar10_dist.outputs import evaluation_files, files, memory_use, mistake_grid, plots, scalars
from cifar10_dist.outputs import summary as summary_file
from cifar10_dist.outputs.provenance import Provenance
from cifar10_dist.outputs.trackers import OpenTrackers
from cifar10_dist.results import Mistake, RunResult, TrialResult
from cifar10_dist.system import ranks
from cifar10_dist.training.loop.evaluators import MistakeCollector, expected_calibration_error, reliability

logger = logging.getLogger("cifar10_dist")


@dataclasses.dataclass
class RunFindings:
    """What a run finds that is not provenance: summary.json's own fields (the learning rate lr-find found is the
    config's lr_found)."""

    profile: dict[str, Any] | None = None  # profile=N: the profiler's report
    calibration: dict[str, Any] | None = None  # calibrate=temperature: the fitted temperature and its split


def report_run_end(
    config: Config,
    run_dir: Path,
    result: RunResult | TrialResult,
    findings: RunFindings,
    *,
    data: run_data.DataSetup,
    opened: OpenTrackers,
    recorder: scalars.Recorder,
    mistakes: MistakeCollector | None,
    seconds: float,
) -> None:
    """Every rank's memory, the test set's mistakes, metrics.json, summary.json, curves (rank 0), and the
    run's files for the trackers."""
    memory = [round(float(value), 1) for value in idist.all_gather(memory_use.private_memory_mib())]  # type: ignore[union-attr]
    ranks.on_rank_zero(
        logger.info,
        "private memory per process at the end: %s MiB (anonymous resident; mapped cache "
        "pages are shared, not counted)",
        ", ".join(f"{m:.0f}" for m in memory),
    )
    if isinstance(result, RunResult) and mistakes is not None:  # tested (every rank has the test numbers; a trial's
        # run is not)
        found = mistakes.gathered(list(data.info.classes))
        ranks.on_rank_zero(write_mistakes, run_dir, found, data, recorder, result, config.figures)
        bins = mistakes.evaluator.state.metrics.get("calibration_bins")  # the same final test evaluation's
        if bins is not None:
            ranks.on_rank_zero(write_reliability, run_dir, bins, recorder, result, config.figures)
    ranks.on_rank_zero(
        write_run_end,
        run_dir,
        result,
        findings,
        config,
        data.provenance,
        opened.summary_fields(),
        recorder,
        seconds,
        memory,
    )
    opened.send_artifacts(run_dir)


def write_mistakes(
    run_dir: Path,
    found: list[Mistake],
    data_setup: run_data.DataSetup,
    recorder: scalars.Recorder,
    result: RunResult,
    figures: bool,
) -> None:
    """Rank 0: the final test evaluation's most confident mistakes, mistakes.json, and with ``figures``
    mistakes.png and in TensorBoard."""
    images = data_setup.loaders.test.dataset.images
    title = f"{run_dir.name}, {result.test.model or 'final model'}"
    record = {"model": result.test.model or "final", "test_images": len(images)}
    pixels = mistake_grid.write(run_dir, "mistakes", images, found, title, record, draw=figures)
    if pixels is not None:
        recorder.write_image("test/mistakes", pixels, result.iterations)


def write_reliability(run_dir: Path, bins: Any, recorder: scalars.Recorder, result: RunResult, figures: bool) -> None:
    """Rank 0: the final test evaluation's reliability diagram, calibration.json, and with ``figures``
    calibration.png and in TensorBoard."""
    pixels = evaluation_files.write_calibration(
        run_dir,
        "calibration",
        expected_calibration_error(bins),
        reliability(bins),
        f"{run_dir.name}, {result.test.model or 'final model'}",
        draw=figures,
    )
    if pixels is not None:
        recorder.write_image("test/calibration", pixels, result.iterations)


def write_run_end(
    run_dir: Path,
    result: RunResult | TrialResult,
    findings: RunFindings,
    config: Config,
    record: Provenance,
    tracker_fields: dict[str, Any],
    recorder: scalars.Recorder,
    seconds: float,
    memory: list[float],
) -> None:
    """Rank 0: metrics.json, summary.json, curves.png (with ``figures``) and the hyperparameters with the final
    metrics."""
    files.write_json(run_dir / "metrics.json", result.to_dict())
    summary = dataclasses.replace(
        summary_file.summarize(run_dir, result, record, seconds, config.best_metric),
        learning_rate_found=config.lr_found,
        profile=findings.profile or {},
        calibration=findings.calibration,
        **tracker_fields,
        trial=config.trial,
        private_memory_mib=memory,
        pruned_at_epoch=result.pruned_at if isinstance(result, TrialResult) else None,
    )
    files.write_json(run_dir / "summary.json", summary.to_dict())
    if config.figures:
        files.write_file(run_dir / "curves.png", lambda path: plots.render_curves(run_dir, path))
    recorder.write_hparams(config.replayable(), summary_file.final_scalars(summary), result.iterations)

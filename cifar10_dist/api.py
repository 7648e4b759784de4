"""The Python API: ``train``, ``train_seeds``, ``evaluate`` (from ``runs``), ``lr_find``, ``batch_size``,
``predict``, ``export``, ``tune``, ``doctor``, ``report`` and ``prepare_data``; the CLI and notebooks call these, and
nothing below calls up into it.

Each takes a YAML path plus keyword overrides, or a ``Config``, and resolves the config exactly once, before
torch is imported (a bad value fails in well under a second).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from cifar10_dist import runs
from cifar10_dist.config import INHERITED_BY_EVALUATE, Config, LrSweep, commands
from cifar10_dist.config.export_flags import EXPORT_FLAGS
from cifar10_dist.config.lr_sweep import OUTPUT_DIR
from cifar10_dist.errors import UserError
from cifar10_dist.launch import start_method
from cifar10_dist.results import (
    BatchSizeResult,
    DoctorReport,
    EvaluationResult,
    ExportResult,
    LrFindResult,
    PreparedData,
    ReportResult,
    TuneResult,
)
from cifar10_dist.runs import resolve, train, train_seeds

__all__ = [
    "INHERITED_BY_EVALUATE",
    "resolve",
    "train",
    "train_seeds",
    "evaluate",
    "lr_find",
    "batch_size",
    "predict",
    "predict_files",
    "export",
    "tune",
    "doctor",
    "report",
    "prepare_data",
]


def lr_find(
    config: Config | str | Path | None = None, output_dir: str | Path | None = OUTPUT_DIR.default, **options: Any
) -> LrFindResult:
    """Sweep learning_rate from ``start_lr`` to ``end_lr`` (log scale, ``num_iter`` iterations at most, stopped
    when the smoothed loss passes ``diverge_threshold`` times its lowest) with the run this config describes (its
    model, pretrained start, data, optimizer groups at their ratios, precision, processes), and suggest the
    peak learning_rate by ``rule`` (steepest or minimum); the model and optimizer are left as they were.
    ``options``: the sweep's (``LrSweep``'s fields, their defaults there), the rest config keys. Writes
    lr_find.json and lr_find.png to ``output_dir`` (default: a new output_path/lr_find-<time>). Every process of a
    torchrun/srun launch returns rank 0's result."""
    settings = commands.from_flags(LrSweep, options)
    settings.check()  # before torch is imported
    resolved = resolve(config, **commands.others(options, commands.flags_of(LrSweep)))
    if resolved.learning_rate == "find":
        raise UserError(
            "lr-find sweeps learning_rate itself: leave learning_rate=find out (a number sets the ratio "
            "muon_lr keeps to it)"
        )
    return runs.lr_find(resolved, settings, output_dir)


def batch_size(
    config: Config | str | Path | None = None,
    batch_sizes: Sequence[int] | None = commands.default(commands.BATCH_SIZE, "batch_sizes"),
    budget_seconds: float = commands.default(commands.BATCH_SIZE, "budget_seconds"),
    **overrides: Any,
) -> BatchSizeResult:
    """The batch the run this config describes should take here, measured with its own training step (model,
    optimizer, precision, memory format, image size) in this process: on a GPU the largest that fits with a
    margin, on a CPU the fastest of ``batch_sizes`` (per process; the config's own always included), each timed
    for about ``budget_seconds``; with the learning rate scaled to it by the optimizer's rule."""
    sizes = tuple(batch_sizes) if batch_sizes else None
    if sizes is not None and not all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in sizes
    ):
        raise UserError(
            f"batch_sizes={batch_sizes!r} must be whole numbers >= 1, comma-separated: --batch_sizes=64,128,256"
        )
    if not budget_seconds > 0:
        raise UserError(f"budget_seconds={budget_seconds} must be greater than 0")
    resolved = resolve(config, **overrides)
    from cifar10_dist import models
    from cifar10_dist.training.before_training.batch_sizes import find_batch_size

    models.check_model(resolved.model, resolved.model_kwargs, models.NUM_CLASSES, resolved.image_size)
    return find_batch_size(resolved, sizes, float(budget_seconds))


def predict(
    checkpoint: str | Path,
    images: Any,
    batch_size: int = commands.default(commands.PREDICT, "batch_size"),
    tta: int | None = commands.default(commands.PREDICT, "tta"),
    device: str | None = commands.default(commands.PREDICT, "device"),
    raw_weights: bool = commands.default(commands.PREDICT, "raw_weights"),
) -> Any:
    """Class probabilities, a float tensor (N, 10) on the CPU, of ``images``: image paths or folders, PIL images, or
    a uint8 tensor (N, 3, 32, 32). The checkpoint's model (its recorded reference) on the GPU when there is one,
    with the normalisation of evaluation and the checkpoint's ``tta`` unless given; EMA weights when the checkpoint
    has them, unless ``raw_weights``."""
    from cifar10_dist.deployment import inference
    from cifar10_dist.outputs.checkpoint_files import model_file

    trained = inference.load_trained_model(model_file(checkpoint), device, raw_weights)
    return inference.probabilities(trained, inference.as_uint8_batch(images, trained.info.stored_size), batch_size, tta)


def predict_files(
    checkpoint: str | Path,
    paths: Sequence[str | Path],
    batch_size: int = commands.default(commands.PREDICT, "batch_size"),
    tta: int | None = commands.default(commands.PREDICT, "tta"),
    device: str | None = commands.default(commands.PREDICT, "device"),
    raw_weights: bool = commands.default(commands.PREDICT, "raw_weights"),
) -> Any:
    """Image files and folders (searched recursively) classified with the checkpoint's model, as ``predict`` does,
    batch by batch: an ``inference.FilePredictions`` (classes, the paths that yield no file, lazy batches with
    each file's probabilities and the files that cannot be read)."""
    from cifar10_dist.deployment import inference
    from cifar10_dist.outputs.checkpoint_files import model_file

    if tta is not None:
        inference.check_tta(tta)
    trained = inference.load_trained_model(model_file(checkpoint), device, raw_weights)
    return inference.classify_files(trained, [str(path) for path in paths], batch_size, tta)


def export(
    checkpoint: str | Path,
    format: str,
    output: str | Path | None = commands.default(EXPORT_FLAGS, "output"),
    raw_weights: bool = commands.default(EXPORT_FLAGS, "raw_weights"),
    calibration: Any = None,
    **quantization: Any,
) -> ExportResult:
    """Write the checkpoint's model as one of ``config.export_formats.FORMATS`` (safetensors, pt2, onnx, torchscript;
    default: next to the checkpoint), with a JSON sidecar; the file is loaded back by its own runtime and compared with
    the PyTorch model first. ``quantize="int8"`` (onnx): ONNX Runtime's static quantization calibrated on
    ``calibration_images`` training images (or the uint8 images ``calibration``) by ``calibration_method`` (auto:
    the best on held-out training images), refused with nothing written when its top-1 agrees with the fp32
    model's on fewer than ``min_agreement`` of the test images (``quantization``: deployment.exporting.Quantization's
    flags, their defaults there)."""
    from cifar10_dist.deployment import exporting
    from cifar10_dist.outputs.checkpoint_files import model_file

    commands.refuse_unknown("export", quantization, commands.flags_of(exporting.Quantization))
    settings = commands.from_flags(exporting.Quantization, quantization, calibration=calibration)
    return exporting.export(model_file(checkpoint), format, output, raw_weights, settings)


def tune(
    config: Config | str | Path | None = None,
    space: str | Path | None = commands.default(commands.TUNE, "space"),
    study: str | None = commands.default(commands.TUNE, "study"),
    trials: int = commands.default(commands.TUNE, "trials"),
    storage: str | None = commands.default(commands.TUNE, "storage"),
    sampler: str = commands.default(commands.TUNE, "sampler"),
    sampler_seed: int | None = commands.default(commands.TUNE, "sampler_seed"),
    pruner: str = commands.default(commands.TUNE, "pruner"),
    pruner_startup_trials: int = commands.default(commands.TUNE, "pruner_startup_trials"),
    pruner_warmup_epochs: int = commands.default(commands.TUNE, "pruner_warmup_epochs"),
    final_test: bool = commands.default(commands.TUNE, "final_test"),
    heartbeat: int = commands.default(commands.TUNE, "heartbeat"),
    report_only: bool = commands.default(commands.TUNE, "report_only"),
    echo: Any = print,
    **overrides: Any,
) -> TuneResult:
    """Tune the config's hyperparameters over ``space`` (a SPACE.yaml) with Optuna: ``trials`` trials in this
    process, in the study ``study`` (storage: SQLite in output_path/STUDY/study.db unless given; several processes
    may share it). Returns a TuneResult (best trial, value, params, the final test when run); with
    ``report_only`` only reports an existing study."""
    from cifar10_dist.tuning import opening, search_space, studies

    options = opening.check_options(
        commands.TuneFlags(
            space=None if space is None else str(space),
            study=str(study or ""),
            trials=trials,
            storage=storage,
            sampler=sampler,
            sampler_seed=sampler_seed,
            pruner=pruner,
            pruner_startup_trials=pruner_startup_trials,
            pruner_warmup_epochs=pruner_warmup_epochs,
            final_test=final_test,
            heartbeat=heartbeat,
            report_only=report_only,
        )
    )
    resolved = resolve(config, **overrides)
    if report_only:
        return studies.report_only(str(options.study), storage, resolved.output_path, final_test, echo)
    if space is None:
        raise UserError(
            "tune needs --space=SPACE.yaml: the config keys to search and their ranges (see configs/space_fast.yaml)"
        )
    searched = search_space.read_space(space)
    studies.require_optuna()
    from cifar10_dist import preflight

    if start_method.started_by_torchrun() or (resolved.backend is not None and resolved.nproc_per_node is None):
        raise UserError(
            "tune starts each trial's processes itself: run one tune process per worker (not under "
            "torchrun or srun tasks) and give --backend with --nproc_per_node for multi-process trials"
        )
    preflight.check_before_launch(resolved)
    return studies.tune(resolved, searched, options, echo)


def doctor(
    model: str = commands.default(commands.DOCTOR, "model"),
    batch_size: int = commands.default(commands.DOCTOR, "batch_size"),
    budget_seconds: float = commands.default(commands.DOCTOR, "budget_seconds"),
    link: str | None = commands.default(commands.DOCTOR, "link"),
) -> DoctorReport:
    """What this machine is and what will be fast on it (a ``DoctorReport``): versions, CPU and its native
    bf16, GPUs, backends, a measured probe of ``model``'s training steps in each precision and memory format
    (about ``budget_seconds`` each), what ``with_amp=auto`` picks here, and advice; with ``link`` (1gbit, 100mbit,
    ...), the model's throughput at 2-16 nodes over it, without and with gradient compression."""
    if batch_size < 1 or budget_seconds <= 0:
        raise UserError(f"doctor needs batch_size >= 1 and budget_seconds > 0, not {batch_size} and {budget_seconds}")
    if link is not None:
        from cifar10_dist.system.scaling import link_bytes_per_second

        try:
            link_bytes_per_second(str(link))
        except ValueError as error:
            raise UserError(str(error)) from error
    from cifar10_dist import models
    from cifar10_dist.config import absolute_model_reference
    from cifar10_dist.system.doctor import examine
    from cifar10_dist.training.setup import plan

    model = absolute_model_reference(str(model))
    models.check_model(model, None, models.NUM_CLASSES)
    return examine(model, batch_size, budget_seconds, None if link is None else str(link), plan.automatic_choice)


def evaluate(
    checkpoint: str | Path,
    config: Config | str | Path | None = None,
    raw_weights: bool = commands.default(commands.EVALUATE, "raw_weights"),
    output_dir: str | Path | None = commands.default(commands.EVALUATE, "output_dir"),
    **overrides: Any,
) -> EvaluationResult:
    """``runs.evaluate``: test-set metrics, per-class accuracy, confusion matrix and the most confident
    mistakes of a saved model, in one pass; with ``output_dir`` the confusion matrix is also written there as
    confusion_<checkpoint name>.json and .png, and the mistakes as mistakes_<checkpoint name>.png and .json."""
    from cifar10_dist.outputs.checkpoint_files import model_file

    checkpoint = model_file(checkpoint)
    refuse_an_export(checkpoint)
    return runs.evaluate(checkpoint, config, raw_weights=raw_weights, output_dir=output_dir, **overrides)


def refuse_an_export(checkpoint: str | Path) -> None:
    """One line for a file of ``export`` given to evaluate, which reads checkpoints: what reads it instead."""
    from cifar10_dist.config import export_formats as formats

    exported = formats.exported_format(str(checkpoint))
    if exported is None:
        return
    instead = (
        f"classify images with it: cifar10-dist predict --checkpoint={checkpoint} IMAGES; "
        if exported.name == "onnx"
        else ""
    )
    raise UserError(
        f"evaluate reads training checkpoints and best-model files (.pt), and '{checkpoint}' is an "
        f"export ({exported.name}): {instead}for test-set metrics evaluate the checkpoint it was exported "
        f"from (its {Path(checkpoint).name}.json names it)"
    )


def report(
    run_dirs: Sequence[str | Path],
    output: str | Path = commands.default(commands.REPORT, "output"),
    targets: Sequence[float] | None = commands.default(commands.REPORT, "targets"),
    warn: Callable[[str], None] = print,
) -> ReportResult:
    """Compare run folders: a table, one plot overlaying their curves in ``output`` and, with ``targets``, the time
    each run took to reach those accuracies. A folder that cannot be read in full is one line through ``warn``;
    a UserError when none can be read."""
    from cifar10_dist.outputs import plots, reading

    folders = [Path(str(run_dir)) for run_dir in run_dirs]
    if not folders:
        raise UserError("report needs at least one run folder: cifar10-dist report RUN_DIR [RUN_DIR ...]")
    for folder in folders:
        if not folder.is_dir():
            raise UserError(f"run folder '{folder}' does not exist")
    comparison = reading.compare(folders)
    for problem in comparison.problems:
        warn(problem)
    if not comparison.rows:
        raise UserError(f"nothing to report: none of the {len(folders)} run folder(s) could be read (see above)")
    times = None
    if targets:
        rows = [reading.time_to_accuracy(folder, list(targets)) for folder in comparison.folders]
        times = reading.format_time_to_accuracy(rows, list(targets))
    plots.render_comparison(comparison.folders, Path(output))
    return ReportResult(reading.format_table(comparison.rows), str(output), times, list(comparison.problems))


def prepare_data(
    data_path: str | Path = commands.default(commands.PREPARE_DATA, "data_path"),
    dataset: str = commands.default(commands.PREPARE_DATA, "dataset"),
    synthetic: int | None = commands.default(commands.PREPARE_DATA, "synthetic"),
    synthetic_test: int | None = commands.default(commands.PREPARE_DATA, "synthetic_test"),
    seed: int = commands.default(commands.PREPARE_DATA, "seed"),
    image_size: int = commands.default(commands.PREPARE_DATA, "image_size"),
    skip_bad_images: bool = commands.default(commands.PREPARE_DATA, "skip_bad_images"),
    drop_test_duplicates: bool = commands.default(commands.PREPARE_DATA, "drop_test_duplicates"),
    cache_dir: str | Path | None = commands.default(commands.PREPARE_DATA, "cache_dir"),
    crop_fraction: float = commands.default(commands.PREPARE_DATA, "crop_fraction"),
) -> PreparedData:
    """Download, extract and check CIFAR-10 (or CIFAR-100) in data_path, or write ``synthetic`` training images
    (and ``synthetic_test``, default a fifth) in the same on-disk format; for dataset=folder, build (or reuse) and
    check the image folder's cache and describe it in a card."""
    from cifar10_dist.data import datasets

    config = resolve(
        None,
        dataset=dataset,
        data_path=str(data_path),
        image_size=image_size,
        crop_fraction=crop_fraction,
        skip_bad_images=skip_bad_images,
        drop_test_duplicates=drop_test_duplicates,
        cache_dir=None if cache_dir is None else str(cache_dir),
    )  # the values checked
    return datasets.implementation(dataset).prepare(config, synthetic, synthetic_test, seed)

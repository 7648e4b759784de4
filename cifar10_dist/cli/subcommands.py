"""One function a command, as fire calls it: the command's own flags checked (``flags``) and resolved
(``config.commands``), the API called, its result printed (``printing``). Rank 0 of a launch prints; the other
processes return its result quietly."""

from __future__ import annotations

import json as json_module
import sys
from pathlib import Path
from typing import Any

from cifar10_dist import api
from cifar10_dist.cli import help_pages, printing
from cifar10_dist.cli.flags import check_keys
from cifar10_dist.config import commands
from cifar10_dist.errors import AlreadyReported, UserError
from cifar10_dist.launch.start_method import launch_rank  # (every process of a launch returns rank 0's result)


def run(config: str | None = None, **overrides: Any) -> None:
    """Train; print the final metrics and the run folder."""
    check_keys("run", overrides)
    resolved = api.resolve(config, **overrides)  # bad values fail here, before torch is imported
    if resolved.seeds > 1:
        seeds = api.train_seeds(resolved)
        if launch_rank(resolved.node_rank) == 0:
            printing.print_seed_summary(seeds)
    else:
        result = api.train(resolved)
        if launch_rank(resolved.node_rank) == 0:
            printing.print_run_result(result)


def lr_find(config: str | None = None, **flags: Any) -> None:
    """Sweep the learning rate with the run a config describes (its flags: config.lr_sweep's); print the
    suggestion and where the plot is."""
    from cifar10_dist.config import LrSweep
    from cifar10_dist.config.lr_sweep import OUTPUT_DIR

    check_keys("lr-find", flags, commands.flags_of(LrSweep), [OUTPUT_DIR])
    result = api.lr_find(config, **flags)
    if launch_rank(flags.get("node_rank")) != 0:
        return
    printing.print_lr_find(result)


def batch_size(config: str | None = None, **flags: Any) -> None:
    """Measure which batch the run a config describes should take here (its flags: config.commands.BATCH_SIZE);
    print the table and the suggestion."""
    check_keys("batch-size", flags, commands.BATCH_SIZE)
    values, overrides = commands.split("batch-size", flags, commands.BATCH_SIZE)
    batch_sizes = values["batch_sizes"]
    sizes = (
        batch_sizes
        if isinstance(batch_sizes, (tuple, list)) or batch_sizes is None
        else (
            [int(size) for size in str(batch_sizes).split(",")]
            if str(batch_sizes).replace(",", "").isdigit()
            else [batch_sizes]
        )
    )
    result = api.batch_size(config, sizes, values["budget_seconds"], **overrides)
    if values["json"]:
        print(json_module.dumps(result.to_dict(), indent=2))
        return
    printing.print_batch_sizes(result)


def evaluate(config: str | None = None, **flags: Any) -> None:
    """Evaluate a checkpoint on the test set; write its confusion matrix and its most confident mistakes (JSON and
    PNG). Its flags: config.commands.EVALUATE; the others are config keys."""
    check_keys("evaluate", flags, commands.EVALUATE)
    own, overrides = commands.split("evaluate", flags, commands.EVALUATE)
    checkpoint, json, output_dir = own["checkpoint"], own["json"], own["output_dir"]
    from cifar10_dist.outputs.checkpoint_files import model_file

    checkpoint = model_file(str(checkpoint))  # (a run folder: its best model)
    folder = Path(output_dir) if output_dir is not None else Path(checkpoint).parent
    metrics = api.evaluate(
        str(checkpoint), config, raw_weights=bool(own["raw_weights"]), output_dir=folder, **overrides
    )
    if launch_rank(flags.get("node_rank")) != 0:
        return
    if json:
        print(json_module.dumps(metrics.to_dict()))
        return
    printing.print_evaluation(metrics, folder, Path(str(checkpoint)))


def predict(*paths: str, **flags: Any) -> None:
    """Classify image files and folders; one line (or JSON object) per image (its flags: config.commands.PREDICT)."""
    values = commands.resolve("predict", flags, commands.PREDICT)
    checkpoint, top_k, json, batch_size = values["checkpoint"], values["top_k"], values["json"], values["batch_size"]
    if not paths:
        raise UserError("predict needs image files or folders: cifar10-dist predict --checkpoint=FILE PATH [PATH ...]")
    _require_whole("batch_size", batch_size, 1)
    if top_k is not None:
        _require_whole("top_k", top_k, 1)
    predictions = api.predict_files(
        str(checkpoint),
        paths,
        batch_size=batch_size,
        tta=values["tta"],
        device=values["device"],
        raw_weights=bool(values["raw_weights"]),
    )
    if top_k is None:
        top_k = min(commands.DEFAULT_TOP_K, len(predictions.classes))  # a two-class model shows both
    elif top_k > len(predictions.classes):
        raise UserError(
            f"top_k={top_k} is more than the model's {len(predictions.classes)} classes "
            f"({', '.join(predictions.classes[:12])}{', ...' if len(predictions.classes) > 12 else ''})"
        )
    failures = _report_failures(predictions.missing)
    classified = resized = 0
    for batch in predictions.batches:
        failures += _report_failures(batch.failures)
        for path, row in zip(batch.paths, batch.probabilities):
            print(printing.format_prediction(str(path), row, predictions.classes, top_k, json))
        classified, resized = classified + len(batch.paths), resized + batch.resized
    if resized:
        size = predictions.image_size
        print(
            f"note: {resized} of {classified} images were not {size}x{size} and were resized (shorter side to "
            f"{size} pixels, then the centre {size}x{size})",
            file=sys.stderr,
        )
    if failures:
        raise AlreadyReported(f"{len(failures)} inputs could not be classified")


def _report_failures(failures: list[tuple[str, str]]) -> list[tuple[str, str]]:
    for path, reason in failures:
        print(f"error: {path}: {reason}", file=sys.stderr)
    return list(failures)


def _require_whole(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{name}={value!r} must be a whole number >= {minimum}")


def export(**flags: Any) -> None:
    """Export a checkpoint's model (any of config.export_formats.FORMATS), verified against PyTorch; print the check
    (its flags: deployment.exporting's)."""
    from cifar10_dist.config.export_flags import EXPORT_FLAGS, Quantization

    values = commands.resolve("export", flags, EXPORT_FLAGS, commands.flags_of(Quantization))
    result = api.export(str(values.pop("checkpoint")), str(values.pop("format")), **values)
    printing.print_export(result)


def report(*run_dirs: str, **flags: Any) -> None:
    """Compare run folders: a table on stdout and one plot overlaying their curves; with --targets=0.9,0.93,0.94
    also the time each run took to reach those accuracies (mean and std over the runs)."""
    values = commands.resolve("report", flags, commands.REPORT)
    result = api.report(
        run_dirs,
        str(values["output"]),
        _parse_targets(values["targets"]),
        warn=lambda problem: print(f"error: {problem}", file=sys.stderr),
    )
    print(result.table)
    if result.times:
        print()
        print(result.times)
    print(f"plot: {result.plot}")


def _parse_targets(targets: Any) -> list[float]:
    """--targets=0.9,0.93 arrives from fire as a tuple of floats (or one float, or a string)."""
    if targets is None:
        return []
    items = targets if isinstance(targets, (tuple, list)) else str(targets).split(",")
    try:
        goals = [float(item) for item in items]
    except ValueError:
        goals = []
    if not goals or not all(0 < goal <= 1 for goal in goals):
        raise UserError(f"targets={targets!r} must be accuracies in (0, 1], comma-separated: --targets=0.9,0.93,0.94")
    return goals


def prepare_data(**flags: Any) -> None:
    """Download and verify CIFAR-10 (or CIFAR-100), write a synthetic dataset in the same format, or build and
    check an image folder's cache (dataset=folder) and print its card (its flags: config.commands.PREPARE_DATA)."""
    values = commands.resolve("prepare-data", flags, commands.PREPARE_DATA)
    prepared = api.prepare_data(
        **{
            **values,
            "data_path": str(values["data_path"]),
            "dataset": str(values["dataset"]),
            "seed": int(values["seed"]),
            "image_size": int(values["image_size"]),
            "skip_bad_images": bool(values["skip_bad_images"]),
            "drop_test_duplicates": bool(values["drop_test_duplicates"]),
            "crop_fraction": float(values["crop_fraction"]),
        }
    )
    printing.print_prepared(prepared)


def tune(config: str | None = None, **flags: Any) -> None:
    """Tune hyperparameters with Optuna (see help_pages.TUNE_HELP; its flags: config.commands.TUNE, the others are
    config keys); prints a line per trial, the table and the best."""
    check_keys("tune", flags, commands.TUNE)
    own, overrides = commands.split("tune", flags, commands.TUNE)
    api.tune(config, **{**own, "study": str(own["study"])}, **overrides)


def show_config(config: str | None = None, **flags: Any) -> None:
    """Print the resolved, validated config as YAML: what ``run`` with the same flags would use (save it, edit it,
    give it back with --config); with --list, the configs the package ships."""
    import yaml

    check_keys("config", flags, commands.CONFIG)
    own, overrides = commands.split("config", flags, commands.CONFIG)
    if own["list"]:
        print(help_pages.shipped_list())
        return
    print(yaml.safe_dump(api.resolve(config, **overrides).to_dict(), sort_keys=False), end="")


def doctor(**flags: Any) -> None:
    """Print what this machine is and what will be fast on it (JSON with --json; its flags: config.commands.DOCTOR)."""
    from cifar10_dist.system.doctor import render

    values = commands.resolve("doctor", flags, commands.DOCTOR)
    report = api.doctor(
        model=str(values["model"]),
        batch_size=int(values["batch_size"]),
        budget_seconds=float(values["budget_seconds"]),
        link=values["link"],
    )
    print(json_module.dumps(report.to_dict(), indent=2) if values["json"] else render(report))

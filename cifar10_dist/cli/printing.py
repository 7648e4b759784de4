"""What each command prints: the run's final lines, the seeds' table, lr-find's suggestion, batch-size's table,
evaluate's per-class table and files, one prediction line, export's check and int8 summary, prepare-data's
verdict. Each takes the API's typed result (``cifar10_dist.results``) and prints to stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cifar10_dist.results import (
    BatchSizeResult,
    EvaluationResult,
    ExportResult,
    LrFindResult,
    PreparedData,
    RunResult,
    SeedsResult,
    SplitMetrics,
)


def print_lr_find(result: LrFindResult) -> None:
    """The suggestion, the sweep, the flag to train with, and where the plot and record are."""
    from cifar10_dist.config import SUGGESTION_RULES

    others = ", ".join(f"{name} {value:.3g}" for name, value in result.candidates.items() if name != result.rule)
    muon = f" --muon_lr={result.muon_lr:.3g}" if result.muon_lr is not None else ""
    print(f"suggested learning_rate: {result.suggestion:.3g} ({result.rule}: {SUGGESTION_RULES[result.rule]})")
    print(
        f"swept {result.start_lr:g}..{result.end_lr:g} over {len(result.losses)} iterations in "
        f"{result.seconds:.0f} s, stopped: {result.stopped}" + (f"; other rule: {others}" if others else "")
    )
    if result.warning:
        print(f"warning: {result.warning}")
    print(f"train with: --learning_rate={result.suggestion:.3g}{muon}")
    print(f"plot: {Path(str(result.folder)) / 'lr_find.png'}, record: {Path(str(result.folder)) / 'lr_find.json'}")


def print_batch_sizes(result: BatchSizeResult) -> None:
    """Each batch's speed, the suggested batch and the learning rate for it."""
    print(f"{result.model} at {result.image_size} px on {result.device}, one process (sizes per process):")
    for row in result.speeds:
        print(
            f"  batch {row.batch_size:>6}  {row.images_per_second:>9.1f} img/s  +-{row.spread:.0%}  "
            f"({row.steps} steps; {row.verdict})"
        )
    print(f"suggested batch_size: {result.batch_size} ({result.reason})")
    if result.learning_rate is not None:
        print(
            f"learning_rate {result.learning_rate:.4g} for it: the config's scaled from batch "
            f"{result.config_batch_size} by the {result.rule} rule"
        )
    else:
        print(f"learning_rate: {result.rule}")
    print(f"({result.seconds:.1f} s in all)")


def print_run_result(result: RunResult) -> None:
    """Each split's final metrics, an early stop, and the run folder."""
    splits = (("val", result.val), ("test", result.test), ("train subset", result.train))
    calibrated = any(metrics is not None and metrics.temperature is not None for _, metrics in splits)
    for name, metrics in splits:
        if metrics is not None:
            chosen = f", {metrics.model}" if metrics.model else ""
            top5 = f", top-5 {metrics.top5_accuracy:.4f}" if metrics.top5_accuracy is not None else ""
            print(
                f"final {name}: accuracy {metrics.accuracy:.4f}{top5}, loss {metrics.loss:.4f} "
                f"({metrics.num_samples} images{chosen}{calibration_note(metrics) if calibrated else ''})"
            )
    if result.stopped_early is not None:
        print(f"stopped early at epoch {result.stopped_early} (early_stopping_patience)")
    print(f"run folder: {result.run_dir}")


def calibration_note(metrics: SplitMetrics) -> str:
    """In a calibrated run, which numbers are the model's own and which its temperature-scaled probabilities'."""
    if metrics.temperature is None:
        return "; uncalibrated: the model's own probabilities"
    return f"; calibrated: logits / T {metrics.temperature:.4f}"


def print_seed_summary(result: SeedsResult) -> None:
    """The seeds' table (mean, std, min, max of each metric), their run folders and the summary file."""
    seeds = [run.seed for run in result.runs]
    print(f"{len(seeds)} runs, seeds {', '.join(map(str, seeds))}")
    print(f"{'metric':<16}{'mean':>9}{'std':>9}{'min':>9}{'max':>9}")
    for name, stats in result.summary.items():
        print(f"{name:<16}" + "".join(f"{stats[key]:>9.4f}" for key in ("mean", "std", "min", "max")))
    for run in result.runs:
        print(f"run folder (seed {run.seed}): {run.run_dir}")
    print(f"summary: {result.summary_file}")


def print_evaluation(metrics: EvaluationResult, folder: Path, checkpoint: Path) -> None:
    """The per-class table, the files written to ``folder`` and the test set's figures."""
    from cifar10_dist.outputs import evaluation_files

    stem = evaluation_files.confusion_stem(checkpoint)
    width = max(12, *(len(name) for name in metrics.classes))
    print(f"{'class':<{width}} {'images':>6} {'recall':>6} {'precision':>9} {'F1':>6}")
    supports = [sum(row) for row in metrics.confusion_matrix]
    for name, support, recall, precision, f1 in zip(
        metrics.classes, supports, metrics.per_class_accuracy, metrics.per_class_precision, metrics.per_class_f1
    ):
        print(f"{name:<{width}} {support:>6} {recall:6.4f} {precision:9.4f} {f1:6.4f}")
    print(f"confusion matrix: {folder / stem}.json, .png")
    print(f"most confident mistakes: {folder / evaluation_files.mistakes_stem(checkpoint)}.png, .json")
    top5 = f", top-5 {metrics.top5_accuracy:.4f}" if metrics.top5_accuracy is not None else ""
    if metrics.reliability:
        print(f"reliability diagram: {folder / evaluation_files.calibration_stem(checkpoint)}.png, .json")
    print(
        f"test: accuracy {metrics.accuracy:.4f}{top5}, loss {metrics.loss:.4f} ({metrics.num_samples} images); "
        f"balanced accuracy {metrics.balanced_accuracy:.4f}, macro-F1 {metrics.macro_f1:.4f}"
    )
    if metrics.ece is not None:
        print(f"calibration: ECE {metrics.ece:.4f} (15 bins), NLL {metrics.loss:.4f} (the loss)")


def format_prediction(path: str, probabilities: Any, classes: tuple[str, ...], top_k: int, as_json: bool) -> str:
    """One image's top-k classes, as a line or a JSON object."""
    values, indices = probabilities.topk(top_k)
    top = [(classes[index], index, value) for index, value in zip(indices.tolist(), values.tolist())]
    if as_json:
        return json.dumps(
            {
                "path": path,
                "top_k": [
                    {"class": name, "index": index, "probability": round(value, 6)} for name, index, value in top
                ],
            }
        )
    return f"{path}: " + ", ".join(f"{name} {value:.4f}" for name, _, value in top)


def print_export(result: ExportResult) -> None:
    """How the exported file was verified against PyTorch, the int8 check where there is one, and what was written."""
    from cifar10_dist.config.export_formats import FORMATS

    runtime = FORMATS[result.format].verified_by
    if result.tensors_equal is not None:
        print(f"read back: {result.tensors_equal} of {result.tensors_equal} tensors torch.equal to the model's")
    print(
        f"{runtime} vs PyTorch on {result.images}: logits max abs difference {result.max_abs_difference:.2e} "
        f"({result.relative_difference:.1e} of their scale {result.logit_scale:.3g}; accepted: "
        f"{result.accepted_relative_difference:.0e} of it), same top-1 class on {result.same_top1} of "
        f"{result.num_images}"
    )
    if result.quantization is not None:
        print(int8_summary(result.quantization))
    print(f"wrote {result.path} ({Path(result.path).stat().st_size / 1e6:.1f} MB) and {result.sidecar}")


def int8_summary(found: dict[str, Any]) -> str:
    """The int8 export's check in two lines: how it was calibrated (and chosen), and the test figures."""
    best = max((row["agreement"] for row in found["candidates"]), default=None)
    chosen = (
        f", chosen of {len(found['candidates'])} on {found['chosen_on']} {found['chosen_from']} images "
        f"(agreement {best:.2%})"
        if best is not None
        else ""
    )
    return (
        f"int8 calibrated {found['calibration']} on {found['calibration_images']} training images{chosen}\n"
        f"int8 on the {found['test_images']} test images: accuracy {found['accuracy_int8']:.4f} against fp32 "
        f"{found['accuracy_fp32']:.4f}, the same top-1 class on {found['agreement']:.2%} (accepted from "
        f"{found['min_agreement'] * 100:g}%)"
    )


def print_prepared(prepared: PreparedData) -> None:
    """A folder's card, the synthetic set written, or CIFAR's verdict."""
    if prepared.card is not None:
        print(prepared.card)
        return
    if prepared.synthetic:
        print(
            f"wrote {prepared.train_images} synthetic training and {prepared.test_images} test images to "
            f"{prepared.folder}"
        )
        return
    official = "match" if prepared.official else "do not match"
    print(
        f"{prepared.folder}: {prepared.train_images} training and {prepared.test_images} test images, valid "
        f"structure; files {official} the official release's md5 sums"
    )

"""The command line: ``cifar10-dist run | lr-find | batch-size | evaluate | predict | export | tune | prepare-data |
report | doctor | config``, a thin fire layer over the API.

User errors (bad flags, missing data, unusable checkpoints) end as one line on stderr and exit code 2,
a diverged run (NaN loss) with 3, a preempted run (SIGTERM/SIGUSR1, checkpoint written) with 75;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import gc
import json as json_module
import sys
from pathlib import Path
from typing import Any

import fire

from cifar10_dist import api, cli_help
from cifar10_dist.cli_flags import check_keys, closed_pipe, switches_alone
from cifar10_dist.config import commands, describe_options
from cifar10_dist.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, AlreadyReported, Interrupted, UserError
from cifar10_dist.launch.start_method import launch_rank  # (every process of a launch returns rank 0's result)
from cifar10_dist.results import RunResult, SeedsResult, SplitMetrics
from cifar10_dist.serve import formats


def run(config: str | None = None, **overrides: Any) -> None:
    """Train; print the final metrics and the run folder."""
    check_keys("run", overrides)
    resolved = api.resolve(config, **overrides)  # bad values fail here, before torch is imported
    if resolved.seeds > 1:
        seeds = api.train_seeds(resolved)
        if launch_rank(resolved.node_rank) == 0:
            print_seed_summary(seeds)
    else:
        result = api.train(resolved)
        if launch_rank(resolved.node_rank) == 0:
            print_run_result(result)


def lr_find(config: str | None = None, **flags: Any) -> None:
    """Sweep the learning rate with the run a config describes (its flags: config.lr_sweep's); print the
    suggestion and where the plot is."""
    from cifar10_dist.config import SUGGESTION_RULES, LrSweep
    from cifar10_dist.config.lr_sweep import OUTPUT_DIR

    check_keys("lr-find", flags, commands.flags_of(LrSweep), [OUTPUT_DIR])
    result = api.lr_find(config, **flags)
    if launch_rank(flags.get("node_rank")) != 0:
        return
    others = ", ".join(f"{name} {value:.3g}" for name, value in result.candidates.items() if name != result.rule)
    muon = f" --muon_lr={result.muon_lr:.3g}" if result.muon_lr is not None else ""
    print(f"suggested learning_rate: {result.suggestion:.3g} ({result.rule}: {SUGGESTION_RULES[result.rule]})")
    print(f"swept {result.start_lr:g}..{result.end_lr:g} over {len(result.losses)} iterations in "
          f"{result.seconds:.0f} s, stopped: {result.stopped}" + (f"; other rule: {others}" if others else ""))
    if result.warning:
        print(f"warning: {result.warning}")
    print(f"train with: --learning_rate={result.suggestion:.3g}{muon}")
    print(f"plot: {Path(str(result.folder)) / 'lr_find.png'}, record: {Path(str(result.folder)) / 'lr_find.json'}")


def batch_size(config: str | None = None, **flags: Any) -> None:
    """Measure which batch the run a config describes should take here (its flags: config.commands.BATCH_SIZE);
    print the table and the suggestion."""
    check_keys("batch-size", flags, commands.BATCH_SIZE)
    values, overrides = commands.split("batch-size", flags, commands.BATCH_SIZE)
    batch_sizes = values["batch_sizes"]
    sizes = batch_sizes if isinstance(batch_sizes, (tuple, list)) or batch_sizes is None else (
        [int(size) for size in str(batch_sizes).split(",")] if str(batch_sizes).replace(",", "").isdigit()
        else [batch_sizes])
    result = api.batch_size(config, sizes, values["budget_seconds"], **overrides)
    if values["json"]:
        print(json_module.dumps(result.to_dict(), indent=2))
        return
    print(f"{result.model} at {result.image_size} px on {result.device}, one process (sizes per process):")
    for row in result.speeds:
        print(f"  batch {row.batch_size:>6}  {row.images_per_second:>9.1f} img/s  +-{row.spread:.0%}  "
              f"({row.steps} steps; {row.verdict})")
    print(f"suggested batch_size: {result.batch_size} ({result.reason})")
    if result.learning_rate is not None:
        print(f"learning_rate {result.learning_rate:.4g} for it: the config's scaled from batch "
              f"{result.config_batch_size} by the {result.rule} rule")
    else:
        print(f"learning_rate: {result.rule}")
    print(f"({result.seconds:.1f} s in all)")


def print_run_result(result: RunResult) -> None:
    splits = (("val", result.val), ("test", result.test), ("train subset", result.train))
    calibrated = any(metrics is not None and metrics.temperature is not None for _, metrics in splits)
    for name, metrics in splits:
        if metrics is not None:
            chosen = f", {metrics.model}" if metrics.model else ""
            top5 = f", top-5 {metrics.top5_accuracy:.4f}" if metrics.top5_accuracy is not None else ""
            print(f"final {name}: accuracy {metrics.accuracy:.4f}{top5}, loss {metrics.loss:.4f} "
                  f"({metrics.num_samples} images{chosen}{calibration_note(metrics) if calibrated else ''})")
    if result.stopped_early is not None:
        print(f"stopped early at epoch {result.stopped_early} (early_stopping_patience)")
    print(f"run folder: {result.run_dir}")


def calibration_note(metrics: SplitMetrics) -> str:
    """In a calibrated run, which numbers are the model's own and which its temperature-scaled probabilities'."""
    if metrics.temperature is None:
        return "; uncalibrated: the model's own probabilities"
    return f"; calibrated: logits / T {metrics.temperature:.4f}"


def print_seed_summary(result: SeedsResult) -> None:
    seeds = [run.seed for run in result.runs]
    print(f"{len(seeds)} runs, seeds {', '.join(map(str, seeds))}")
    print(f"{'metric':<16}{'mean':>9}{'std':>9}{'min':>9}{'max':>9}")
    for name, stats in result.summary.items():
        print(f"{name:<16}" + "".join(f"{stats[key]:>9.4f}" for key in ("mean", "std", "min", "max")))
    for run in result.runs:
        print(f"run folder (seed {run.seed}): {run.run_dir}")
    print(f"summary: {result.summary_file}")


def evaluate(config: str | None = None, **flags: Any) -> None:
    """Evaluate a checkpoint on the test set; write its confusion matrix and its most confident mistakes (JSON and
    PNG). Its flags: config.commands.EVALUATE; the others are config keys."""
    check_keys("evaluate", flags, commands.EVALUATE)
    own, overrides = commands.split("evaluate", flags, commands.EVALUATE)
    checkpoint, json, output_dir = own["checkpoint"], own["json"], own["output_dir"]
    from cifar10_dist.outputs import evaluation_files

    folder = Path(output_dir) if output_dir is not None else Path(str(checkpoint)).parent
    metrics = api.evaluate(str(checkpoint), config, raw_weights=bool(own["raw_weights"]), output_dir=folder,
                           **overrides)
    if launch_rank(flags.get("node_rank")) != 0:
        return
    stem = evaluation_files.confusion_stem(Path(str(checkpoint)))
    if json:
        print(json_module.dumps(metrics.to_dict()))
        return
    width = max(12, *(len(name) for name in metrics.classes))
    print(f"{'class':<{width}} {'images':>6} {'recall':>6} {'precision':>9} {'F1':>6}")
    supports = [sum(row) for row in metrics.confusion_matrix]
    for name, support, recall, precision, f1 in zip(metrics.classes, supports, metrics.per_class_accuracy,
                                                    metrics.per_class_precision, metrics.per_class_f1):
        print(f"{name:<{width}} {support:>6} {recall:6.4f} {precision:9.4f} {f1:6.4f}")
    print(f"confusion matrix: {folder / stem}.json, .png")
    print(f"most confident mistakes: {folder / evaluation_files.mistakes_stem(Path(str(checkpoint)))}.png, .json")
    top5 = f", top-5 {metrics.top5_accuracy:.4f}" if metrics.top5_accuracy is not None else ""
    if metrics.reliability:
        print(f"reliability diagram: {folder / evaluation_files.calibration_stem(Path(str(checkpoint)))}.png, .json")
    print(f"test: accuracy {metrics.accuracy:.4f}{top5}, loss {metrics.loss:.4f} ({metrics.num_samples} images); "
          f"balanced accuracy {metrics.balanced_accuracy:.4f}, macro-F1 {metrics.macro_f1:.4f}")
    if metrics.ece is not None:
        print(f"calibration: ECE {metrics.ece:.4f} (15 bins), NLL {metrics.loss:.4f} (the loss)")


def predict(*paths: str, **flags: Any) -> None:
    """Classify image files and folders; one line (or JSON object) per image (its flags: config.commands.PREDICT)."""
    values = commands.resolve("predict", flags, commands.PREDICT)
    checkpoint, top_k, json, batch_size = values["checkpoint"], values["top_k"], values["json"], values["batch_size"]
    if not paths:
        raise UserError("predict needs image files or folders: cifar10-dist predict --checkpoint=FILE PATH [PATH ...]")
    _require_whole("batch_size", batch_size, 1)
    if top_k is not None:
        _require_whole("top_k", top_k, 1)
    predictions = api.predict_files(str(checkpoint), paths, batch_size=batch_size, tta=values["tta"],
                                    device=values["device"], raw_weights=bool(values["raw_weights"]))
    if top_k is None:
        top_k = min(commands.DEFAULT_TOP_K, len(predictions.classes))  # a two-class model shows both
    elif top_k > len(predictions.classes):
        raise UserError(f"top_k={top_k} is more than the model's {len(predictions.classes)} classes "
                        f"({', '.join(predictions.classes[:12])}{', ...' if len(predictions.classes) > 12 else ''})")
    failures = _report_failures(predictions.missing)
    classified = resized = 0
    for batch in predictions.batches:
        failures += _report_failures(batch.failures)
        for path, row in zip(batch.paths, batch.probabilities):
            print(_format_prediction(str(path), row, predictions.classes, top_k, json))
        classified, resized = classified + len(batch.paths), resized + batch.resized
    if resized:
        size = predictions.image_size
        print(f"note: {resized} of {classified} images were not {size}x{size} and were resized (shorter side to "
              f"{size} pixels, then the centre {size}x{size})", file=sys.stderr)
    if failures:
        raise AlreadyReported(f"{len(failures)} inputs could not be classified")


def _report_failures(failures: list[tuple[str, str]]) -> list[tuple[str, str]]:
    for path, reason in failures:
        print(f"error: {path}: {reason}", file=sys.stderr)
    return list(failures)


def _format_prediction(path: str, probabilities: Any, classes: tuple[str, ...], top_k: int, as_json: bool) -> str:
    values, indices = probabilities.topk(top_k)
    top = [(classes[index], index, value) for index, value in zip(indices.tolist(), values.tolist())]
    if as_json:
        return json_module.dumps({"path": path, "top_k": [
            {"class": name, "index": index, "probability": round(value, 6)} for name, index, value in top]})
    return f"{path}: " + ", ".join(f"{name} {value:.4f}" for name, _, value in top)


def _require_whole(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{name}={value!r} must be a whole number >= {minimum}")


def export(**flags: Any) -> None:
    """Export a checkpoint's model (any of serve.formats.FORMATS), verified against PyTorch; print the check
    (its flags: serve.exporting's)."""
    from cifar10_dist.serve.export_flags import EXPORT_FLAGS, Quantization

    values = commands.resolve("export", flags, EXPORT_FLAGS, commands.flags_of(Quantization))
    result = api.export(str(values.pop("checkpoint")), str(values.pop("format")), **values)
    runtime = formats.FORMATS[result.format].verified_by
    if result.tensors_equal is not None:
        print(f"read back: {result.tensors_equal} of {result.tensors_equal} tensors torch.equal to the model's")
    print(f"{runtime} vs PyTorch on {result.images}: logits max abs difference {result.max_abs_difference:.2e} "
          f"({result.relative_difference:.1e} of their scale {result.logit_scale:.3g}; accepted: "
          f"{result.accepted_relative_difference:.0e} of it), same top-1 class on {result.same_top1} of "
          f"{result.num_images}")
    if result.quantization is not None:
        print(int8_summary(result.quantization))
    print(f"wrote {result.path} ({Path(result.path).stat().st_size / 1e6:.1f} MB) and {result.sidecar}")


def int8_summary(found: dict[str, Any]) -> str:
    """The int8 export's check in two lines: how it was calibrated (and chosen), and the test figures."""
    best = max((row["agreement"] for row in found["candidates"]), default=None)
    chosen = (f", chosen of {len(found['candidates'])} on {found['chosen_on']} {found['chosen_from']} images "
              f"(agreement {best:.2%})" if best is not None else "")
    return (f"int8 calibrated {found['calibration']} on {found['calibration_images']} training images{chosen}\n"
            f"int8 on the {found['test_images']} test images: accuracy {found['accuracy_int8']:.4f} against fp32 "
            f"{found['accuracy_fp32']:.4f}, the same top-1 class on {found['agreement']:.2%} (accepted from "
            f"{found['min_agreement'] * 100:g}%)")


def report(*run_dirs: str, **flags: Any) -> None:
    """Compare run folders: a table on stdout and one plot overlaying their curves; with --targets=0.9,0.93,0.94
    also the time each run took to reach those accuracies (mean and std over the runs)."""
    values = commands.resolve("report", flags, commands.REPORT)
    result = api.report(run_dirs, str(values["output"]), _parse_targets(values["targets"]),
                        warn=lambda problem: print(f"error: {problem}", file=sys.stderr))
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
    prepared = api.prepare_data(**{**values, "data_path": str(values["data_path"]), "dataset": str(values["dataset"]),
                                   "seed": int(values["seed"]), "image_size": int(values["image_size"]),
                                   "skip_bad_images": bool(values["skip_bad_images"]),
                                   "drop_test_duplicates": bool(values["drop_test_duplicates"]),
                                   "crop_fraction": float(values["crop_fraction"])})
    if prepared.card is not None:
        print(prepared.card)
        return
    if prepared.synthetic:
        print(f"wrote {prepared.train_images} synthetic training and {prepared.test_images} test images to "
              f"{prepared.folder}")
        return
    official = "match" if prepared.official else "do not match"
    print(f"{prepared.folder}: {prepared.train_images} training and {prepared.test_images} test images, valid "
          f"structure; files {official} the official release's md5 sums")


def tune(config: str | None = None, **flags: Any) -> None:
    """Tune hyperparameters with Optuna (see cli_help.TUNE_HELP; its flags: config.commands.TUNE, the others are
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
        print(cli_help.shipped_list())
        return
    print(yaml.safe_dump(api.resolve(config, **overrides).to_dict(), sort_keys=False), end="")


def doctor(**flags: Any) -> None:
    """Print what this machine is and what will be fast on it (JSON with --json; its flags: config.commands.DOCTOR)."""
    from cifar10_dist.system.doctor import render

    values = commands.resolve("doctor", flags, commands.DOCTOR)
    report = api.doctor(model=str(values["model"]), batch_size=int(values["batch_size"]),
                        budget_seconds=float(values["budget_seconds"]), link=values["link"])
    print(json_module.dumps(report.to_dict(), indent=2) if values["json"] else render(report))


COMMANDS = {"run": run, "lr-find": lr_find, "batch-size": batch_size, "evaluate": evaluate, "predict": predict,
            "export": export, "tune": tune,
            "prepare-data": prepare_data, "report": report, "doctor": doctor, "config": show_config}
def _help_text(argv: list[str]) -> str | None:
    """Our own help (fire's cannot list options passed through **overrides)."""
    asks_help = any(arg in ("-h", "--help") for arg in argv)
    if not argv or (asks_help and argv[0] not in COMMANDS):
        return cli_help.MAIN_HELP
    if asks_help:
        return cli_help.page(argv[0]).format(options=describe_options())
    return None


def run_and_exit() -> None:
    """The console script and ``python -m cifar10_dist``: ``main()``'s code as the exit status. What the run's
    imports created is frozen out of the garbage collector first: the interpreter's exit would otherwise walk it
    all, about 1 s of a core (a process importing what a run imports: 5.55 s of CPU, 4.51 s frozen, best of 5 on
    the 2-core AVX2-only EPYC); atexit handlers, threads and module teardown run as before, and only cyclic
    garbage is left to the operating system."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = closed_pipe()
    gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    """What ``cifar10-dist ARGS`` does, with ``argv`` as ARGS; returns the exit code (``run_and_exit`` makes it
    the process's)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"cifar10-dist {sys.modules['cifar10_dist'].__version__}")  # (this package, imported already)
        return 0
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    help_text = _help_text(argv)
    if help_text is not None:
        try:
            print(help_text, flush=True)
        except BrokenPipeError:
            return closed_pipe()
        return 0
    if argv[0] not in COMMANDS:
        print(f"error: unknown command '{argv[0]}': choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USER_ERROR
    argv = switches_alone(argv)
    try:
        fire.Fire(COMMANDS, command=argv, name="cifar10-dist")
    except UserError as error:
        if debug:
            raise
        if not isinstance(error, AlreadyReported):
            print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except Interrupted as interrupt:
        if debug:
            raise
        print(interrupt, file=sys.stderr)
        return interrupt.exit_code
    except KeyboardInterrupt as late:  # Ctrl-C before the run could handle it (start-up, data loading in a launcher)
        if debug:
            raise
        if isinstance(late.__context__, Interrupted):  # a further Ctrl-C while the stopped run was cleaning up
            print(late.__context__, file=sys.stderr)
            return late.__context__.exit_code
        print("interrupted (Ctrl-C) before the run could take it in hand: no checkpoint was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except fire.core.FireExit as exit_request:
        return int(exit_request.code or 0)
    except BrokenPipeError:
        return closed_pipe()
    return 0

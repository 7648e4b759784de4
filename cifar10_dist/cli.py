"""The command line: ``cifar10-dist run | evaluate | predict | export | tune | prepare-data | report | doctor``, a thin fire layer
over the API.

User errors (bad flags, missing data, unusable checkpoints) end as one line on stderr and exit code 2,
a diverged run (NaN loss) with 3, a preempted run (SIGTERM/SIGUSR1, checkpoint written) with 75;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import json as json_module
import sys
from pathlib import Path
from typing import Any

import fire

from cifar10_dist import api
from cifar10_dist.config import describe_options
from cifar10_dist.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, AlreadyReported, Interrupted, UserError
from cifar10_dist.results import RunResult, SeedsResult

RUN_HELP = """\
Usage: cifar10-dist run [--config=FILE.yaml] [--KEY=VALUE ...] [--debug]

Train a CIFAR-10 classifier; prints the final metrics and the run folder.
Values come from the defaults below, then the YAML file, then the command line.

  --config=None              YAML file with any of the keys below (see configs/)
  --debug                    show tracebacks for errors
{options}
"""

EVALUATE_HELP = """\
Usage: cifar10-dist evaluate --checkpoint=PATH [--config=FILE.yaml] [--json] [--output_dir=DIR] [--KEY=VALUE ...]

Test-set accuracy, loss and per-class accuracy of a saved model (training_checkpoint_*.pt or best_model_*.pt);
writes the confusion matrix as confusion_<checkpoint name>.json and .png into output_dir.
The checkpoint's recorded model (and model_kwargs), dataset, data_path and synthetic_size are used unless
given here.
Batch and launch keys as for run.

  --checkpoint=PATH          checkpoint file to evaluate (required)
  --json                     print the metrics (with per_class_accuracy, confusion_matrix) as JSON on the last line
  --output_dir=None          folder for the confusion matrix files (default: the checkpoint's folder)
  --raw_weights              a run with ema_decay: use the trained weights, not the EMA (training checkpoints)
  --config=None              YAML file with any of the keys below
  --debug                    show tracebacks for errors
{options}
"""

PREDICT_HELP = """\
Usage: cifar10-dist predict --checkpoint=FILE PATH [PATH ...] [--top_k=3] [--json] [--batch_size=256] [--tta=N]

Classify image files with a saved model: one line per image with its top-k classes and probabilities.
PATH is an image file (PNG, JPEG, anything Pillow opens) or a folder (searched recursively). Images are
converted to RGB; those that are not 32x32 are resized (shorter side to 32 pixels, then the centre 32x32).
A file that cannot be read gets one error line, the others are still classified, and the exit code is 2.

  --checkpoint=FILE          training_checkpoint_*.pt or best_model_*.pt (its recorded model is rebuilt)
  --top_k=3                  classes shown per image
  --json                     one JSON object per line: path and top-k classes with probabilities
  --batch_size=256           images per forward pass
  --tta=None                 test-time augmentation 0, 1 or 2 (default: the checkpoint's tta)
  --device=None              cpu, cuda, cuda:1, ... (default: cuda when there is a GPU)
  --raw_weights              a run with ema_decay: use the trained weights, not the EMA (training checkpoints)
  --debug                    show tracebacks for errors
"""

EXPORT_HELP = """\
Usage: cifar10-dist export --checkpoint=FILE --format=safetensors|torchscript|onnx [--output=PATH] [--debug]

Write a saved model in a form that needs neither this package nor pickle: normalised float32 images
(N, 3, 32, 32) in, logits out. A JSON sidecar (PATH.json) holds the model reference, class names,
normalisation mean/std, input shape and provenance. The file is loaded back with its own runtime and
compared with the PyTorch model before it appears (ONNX: onnx.checker, then ONNX Runtime within 1e-4).
Needs: pip install 'cifar10-dist[export]'

  --checkpoint=FILE          training_checkpoint_*.pt or best_model_*.pt
  --format=FORMAT            safetensors (weights), torchscript (traced module) or onnx (dynamic batch size)
  --output=None              file to write (default: next to the checkpoint, .safetensors/.torchscript.pt/.onnx)
  --raw_weights              a run with ema_decay: use the trained weights, not the EMA (training checkpoints)
  --debug                    show tracebacks for errors
"""

TUNE_HELP = """\
Usage: cifar10-dist tune --config=FILE.yaml --space=SPACE.yaml --study=NAME [--trials=10] [--storage=URL]
                         [--sampler=tpe|random|grid] [--pruner=median|hyperband|none] [--final_test=True]
                         [--report_only] [--KEY=VALUE ...] [--debug]

Tune hyperparameters with Optuna. Each trial is an ordinary run in output_path/NAME/trial-<number> (launch keys as
for run), ranked on its best val accuracy (val_split > 0 is required: no trial sees the test set). Several tune
processes given the same study and storage share the work. At the end: a table of the trials, best_config.yaml
and plots in output_path/NAME, and the best trial's best model evaluated once on the test set.
Needs: pip install 'cifar10-dist[tune]'

  --space=FILE               YAML: key: {{type: float|int|categorical, low, high, log, step, choices}} per config key
  --study=NAME               study name (also the folder under output_path)
  --trials=10                trials this process runs (workers sharing a study add theirs up)
  --storage=None             journal:PATH (a file; shared filesystems), sqlite:///PATH or a database URL such as
                             postgresql://user:password@host/db (default: sqlite in output_path/NAME/study.db)
  --sampler=tpe              tpe, random, or grid (every key categorical or an int range)
  --sampler_seed=None        seed of the sampler (give each worker its own)
  --pruner=median            median, hyperband or none; asked after every validation (validate_every)
  --pruner_startup_trials=5  median pruner: trials that run to the end before any is pruned
  --pruner_warmup_epochs=0   median pruner: epochs of each trial that are never pruned
  --final_test=True          after the last trial, the best trial's best model on the test set, once
  --heartbeat=60             seconds between liveness beats of a running trial (database storages): a trial
                             silent for 2 beats is failed and run again from its newest checkpoint by a worker
  --report_only              only print the table and write best_config.yaml and the plots of the study
  --config=None              YAML file with the keys of the base config (see run --help)
  --debug                    show tracebacks for errors
{options}
"""

PREPARE_HELP = """\
Usage: cifar10-dist prepare-data [--dataset=cifar10|cifar100] [--data_path=DIR] [--synthetic=N] [--synthetic_test=M]
                                 [--seed=S] [--debug]

Download, extract and verify CIFAR-10 into DIR/cifar-10-batches-py (CIFAR-100: DIR/cifar-100-python),
or write a synthetic dataset in the same on-disk format.

  --dataset=cifar10          cifar10 or cifar100
  --data_path=cifar10        folder that gets cifar-10-batches-py (or cifar-100-python)
  --synthetic=None           write N synthetic training images instead of downloading CIFAR-10
  --synthetic_test=None      synthetic test images (default: N // 5)
  --seed=0                   seed of the synthetic images
  --debug                    show tracebacks for errors
"""

DOCTOR_HELP = """\
Usage: cifar10-dist doctor [--model=airbench] [--batch_size=32] [--budget_seconds=2] [--json] [--debug]

What this machine is and what will be fast on it, in about 15 s: versions; CPU model, cores, threads, kernels
(AVX2/AVX512) and native bf16 (AMX, AVX512-BF16); GPUs (memory, compute capability, bf16) and NCCL; the
distributed backends; a measured probe (training steps of --model in fp32, fp32 + channels_last and bf16/fp16
autocast + channels_last); what with_amp=auto picks here, and advice. Attach --json's output to bug reports.

  --model=airbench           the probe's model: a built-in name or package.module:factory / file.py:factory
  --batch_size=32            the probe's batch
  --budget_seconds=2         about how long each probed setting runs
  --json                     print the report as one JSON object
  --debug                    show tracebacks for errors
"""

REPORT_HELP = """\
Usage: cifar10-dist report RUN_DIR [RUN_DIR ...] [--output=report.png] [--debug]

Compare runs: prints a table (best accuracy and its split, final test accuracy, training time) from
each folder's summary.json and metrics.jsonl, and writes one plot overlaying their curves.

  --output=report.png        where the comparison plot goes
  --debug                    show tracebacks for errors
"""

MAIN_HELP = """\
Usage: cifar10-dist COMMAND [--KEY=VALUE ...]

Train CIFAR-10 classifiers with PyTorch-Ignite on one CPU, many processes, GPUs or TPUs.

Commands:
  run            train (cifar10-dist run --help lists every option)
  evaluate       test-set accuracy and loss of a saved checkpoint
  predict        classify image files with a saved checkpoint
  export         write a checkpoint's model as safetensors, TorchScript or ONNX (verified)
  tune           search hyperparameters with Optuna (trials ranked on val, one final test)
  prepare-data   download and verify CIFAR-10, or write a synthetic copy
  report         compare run folders: a table and a plot
  doctor         what this machine is and which settings train fast on it (a measured probe)
"""


def run(config: str | None = None, **overrides: Any) -> None:
    """Train; print the final metrics and the run folder."""
    result = api.train(api.resolve(config, **overrides))  # bad values fail here, before torch is imported
    if isinstance(result, SeedsResult):
        print_seed_summary(result)
    elif isinstance(result, RunResult):
        print_run_result(result)
    # None: a non-zero rank under torchrun; rank 0 reports


def print_run_result(result: RunResult) -> None:
    for name, metrics in (("val", result.val), ("test", result.test), ("train subset", result.train)):
        if metrics is not None:
            chosen = f", {metrics.model}" if metrics.model else ""
            print(f"final {name}: accuracy {metrics.accuracy:.4f}, loss {metrics.loss:.4f} "
                  f"({metrics.num_samples} images{chosen})")
    if result.stopped_early is not None:
        print(f"stopped early at epoch {result.stopped_early} (early_stopping_patience)")
    if result.pruned_at is not None:
        print(f"pruned at epoch {result.pruned_at} (tuning trial)")
    print(f"run folder: {result.run_dir}")


def print_seed_summary(result: SeedsResult) -> None:
    seeds = [run.seed for run in result.runs]
    print(f"{len(seeds)} runs, seeds {', '.join(map(str, seeds))}")
    print(f"{'metric':<16}{'mean':>9}{'std':>9}{'min':>9}{'max':>9}")
    for name, stats in result.summary.items():
        print(f"{name:<16}" + "".join(f"{stats[key]:>9.4f}" for key in ("mean", "std", "min", "max")))
    for run in result.runs:
        print(f"run folder (seed {run.seed}): {run.run_dir}")
    print(f"summary: {result.summary_file}")


def evaluate(
    checkpoint: str | None = None, config: str | None = None, json: bool = False, output_dir: str | None = None,
    raw_weights: bool = False, **overrides: Any,
) -> None:
    """Evaluate a checkpoint on the test set; write its confusion matrix (JSON and PNG)."""
    if checkpoint is None:
        raise UserError("evaluate needs --checkpoint=PATH (a training_checkpoint_*.pt or best_model_*.pt file)")
    from cifar10_dist import reports

    folder = Path(output_dir) if output_dir is not None else Path(str(checkpoint)).parent
    metrics = api.evaluate(str(checkpoint), config, raw_weights=bool(raw_weights), output_dir=folder, **overrides)
    if metrics is None:
        return
    stem = reports.confusion_stem(Path(str(checkpoint)))
    if json:
        print(json_module.dumps(metrics.to_dict()))
        return
    width = max(12, *(len(name) for name in metrics.classes))
    print(f"{'class':<{width}} accuracy")
    for name, accuracy in zip(metrics.classes, metrics.per_class_accuracy):
        print(f"{name:<{width}} {accuracy:8.4f}")
    print(f"confusion matrix: {folder / stem}.json, .png")
    print(f"test: accuracy {metrics.accuracy:.4f}, loss {metrics.loss:.4f} ({metrics.num_samples} images)")


def predict(*paths: str, checkpoint: str | None = None, top_k: int = 3, json: bool = False, batch_size: int = 256,
            tta: int | None = None, device: str | None = None, raw_weights: bool = False) -> None:
    """Classify image files and folders; one line (or JSON object) per image."""
    if checkpoint is None:
        raise UserError("predict needs --checkpoint=PATH (a training_checkpoint_*.pt or best_model_*.pt file)")
    if not paths:
        raise UserError("predict needs image files or folders: cifar10-dist predict --checkpoint=FILE PATH [PATH ...]")
    _require_whole("batch_size", batch_size, 1)
    _require_whole("top_k", top_k, 1)
    from cifar10_dist import inference

    if tta is not None:
        inference.check_tta(tta)

    trained = inference.load_trained_model(str(checkpoint), device, bool(raw_weights))
    if top_k > len(trained.classes):
        raise UserError(f"top_k={top_k} is more than the {len(trained.classes)} classes")
    found = inference.find_images(map(str, paths))
    failures = list(found.failures)
    for path, reason in found.failures:
        print(f"error: {path}: {reason}", file=sys.stderr)
    classified = resized = 0
    for start in range(0, len(found.files), batch_size):
        read = inference.read_images(found.files[start:start + batch_size])
        for path, reason in read.failures:
            print(f"error: {path}: {reason}", file=sys.stderr)
        failures += read.failures
        probabilities = inference.probabilities(trained, read.images, batch_size, tta)
        for path, row in zip(read.paths, probabilities):
            print(_format_prediction(str(path), row, trained.classes, top_k, json))
        classified, resized = classified + len(read.paths), resized + read.resized
    if resized:
        print(f"note: {resized} of {classified} images were not 32x32 and were resized (shorter side to 32 pixels, "
              "then the centre 32x32)", file=sys.stderr)
    if failures:
        raise AlreadyReported(f"{len(failures)} inputs could not be classified")


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


def export(checkpoint: str | None = None, format: str | None = None, output: str | None = None,
           raw_weights: bool = False) -> None:
    """Export a checkpoint's model (safetensors, torchscript, onnx), verified against PyTorch; print the check."""
    if checkpoint is None or format is None:
        raise UserError("export needs --checkpoint=PATH and --format=safetensors|torchscript|onnx")
    result = api.export(str(checkpoint), str(format), None if output is None else str(output), bool(raw_weights))
    runtime = {"safetensors": "safetensors read back into the model", "torchscript": "torch.jit.load",
               "onnx": "ONNX Runtime (CPU)"}[result.format]
    if result.tensors_equal is not None:
        print(f"read back: {result.tensors_equal} of {result.tensors_equal} tensors torch.equal to the model's")
    print(f"{runtime} vs PyTorch on {result.images}: logits max abs difference {result.max_abs_difference:.2e}, "
          f"same top-1 class on {result.same_top1} of {result.num_images}")
    print(f"wrote {result.path} ({Path(result.path).stat().st_size / 1e6:.1f} MB) and {result.sidecar}")


def report(*run_dirs: str, output: str = "report.png", targets: Any = None) -> None:
    """Compare run folders: a table on stdout and one plot overlaying their curves; with --targets=0.9,0.93,0.94
    also the time each run took to reach those accuracies (mean and std over the runs)."""
    result = api.report(run_dirs, str(output), _parse_targets(targets),
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


def prepare_data(
    data_path: str = "cifar10", synthetic: int | None = None, synthetic_test: int | None = None, seed: int = 0,
    dataset: str = "cifar10",
) -> None:
    """Download and verify CIFAR-10 (or CIFAR-100), or write a synthetic dataset in the same format."""
    prepared = api.prepare_data(str(data_path), str(dataset), synthetic, synthetic_test, int(seed))
    if prepared.synthetic:
        print(f"wrote {prepared.train_images} synthetic training and {prepared.test_images} test images to "
              f"{prepared.folder}")
        return
    official = "match" if prepared.official else "do not match"
    print(f"{prepared.folder}: {prepared.train_images} training and {prepared.test_images} test images, valid "
          f"structure; files {official} the official release's md5 sums")


def tune(config: str | None = None, space: str | None = None, study: str | None = None, trials: int = 10,
         storage: str | None = None, sampler: str = "tpe", sampler_seed: int | None = None, pruner: str = "median",
         pruner_startup_trials: int = 5, pruner_warmup_epochs: int = 0, final_test: bool = True,
         heartbeat: int = 60, report_only: bool = False, **overrides: Any) -> None:
    """Tune hyperparameters with Optuna (see TUNE_HELP); prints a line per trial, the table and the best."""
    if study is None:
        raise UserError("tune needs --study=NAME (the study's name and its folder under output_path)")
    api.tune(config, space, str(study), trials, storage, sampler, sampler_seed, pruner, pruner_startup_trials,
             pruner_warmup_epochs, final_test, heartbeat, report_only, **overrides)


def doctor(model: str = "airbench", batch_size: int = 32, budget_seconds: float = 2.0, json: bool = False) -> None:
    """Print what this machine is and what will be fast on it (JSON with --json)."""
    from cifar10_dist import diagnostics

    report = api.doctor(str(model), int(batch_size), float(budget_seconds))
    print(json_module.dumps(report.to_dict(), indent=2) if json else diagnostics.render(report))


COMMANDS = {"run": run, "evaluate": evaluate, "predict": predict, "export": export, "tune": tune,
            "prepare-data": prepare_data, "report": report, "doctor": doctor}
HELP = {"run": RUN_HELP, "evaluate": EVALUATE_HELP, "predict": PREDICT_HELP, "export": EXPORT_HELP,
        "tune": TUNE_HELP, "prepare-data": PREPARE_HELP, "report": REPORT_HELP,
        "doctor": DOCTOR_HELP}


def _help_text(argv: list[str]) -> str | None:
    """Our own help (fire's cannot list options passed through **overrides)."""
    asks_help = any(arg in ("-h", "--help") for arg in argv)
    if not argv or (asks_help and argv[0] not in COMMANDS):
        return MAIN_HELP
    if asks_help:
        return HELP[argv[0]].format(options=describe_options())
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``cifar10-dist`` and ``python -m cifar10_dist``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    help_text = _help_text(argv)
    if help_text is not None:
        print(help_text)
        return 0
    if argv[0] not in COMMANDS:
        print(f"error: unknown command '{argv[0]}': choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USER_ERROR
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
    return 0

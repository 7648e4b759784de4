"""The command line's help pages: ``cifar10-dist --help`` and ``cifar10-dist COMMAND --help`` (``{options}`` is
filled with every config key, its default and meaning, from ``config.describe_options``; the export formats come
from ``serve.formats``)."""

from typing import Any

from cifar10_dist.config import commands
from cifar10_dist.config.commands import flags_of, help_block, usage
from cifar10_dist.config.lr_sweep import OUTPUT_DIR, LrSweep
from cifar10_dist.serve.formats import FORMATS, INSTALL_HINT


def flags_block(*declared: Any) -> str:
    """A page's flag lines (``config.commands.help_block``), its braces kept through the page's ``format``."""
    return help_block(*declared).replace("{", "{{").replace("}", "}}")


def command_page(command: str, text: str, *declared: Any, keys: bool = True, paths: tuple[str, ...] = ()) -> str:
    """A command's help page: the usage (its config file and config keys where it takes ``keys``, the ``paths``,
    its flags, --debug), ``text``, its flag lines with --config and --debug, then (``keys``) every config key."""
    common = [(commands.CONFIG_FILE,)] if keys else []
    words = usage(command, *common, *declared, before=paths, after=[*([commands.KEYS] if keys else []), "[--debug]"])
    flags = flags_block(*declared, *common, (commands.DEBUG,))
    return f"{words}\n\n{text}\n\n{flags}\n" + ("{options}\n" if keys else "")


RUN_HELP = command_page(
    "run",
    """\
Train a CIFAR-10 classifier; prints the final metrics and the run folder.
Values come from the defaults below, then the YAML file, then the command line.""",
)

LR_FIND_HELP = command_page(
    "lr-find",
    """\
Sweep the learning rate before training (Ignite's FastaiLRFinder): the run these flags describe (model,
pretrained start, data, augmentation, optimizer with its param groups, precision, processes) trains num_iter
iterations at learning rates rising on a log scale from start_lr to end_lr, stopping early when the smoothed loss
passes diverge_threshold times its lowest or is not finite. Every rank sees the mean loss of all ranks, so all
agree. The model and optimizer are left as they were. Prints the suggested learning_rate (the schedule's peak:
each other param group keeps its ratio to it: bias_lr_scale, backbone_lr_scale, muon_lr / learning_rate) and
writes lr_find.png (loss against learning rate, the suggestion marked) and lr_find.json. `run
--learning_rate=find` runs this sweep (the defaults below) first and trains with its suggestion.""",
    flags_of(LrSweep),
    [OUTPUT_DIR],
)

BATCH_SIZE_HELP = command_page(
    "batch-size",
    """\
Which batch the run these flags describe should take on this machine, measured with its own training step
(model, optimizer with its groups, precision, memory format, image size) on random images, in this process.
On a GPU: the largest batch that fits (doubled until out of memory, then bisected back), less a 10% margin.
On a CPU: each size timed (a warm-up step, then at least 3 steps within budget_seconds, the middle half of
the step times as the band); the fastest is suggested only where its band clears the config's own batch's,
else "no difference measurable" and the config's batch is kept. Sizes are per process; the suggestion is
global (times the planned world size), with learning_rate scaled to it by the optimizer's rule (linear for
SGD, square root for AdamW).""",
    commands.BATCH_SIZE,
)

EVALUATE_HELP = command_page(
    "evaluate",
    """\
Test-set accuracy, loss and per-class accuracy of a saved model (training_checkpoint_*.pt or best_model_*.pt);
writes the confusion matrix as confusion_<checkpoint name>.json and .png into output_dir.
The checkpoint's recorded model (and model_kwargs), dataset, data_path and synthetic_size are used unless
given here.
Batch and launch keys as for run.""",
    commands.EVALUATE,
)

PREDICT_HELP = command_page(
    "predict",
    """\
Classify image files with a saved model: one line per image with its top-k classes and probabilities.
PATH is an image file (PNG, JPEG, anything Pillow opens) or a folder (searched recursively). Images are
converted to RGB; those that are not 32x32 are resized (shorter side to 32 pixels, then the centre 32x32).
A file that cannot be read gets one error line, the others are still classified, and the exit code is 2.""",
    commands.PREDICT,
    keys=False,
    paths=("PATH [PATH ...]",),
)


def export_help() -> str:
    """export's page: its flags are ``serve.exporting``'s, imported (with torch) only when this page is asked
    for."""
    from cifar10_dist.serve.export_flags import EXPORT_FLAGS, Quantization

    needs = ", ".join(f.name for f in FORMATS.values() if f.needs)
    return command_page(
        "export",
        f"""\
Write a saved model in a form that needs neither this package nor pickle: normalised float32 images
(N, 3, 32, 32) in, logits out. A JSON sidecar (PATH.json) holds the model reference, class names,
normalisation mean/std, input shape and provenance. The file is loaded back with its own runtime and
compared with the PyTorch model before it appears: logits within 1e-3 of their scale (the largest absolute
logit) and the same top-1 class, or no file.
Needs: {INSTALL_HINT} for {needs}; the others need torch alone""",
        EXPORT_FLAGS,
        flags_of(Quantization),
        keys=False,
    )


TUNE_HELP = command_page(
    "tune",
    """\
Tune hyperparameters with Optuna. Each trial is an ordinary run in output_path/NAME/trial-<number> (launch keys as
for run), ranked on its best val accuracy (val_split > 0 is required: no trial sees the test set). Several tune
processes given the same study and storage share the work. At the end: a table of the trials, best_config.yaml
and plots in output_path/NAME, and the best trial's best model evaluated once on the test set. --config (or the
keys below) is the base config every trial starts from.
Needs: pip install 'cifar10-dist[tune]'""",
    commands.TUNE,
)

PREPARE_HELP = command_page(
    "prepare-data",
    """\
Download, extract and verify CIFAR-10 into DIR/cifar-10-batches-py (CIFAR-100: DIR/cifar-100-python), or write
a synthetic dataset in the same on-disk format; with --dataset=folder, decode an image folder
(DIR/train/<class>/..., optionally test/ and val/) into its cache, check it and print its card: classes with
counts per split, image sizes, normalisation, duplicates across splits, unreadable files, cache size and time.""",
    commands.PREPARE_DATA,
    keys=False,
)

DOCTOR_HELP = command_page(
    "doctor",
    """\
What this machine is and what will be fast on it: versions; CPU model, cores, threads, kernels (AVX2/AVX512)
and native bf16 (AMX, AVX512-BF16); GPUs (memory, compute capability, bf16) and NCCL; the distributed backends;
a measured probe (training steps of --model in fp32, fp32 + channels_last and bf16/fp16 autocast +
channels_last, each timed over at least 3 steps after a warm-up, with the spread); what with_amp=auto picks
here, and advice only where a difference is beyond the spread ("not measurable here" otherwise). The probe
takes about budget_seconds per setting (about 6 s on a CPU), at most (settings + 1) x budget_seconds when a
slow machine needs a smaller batch. Attach --json's output to bug reports.""",
    commands.DOCTOR,
    keys=False,
)

REPORT_HELP = command_page(
    "report",
    """\
Compare runs: prints a table (best accuracy and its split, final test accuracy, training time) from
each folder's summary.json and metrics.jsonl, and writes one plot overlaying their curves.""",
    commands.REPORT,
    keys=False,
    paths=("RUN_DIR [RUN_DIR ...]",),
)

MAIN_HELP = f"""\
Usage: cifar10-dist COMMAND [--KEY=VALUE ...]     (cifar10-dist --version: the installed version)

Train CIFAR-10 classifiers with PyTorch-Ignite on one CPU, many processes, GPUs or TPUs.

Commands:
  run            train (cifar10-dist run --help lists every option)
  lr-find        sweep the learning rate before training; suggest one and plot the loss against it
  batch-size     measure which batch size trains fastest here (CPU) or fits (GPU); scale the learning rate
  evaluate       test-set accuracy and loss of a saved checkpoint
  predict        classify image files with a saved checkpoint
  export         write a checkpoint's model as {", ".join(FORMATS)} (verified)
  tune           search hyperparameters with Optuna (trials ranked on val, one final test)
  prepare-data   download and verify CIFAR-10, write a synthetic copy, or cache and check an image folder
  report         compare run folders: a table and a plot
  doctor         what this machine is and which settings train fast on it (a measured probe)
  config         print the resolved config as YAML (what run would use with the same flags)
"""

CONFIG_HELP = command_page(
    "config",
    """\
Print the config that `cifar10-dist run` with the same flags would use, resolved (defaults < FILE < flags) and
validated, as YAML: save it (`> my.yaml`), edit it, and train with `run --config=my.yaml`. A bad value is
refused in one line, exactly as `run` refuses it.""",
    commands.CONFIG,
)

PAGES = {
    "run": RUN_HELP,
    "lr-find": LR_FIND_HELP,
    "batch-size": BATCH_SIZE_HELP,
    "evaluate": EVALUATE_HELP,
    "predict": PREDICT_HELP,
    "export": export_help,
    "tune": TUNE_HELP,
    "prepare-data": PREPARE_HELP,
    "report": REPORT_HELP,
    "doctor": DOCTOR_HELP,
    "config": CONFIG_HELP,
}


def page(command: str) -> str:
    """The help page of ``command`` (its ``{options}`` not yet filled)."""
    found = PAGES[command]
    return str(found() if callable(found) else found)


def shipped_list() -> str:
    """The shipped configs, a line each: the name --config takes and the first line of the file's own comment."""
    from cifar10_dist.config import shipped_configs

    found = shipped_configs()
    width = max(len(name) for name in found)
    lines = [f"{name:<{width}}  {path.read_text().splitlines()[0].lstrip('# ')}" for name, path in found.items()]
    return "\n".join(
        [
            *lines,
            "(cifar10-dist run --config=NAME; tune --space=NAME for the space_* ones; "
            "cifar10-dist config --config=NAME prints one whole)",
        ]
    )

"""The command line's help pages, made for the terminal they are read in: ``cifar10-dist --help``,
``cifar10-dist COMMAND --help`` (the command's own flags, then the config keys under one heading per topic, each
key on its own line with a few words), and ``cifar10-dist COMMAND --help=KEY`` (one key's whole story). Every text
comes from the declarations: the keys' (``config.fields``: ``short`` and ``help``), the commands' flags
(``config.commands``), the export formats (``config.export_formats``). Lines are wrapped to the terminal's width, 80
columns where there is no terminal."""

from __future__ import annotations

import shutil
import textwrap
from typing import Any, Callable

from cifar10_dist.cli.page_layout import PAGE_WIDTH, help_block, option_line, usage
from cifar10_dist.config import commands
from cifar10_dist.config.commands import flags_of
from cifar10_dist.config.export_formats import FORMATS, INSTALL_HINT
from cifar10_dist.config.fields import FIELDS, choices, settable_by_topic
from cifar10_dist.config.lr_sweep import OUTPUT_DIR, LrSweep

MAX_WIDTH = 100  # wider terminals get pages this wide: lines longer than that are hard to read


def page_width() -> int:
    """The terminal's width (COLUMNS where set), 80 where there is no terminal, at most MAX_WIDTH."""
    return min(shutil.get_terminal_size((PAGE_WIDTH, 24)).columns, MAX_WIDTH)


def paragraphs(text: str, width: int) -> str:
    """``text``'s paragraphs (separated by blank lines) each wrapped to ``width``."""
    return "\n\n".join(
        textwrap.fill(" ".join(part.split()), width, break_on_hyphens=False) for part in text.strip().split("\n\n")
    )


def key_lines(names: list[str], width: int) -> str:
    """A line (wrapped) for each config key: ``--name=default`` and its few words."""
    return "\n".join(
        option_line(f"  --{name}={shown_default(name)}", FIELDS[name].metadata["short"], width) for name in names
    )


def shown_default(name: str) -> str:
    default = FIELDS[name].default
    return "None" if default is None else str(default)


def key_groups(width: int, first: str | None = None) -> str:
    """The config keys under their topics' headings; ``first``: text placed after the first topic (launch)."""
    blocks = []
    for number, (heading, names) in enumerate(settable_by_topic()):
        blocks.append(f"{heading}:\n{key_lines(names, width)}")
        if number == 0 and first:
            blocks.append(first)
    return "\n\n".join(blocks)


KEY_HINT = "One key's whole story: cifar10-dist {command} --help=KEY. All keys: docs/configuration.md."


def command_page(
    command: str, text: str, *declared: Any, keys: bool = True, paths: tuple[str, ...] = ()
) -> Callable[[int], str]:
    """A command's help page at a width: the usage, ``text``, its own flags, then (``keys``) --config and --debug
    after the launch keys, and the other keys by topic; without keys, its flags and --debug."""

    def page(width: int) -> str:
        common = [(commands.CONFIG_FILE,)] if keys else []
        after = [*([commands.KEYS] if keys else []), "[--debug]"]
        words = usage(command, *common, *declared, before=paths, after=after, width=width)
        parts = [words, paragraphs(text, width)]
        if declared:
            parts.append(f"Its own flags:\n{help_block(*declared, width=width)}")
        if not keys:
            return "\n\n".join([*parts, help_block((commands.DEBUG,), width=width)])
        config = f"Config file and errors:\n{help_block((commands.CONFIG_FILE, commands.DEBUG), width=width)}"
        return "\n\n".join([*parts, key_groups(width, config), paragraphs(KEY_HINT.format(command=command), width)])

    return page


RUN_HELP = command_page(
    "run",
    """Train a classifier; print the final metrics and the run folder. Values come from the defaults, then the
    YAML file (--config), then the flags.""",
)

LR_FIND_HELP = command_page(
    "lr-find",
    """Sweep the learning rate before training (Ignite's FastaiLRFinder), with the run these keys describe. The
    learning rate rises on a log scale from start_lr to end_lr over num_iter iterations. The sweep stops early when
    the smoothed loss passes diverge_threshold times its lowest.

    Prints the suggested learning_rate and writes lr_find.png and lr_find.json. The model and optimizer are left
    as they were. `run --learning_rate=find` runs this sweep first and trains with its suggestion.""",
    flags_of(LrSweep),
    [OUTPUT_DIR],
)

BATCH_SIZE_HELP = command_page(
    "batch-size",
    """Measure which batch the run these keys describe should take on this machine, with its own training step on
    random images. On a GPU: the largest batch that fits, less a 10% margin. On a CPU: each size timed; the fastest
    is suggested only where it is faster beyond the spread.

    Sizes are per process; the suggestion is global, with learning_rate scaled to it by the optimizer's rule.""",
    commands.BATCH_SIZE,
)

EVALUATE_HELP = command_page(
    "evaluate",
    """Test-set accuracy, loss and per-class accuracy of a saved model (training_checkpoint_*.pt or
    best_model_*.pt). Writes its confusion matrix and most confident mistakes into output_dir.

    The checkpoint's recorded model and data keys are used unless given here. Batch and launch keys as for run.""",
    commands.EVALUATE,
)

PREDICT_HELP = command_page(
    "predict",
    """Classify image files with a saved model: a line per image with its top-k classes and probabilities. PATH is
    an image file (anything Pillow opens) or a folder, searched recursively. Images that are not 32x32 are
    resized: shorter side to 32 pixels, then the centre crop.

    A file that cannot be read gets one error line; the others are still classified, and the exit code is 2.""",
    commands.PREDICT,
    keys=False,
    paths=("PATH [PATH ...]",),
)


def export_help(width: int) -> str:
    """export's page: its flags are ``config.export_flags``', imported (with torch) only when this page is asked
    for."""
    from cifar10_dist.config.export_flags import EXPORT_FLAGS, Quantization

    needs = ", ".join(f.name for f in FORMATS.values() if f.needs)
    return command_page(
        "export",
        f"""Write a saved model in a form that needs neither this package nor pickle: normalised float32 images
        (N, 3, 32, 32) in, logits out. A JSON sidecar (PATH.json) holds the model reference, class names,
        normalisation and provenance.

        The file is loaded back with its own runtime and compared with the PyTorch model before it appears: logits
        within 1e-3 of their scale and the same top-1 class, or no file. Needs {INSTALL_HINT} for {needs}.""",
        EXPORT_FLAGS,
        flags_of(Quantization),
        keys=False,
    )(width)


TUNE_HELP = command_page(
    "tune",
    """Tune hyperparameters with Optuna. Each trial is an ordinary run in output_path/NAME/trial-<number>, ranked on
    its best val accuracy: val_split > 0 is needed, and no trial sees the test set. Several tune processes given
    the same study and storage share the work.

    At the end: a table of the trials, best_config.yaml and plots, and the best model tested once. --config (or
    the keys below) is the base every trial starts from. Needs pip install 'cifar10-dist[tune]'.""",
    commands.TUNE,
)

PREPARE_HELP = command_page(
    "prepare-data",
    """Download, extract and verify CIFAR-10 into DIR/cifar-10-batches-py (CIFAR-100: DIR/cifar-100-python), or
    write a synthetic dataset in that format. With --dataset=folder: decode an image folder (DIR/train/<class>/...,
    optionally test/ and val/) into its cache, check it and print its card.""",
    commands.PREPARE_DATA,
    keys=False,
)

DOCTOR_HELP = command_page(
    "doctor",
    """What this machine is and what trains fast on it: versions, the CPU and its native bf16, GPUs, the
    distributed backends, and how many processes run well here. A measured probe times training steps of --model
    in each precision and memory format, about budget_seconds each.

    Advice is given only where a difference is beyond the spread. Attach --json's output to bug reports.""",
    commands.DOCTOR,
    keys=False,
)

REPORT_HELP = command_page(
    "report",
    """Compare runs: a table of each folder's best and final test accuracy and training time, and one plot of their
    curves.""",
    commands.REPORT,
    keys=False,
    paths=("RUN_DIR [RUN_DIR ...]",),
)

CONFIG_HELP = command_page(
    "config",
    """Print the config that `cifar10-dist run` with the same flags would use, resolved and validated, as YAML.
    Save it (`> my.yaml`), edit it, and train with `run --config=my.yaml`. A bad value is refused as run refuses
    it. `config --list` names the shipped configs.""",
    commands.CONFIG,
)

COMMAND_LINES = [
    ("run", "train (run --help: every option, by topic)"),
    ("lr-find", "sweep the learning rate; suggest one"),
    ("batch-size", "measure the batch size that trains fastest here"),
    ("evaluate", "test-set accuracy and loss of a saved model"),
    ("predict", "classify image files with a saved model"),
    ("export", f"write a model as {', '.join(FORMATS)} (verified)"),
    ("tune", "search hyperparameters with Optuna"),
    ("prepare-data", "download CIFAR-10, or cache and check an image folder"),
    ("report", "compare run folders: a table and a plot"),
    ("doctor", "what this machine is and what trains fast on it"),
    ("config", "print the resolved config as YAML; --list: the shipped ones"),
]


def main_help(width: int) -> str:
    listed = "\n".join(option_line(f"  {name}", text, width, column=17) for name, text in COMMAND_LINES)
    return "\n\n".join(
        [
            "Usage: cifar10-dist COMMAND [--KEY=VALUE ...]",
            paragraphs(
                "Train CIFAR-10 classifiers with PyTorch-Ignite on one CPU, many processes, GPUs or TPUs. "
                "cifar10-dist --version names the installed version.",
                width,
            ),
            f"Commands:\n{listed}",
            paragraphs("Two processes: cifar10-dist run --config=demo --backend=gloo --nproc_per_node=2", width),
        ]
    )


PAGES: dict[str, Callable[[int], str]] = {
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


def page(command: str, width: int | None = None) -> str:
    """The help page of ``command`` at ``width`` (default: the terminal's)."""
    return PAGES[command](width or page_width())


def key_page(name: str, width: int | None = None) -> str:
    """``--help=KEY``: the key's topic, default, what it accepts and its whole help text; for ``model``, the
    networks it names."""
    width = width or page_width()
    field = FIELDS[name]
    topic = next(heading for heading, keys in settable_by_topic() if name in keys)
    accepted = choices(name)
    bounds = field.metadata["bounds"]
    facts = [
        f"topic: {topic}",
        f"default: {shown_default(name)}",
        *([f"accepts: {', '.join(map(str, accepted))}"] if accepted else []),
        *([f"accepts: a number {bounds.describe(isinstance(field.default, int))}"] if bounds is not None else []),
        *([f"also: {', '.join(field.metadata['also_accepts'])}"] if field.metadata["also_accepts"] else []),
        f"in a YAML file: {name}: {shown_default(name)}",
    ]
    parts = [
        f"--{name}: {field.metadata['short']}",
        "\n".join(textwrap.fill(fact, width, subsequent_indent="    ", break_on_hyphens=False) for fact in facts),
        paragraphs(field.metadata["help"], width),
    ]
    if name == "model":
        parts.append(models_list(width))
    return "\n\n".join(parts)


def models_list(width: int) -> str:
    """The networks ``--model`` names: the built-in ones, torchvision's, timm's and a user's own."""
    from cifar10_dist.models.networks import REGISTRY

    return "\n\n".join(
        [
            paragraphs(f"Built in: {', '.join(sorted(REGISTRY))}.", width),
            paragraphs(
                "torchvision's classification models by name (resnet50, mobilenet_v3_small, ...). timm's as "
                "timm:NAME (pip install 'cifar10-dist[timm]'). Your own as path/to/file.py:factory or "
                "package.module:factory: a function that returns a torch.nn.Module (docs/models-in-and-out.md).",
                width,
            ),
        ]
    )


def options_reference() -> str:
    """docs/configuration.md's reference of the keys (a test keeps the page equal to it): a table per topic, each
    key with its default and whole help text."""
    tables = []
    for heading, names in settable_by_topic():
        rows = [
            f"| `{name}` | `{shown_default(name)}` | {FIELDS[name].metadata['help'].replace('|', '/')} |"
            for name in names
        ]
        tables.append("\n".join([f"### {heading}", "", "| key | default | what it does |", "|---|---|---|", *rows]))
    return "\n\n".join(tables)


def shipped_list(width: int | None = None) -> str:
    """The shipped configs, each with the first sentence of its file's own comment (wrapped under its name)."""
    from cifar10_dist.config import shipped_configs

    width = width or page_width()
    found = shipped_configs()
    column = max(len(name) for name in found) + 4
    lines = [option_line(f"  {name}", first_sentence(path.read_text()), width, column) for name, path in found.items()]
    closing = (
        "cifar10-dist run --config=NAME trains one; tune --space=NAME takes the space_* ones; "
        "cifar10-dist config --config=NAME prints one whole."
    )
    return "\n".join([*lines, "", paragraphs(closing, width)])


def first_sentence(text: str) -> str:
    """The first sentence of a file's leading comment block: the comment lines joined, up to the first full stop
    or colon that ends a clause outside brackets."""
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    joined = " ".join(part for part in comment if part)
    depth = 0
    for index, character in enumerate(joined):
        depth += {"(": 1, ")": -1}.get(character, 0)
        if depth == 0 and character in ".:" and (index + 1 == len(joined) or joined[index + 1] == " "):
            return joined[:index] + "."
    return joined

"""A command's own flags (those that are not config keys), declared once, one way: as the fields of a frozen
dataclass made with ``flag(...)`` (default, help, how the page shows it, whether it is required), read as ``Flag``
records by ``flags_of``. The CLI and the API take their defaults from the declaration, the help pages print it
(``help_block``, ``usage``); tests/test_cli.py compares all three and fails on a default written again.
lr-find's are ``config.lr_sweep``'s, export's ``config.export_flags``'; the other commands' are declared below
(their jobs' modules import torch, and the help pages must not)."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from cifar10_dist.config.trial import PrunerSpec
from cifar10_dist.errors import UserError


@dataclass(frozen=True)
class Flag:
    """One flag: its name, default and one-paragraph help; ``shown``: the default as the page writes it (FILE)."""

    name: str
    default: Any
    help: str
    shown: str | None = None
    required: bool = False  # the command cannot run without it (its usage line shows it outside brackets)
    waived_by: str | None = None  # a switch of the same command that makes it needless (tune's --report_only)

    def usage(self) -> str:
        """The flag in a usage line: ``--name=SHOWN`` when required, else ``[--name=default]`` (``[--name]`` for a
        switch)."""
        if self.required:
            return f"--{self.name}={self.shown}"
        if self.default is False and self.shown is None:
            return f"[--{self.name}]"
        value = self.shown if self.shown is not None else self.name.upper() if self.default is None else self.default
        return f"[--{self.name}={value}]"


def default(declared: Iterable[Flag], name: str) -> Any:
    """A declared flag's default (for an API signature)."""
    return next(one.default for one in declared if one.name == name)


def flag(
    default: Any,
    help: str,
    shown: str | None = None,
    name: str | None = None,
    required: bool = False,
    waived_by: str | None = None,
) -> Any:
    """A dataclass field that is also a command's flag (``name``: the flag's, where it differs from the field's):
    how every command's flags are declared (the records above ``others``, lr-find's ``LrSweep``, export's)."""
    return dataclasses.field(
        default=default,
        metadata={"help": help, "shown": shown, "flag": name, "required": required, "waived_by": waived_by},
    )


def flags_of(record: type) -> tuple[Flag, ...]:
    """The flags a dataclass declares (its fields made with ``flag``), in field order."""
    return tuple(
        Flag(
            field.metadata["flag"] or field.name,
            field.default,
            field.metadata["help"],
            field.metadata["shown"],
            field.metadata["required"],
            field.metadata["waived_by"],
        )
        for field in dataclasses.fields(record)
        if "help" in field.metadata
    )


def field_names(record: type) -> dict[str, str]:
    """Flag name -> field name of a dataclass's flags."""
    return {
        field.metadata["flag"] or field.name: field.name
        for field in dataclasses.fields(record)
        if "help" in field.metadata
    }


def from_flags(record: type, given: Mapping[str, Any], **fixed: Any) -> Any:
    """``record`` built from those of ``given`` that are its flags (the rest are left for others)."""
    names, declared = field_names(record), {one.name: one.default for one in flags_of(record)}
    return record(**{names[key]: typed(declared[key], value) for key, value in given.items() if key in names}, **fixed)


def typed(default: Any, value: Any) -> Any:
    """A whole number given where the default is a float, made a float (what the command line gives for 1)."""
    numeric = isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)
    return float(value) if numeric else value


# the flags every command's page shows: the config file (commands that take config keys) and --debug
CONFIG_FILE = Flag(
    "config", None, "a YAML file of keys, or a shipped config's name (config --list)", shown="FILE.yaml|NAME"
)
DEBUG = Flag("debug", False, "tracebacks instead of one-line errors")
KEYS = "[--KEY=VALUE ...]"  # a usage's config keys
DEFAULT_TOP_K = 3  # predict's classes per image when --top_k is not given (fewer when the model has fewer)

JSON_HELP = "print the result as one JSON object"
RAW_WEIGHTS_HELP = "a run with ema_decay: use the trained weights, not the EMA (training checkpoints)"


@dataclass(frozen=True)
class BatchSizeFlags:
    """batch-size's own flags (its others are config keys)."""

    batch_sizes: str | None = flag(
        None,
        "CPU: the sizes to time (the config's own is always added); GPU: the first is where the doubling starts",
        shown="32,64,128,256,512,1024",
    )
    budget_seconds: float = flag(3.0, "about how long each size is timed")
    json: bool = flag(False, JSON_HELP)


@dataclass(frozen=True)
class ReportFlags:
    """report's flags."""

    output: str = flag("report.png", "where the comparison plot goes")
    targets: str | None = flag(
        None,
        "accuracies (e.g. 0.9,0.93,0.94): also the training time each run took to reach "
        "each one, with the mean and std over the runs",
    )


@dataclass(frozen=True)
class DoctorFlags:
    """doctor's flags."""

    model: str = flag("airbench", "the probe's model: a built-in name or package.module:factory / file.py:factory")
    batch_size: int = flag(32, "the probe's batch")
    budget_seconds: float = flag(2.0, "about how long each probed setting runs (a step starts only if it still fits)")
    link: Optional[str] = flag(
        None,
        "the link between your nodes (100mbit, 1gbit, 25gbit, 1.5GB/s): estimate the "
        "probe model's throughput at 2-16 nodes over it, without and with gradient compression",
    )
    json: bool = flag(False, "print the report as one JSON object")


@dataclass(frozen=True)
class ConfigFlags:
    """config's own flags (its others are config keys)."""

    list: bool = flag(False, "list the configs the package ships, by name (--config=NAME takes one), with what each is")


@dataclass(frozen=True)
class EvaluateFlags:
    """evaluate's own flags (its others are config keys)."""

    checkpoint: str | None = flag(
        None, "a checkpoint file, or a run folder (its best model)", shown="PATH", required=True
    )
    json: bool = flag(False, "print the metrics (with per_class_accuracy, confusion_matrix) as JSON on the last line")
    output_dir: str | None = flag(None, "folder for the confusion matrix files (default: the checkpoint's folder)")
    raw_weights: bool = flag(False, RAW_WEIGHTS_HELP)


@dataclass(frozen=True)
class PredictFlags:
    """predict's flags."""

    checkpoint: str | None = flag(
        None,
        "training_checkpoint_*.pt, best_model_*.pt or a run folder (its best model; the recorded model is "
        "rebuilt), or an ONNX file of export (int8 too), run by ONNX Runtime on the CPU",
        shown="FILE",
        required=True,
    )
    top_k: int | None = flag(
        None,
        f"classes shown per image (default: {DEFAULT_TOP_K}, or all of a model's classes when it has fewer)",
        shown="N",
    )
    json: bool = flag(False, "one JSON object per line: path and top-k classes with probabilities")
    batch_size: int = flag(256, "images per forward pass")
    tta: int | None = flag(None, "test-time augmentation 0, 1 or 2 (default: the checkpoint's tta)")
    device: str | None = flag(None, "cpu, cuda, cuda:1, ... (default: cuda when there is a GPU)")
    raw_weights: bool = flag(False, RAW_WEIGHTS_HELP)


@dataclass(frozen=True)
class PrepareDataFlags:
    """prepare-data's flags."""

    dataset: str = flag("cifar10", "cifar10, cifar100 or folder")
    data_path: str = flag("cifar10", "folder that gets cifar-10-batches-py (or cifar-100-python), or the image folder")
    synthetic: int | None = flag(None, "write N synthetic training images instead of downloading CIFAR-10")
    synthetic_test: int | None = flag(None, "synthetic test images (default: N // 5)")
    seed: int = flag(0, "seed of the synthetic images")
    image_size: int = flag(32, "folder: the size images are trained at (stored at image_size / crop_fraction)")
    crop_fraction: float = flag(1.0, "folder: as the runs that will read the cache give it (e.g. 0.875)")
    skip_bad_images: bool = flag(False, "folder: leave out unreadable files (else refused, naming them)")
    drop_test_duplicates: bool = flag(False, "folder: remove test/val images that are copies of training images")
    cache_dir: str | None = flag(None, "folder: where the cache goes (default DIR/.cifar10_dist_cache)")


@dataclass(frozen=True)
class TuneFlags:
    """tune's own flags (its others are config keys); the record ``tune`` is asked with (``tuning.studies``)."""

    space: str | None = flag(
        None,
        "YAML: key: {type: float|int|categorical, low, high, log, step, choices} per config key",
        shown="FILE",
        required=True,
        waived_by="report_only",
    )
    study: str | None = flag(None, "study name (also the folder under output_path)", shown="NAME", required=True)
    trials: int = flag(10, "trials this process runs (workers sharing a study add theirs up)")
    storage: str | None = flag(
        None,
        "journal:PATH (a file; shared filesystems), sqlite:///PATH or a database URL "
        "such as postgresql://user:password@host/db (default: sqlite in "
        "output_path/NAME/study.db)",
    )
    sampler: str = flag("tpe", "tpe, random, or grid (every key categorical or an int range)")
    sampler_seed: int | None = flag(None, "seed of the sampler (give each worker its own)")
    pruner: str = flag(PrunerSpec.name, "median, hyperband or none; asked after every validation (validate_every)")
    pruner_startup_trials: int = flag(
        PrunerSpec.startup_trials, "median pruner: trials that run to the end before any is pruned"
    )
    pruner_warmup_epochs: int = flag(
        PrunerSpec.warmup_epochs, "median pruner: epochs of each trial that are never pruned"
    )
    final_test: bool = flag(True, "after the last trial, the best trial's best model on the test set, once")
    heartbeat: int = flag(
        60,
        "seconds between liveness beats of a running trial (database storages): a trial silent "
        "for 2 beats is failed and run again from its newest checkpoint by a worker",
    )
    report_only: bool = flag(False, "only print the table and write best_config.yaml and the plots of the study")


BATCH_SIZE, REPORT, DOCTOR, CONFIG = (
    flags_of(BatchSizeFlags),
    flags_of(ReportFlags),
    flags_of(DoctorFlags),
    flags_of(ConfigFlags),
)
EVALUATE, PREDICT, PREPARE_DATA, TUNE = (
    flags_of(EvaluateFlags),
    flags_of(PredictFlags),
    flags_of(PrepareDataFlags),
    flags_of(TuneFlags),
)


def others(given: Mapping[str, Any], *declared: Iterable[Flag]) -> dict[str, Any]:
    """Those of ``given`` that none of ``declared`` names: the config keys."""
    names = {one.name for flags in declared for one in flags}
    return {key: value for key, value in given.items() if key not in names}


def defaults(*declared: Iterable[Flag]) -> dict[str, Any]:
    return {one.name: one.default for flags in declared for one in flags}


def resolve(command: str, given: Mapping[str, Any], *declared: Iterable[Flag]) -> dict[str, Any]:
    """Every declared flag's value: given (a whole number where the default is a float made a float), else its
    default; a flag not declared is refused in one line."""
    declared = tuple(tuple(flags) for flags in declared)
    refuse_unknown(command, given, *declared)
    values = defaults(*declared)
    values.update({key: typed(values[key], value) for key, value in given.items()})
    refuse_missing(command, values, *declared)
    return values


def refuse_missing(command: str, values: Mapping[str, Any], *declared: Iterable[Flag]) -> None:
    """One line naming every required flag without a value (unless the switch that waives it is on)."""
    missing = [
        one
        for flags in declared
        for one in flags
        if one.required and values.get(one.name) is None and not (one.waived_by and values.get(one.waived_by))
    ]
    if missing:
        raise UserError(
            f"{command} needs {' and '.join(f'--{one.name}={one.shown}' for one in missing)} "
            f"(cifar10-dist {command} --help)"
        )


def split(command: str, given: Mapping[str, Any], *declared: Iterable[Flag]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A command that also takes config keys: its own flags resolved (``resolve``), and the rest (the keys)."""
    names = defaults(*declared)
    return resolve(command, {key: value for key, value in given.items() if key in names}, *declared), others(
        given, *declared
    )


def refuse_unknown_keys(
    command: str, given: Mapping[str, Any], *declared: Iterable[Flag], elsewhere: Mapping[str, Iterable[str]] = {}
) -> None:
    """One line for a flag of a command that also takes config keys when it is neither one of its own flags nor a
    config key a user sets: the closest of those the command accepts, its own flags first ("did you mean"), or
    the command that takes it (``elsewhere``: command -> its flags)."""
    from cifar10_dist.config.fields import FIELDS, RENAMED

    own = [one.name for flags in declared for one in flags]
    keys = [name for name, field in FIELDS.items() if not field.metadata["internal"]]
    for key in given:
        if key in own or key in FIELDS or key in RENAMED:
            continue
        close = difflib.get_close_matches(key, own + keys, n=1, cutoff=0.6)
        takers = [other for other, flags in elsewhere.items() if other != command and key in flags]
        if not own and not takers:
            continue  # the config's own check speaks (config.loading: "unknown config key ...")
        hint = (
            f"did you mean --{close[0]}?"
            if close
            else f"{takers[0]} takes it: cifar10-dist {takers[0]} --{key}=..."
            if takers
            else "no flag or key is close"
        )
        takes = f"its flags ({', '.join('--' + name for name in own)}) and " if own else ""
        raise UserError(
            f"{command} does not take --{key} ({hint}): it takes {takes}the config keys (cifar10-dist {command} --help)"
        )


def refuse_unknown(command: str, given: Mapping[str, Any], *declared: Iterable[Flag]) -> None:
    """One line for a flag a command without config keys does not take."""
    names = [one.name for flags in declared for one in flags]
    unknown = [key for key in given if key not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean --{close[0]}?)" if close else ""
        raise UserError(
            f"{command} does not take --{unknown[0]}{hint}: its flags are "
            f"{', '.join('--' + name for name in names)} (cifar10-dist {command} --help)"
        )

"""What ``train``, ``evaluate``, ``export``, ``tune``, ``lr_find``, ``batch_size``, ``doctor``, ``report`` and
``prepare_data`` return: typed results shared by the API, the CLI, notebooks and the
processes that produce them (they travel between processes as JSON). Plain data: no torch here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from cifar10_dist.config import TrialSpec


@dataclass(frozen=True)
class SplitMetrics:
    """Accuracy and mean loss on one split, over ``num_samples`` images; ``model`` names the best-model file
    that the test set was evaluated with (held-out runs only)."""

    accuracy: float
    loss: float
    num_samples: int
    model: Optional[str] = None
    top5_accuracy: Optional[float] = None  # with more than 5 classes
    balanced_accuracy: Optional[float] = None  # the mean of per-class recalls
    macro_f1: Optional[float] = None  # the mean of per-class F1
    ece: Optional[float] = None  # expected calibration error, 15 equal-width bins of the top-1 probability
    temperature: Optional[float] = None  # calibrate=temperature: the T its logits were divided by (None: raw)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> SplitMetrics | None:
        return None if values is None else cls(**values)


@dataclass(frozen=True)
class RunResult:
    """One finished training run (as rank 0 saw it), with its one test evaluation."""

    run_dir: str
    epochs: int
    iterations: int
    test: SplitMetrics
    val: Optional[SplitMetrics] = None
    train: Optional[SplitMetrics] = None
    seed: Optional[int] = None
    stopped_early: Optional[int] = None  # the epoch early stopping ended training at (None: it did not)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunResult:
        return cls(
            run_dir=values["run_dir"],
            epochs=values["epochs"],
            iterations=values["iterations"],
            test=SplitMetrics(**values["test"]),
            val=SplitMetrics.from_dict(values.get("val")),
            train=SplitMetrics.from_dict(values.get("train")),
            seed=values.get("seed"),
            stopped_early=values.get("stopped_early"),
        )


@dataclass(frozen=True)
class TrialResult:
    """A tuning trial's run: chosen on its val split, never tested (``tune`` tests the best trial's model once)."""

    run_dir: str
    epochs: int
    iterations: int
    val: Optional[SplitMetrics] = None  # None where the trial validates on the test split (val_split=0)
    train: Optional[SplitMetrics] = None
    test: Optional[SplitMetrics] = None  # a trial without a val split chooses on the test split
    stopped_early: Optional[int] = None
    pruned_at: Optional[int] = None  # the epoch its pruner ended it at (None: it was not pruned)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrialResult:
        splits = {split: SplitMetrics.from_dict(values.get(split)) for split in ("test", "val", "train")}
        return cls(
            run_dir=values["run_dir"],
            epochs=values["epochs"],
            iterations=values["iterations"],
            stopped_early=values.get("stopped_early"),
            pruned_at=values.get("pruned_at"),
            **splits,
        )


@dataclass(frozen=True)
class SeedsResult:
    """Several runs of one config with seeds seed, seed+1, ...; ``summary`` maps e.g. ``test_accuracy`` to its
    mean, std (sample), min and max; the same is written to ``summary_file``."""

    runs: list[RunResult]
    summary: dict[str, dict[str, float]]
    summary_file: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Mistake:
    """A test image (its index in the test set) the model got wrong, and how sure it was."""

    index: int
    true: str
    predicted: str
    confidence: float


@dataclass(frozen=True)
class EvaluationResult:
    """Test-set metrics of one checkpoint, with per-class accuracy (the recall), precision and F1, their means
    (balanced accuracy, macro-F1) and the confusion matrix (rows: true class, columns: predicted)."""

    accuracy: float
    loss: float
    num_samples: int
    per_class_accuracy: list[float] = field(default_factory=list)
    confusion_matrix: list[list[int]] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)  # names of the rows and columns
    top5_accuracy: Optional[float] = None  # with more than 5 classes
    balanced_accuracy: Optional[float] = None
    macro_f1: Optional[float] = None
    per_class_precision: list[float] = field(default_factory=list)
    per_class_f1: list[float] = field(default_factory=list)
    mistakes: list[Mistake] = field(default_factory=list)  # the most confident, most confident first
    ece: Optional[float] = None  # expected calibration error (15 bins); ``loss`` is the NLL
    reliability: dict[str, list[float]] = field(default_factory=dict)  # per bin: images, confidence, accuracy

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EvaluationResult:
        return cls(**{**values, "mistakes": [Mistake(**mistake) for mistake in values.get("mistakes", [])]})


@dataclass(frozen=True)
class ExportResult:
    """An exported model file, its JSON sidecar, and how it compared with the PyTorch model when loaded back."""

    format: str
    path: str
    sidecar: str
    images: str  # the images the comparison ran on
    max_abs_difference: float  # of the logits: the exported form against the PyTorch model
    same_top1: int  # images whose top-1 class agrees, of num_images
    num_images: int
    relative_difference: float = 0.0  # max_abs_difference / logit_scale (accepted: exporting.RELATIVE_TOLERANCE)
    logit_scale: float = 1.0  # the largest absolute logit of the model on the images (at least 1)
    accepted_relative_difference: float = 0.0  # the export's check: relative_difference at most this
    tensors_equal: Optional[int] = None  # safetensors: tensors read back that are torch.equal to the model's
    quantization: Optional[dict[str, Any]] = None  # int8: how, on how many images, test accuracy and agreement

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LrFindResult:
    """lr-find's sweep (the same on every rank: each iteration's loss is the mean over all ranks) and its
    suggestion for ``learning_rate``, the schedule's peak; each other param group swept at its ratio to it."""

    suggestion: float  # for learning_rate
    rule: str  # how it was chosen: steepest or minimum
    candidates: dict[str, float]  # what each rule suggests
    learning_rates: list[float]  # learning_rate at each iteration of the sweep
    losses: list[float]  # the smoothed loss after each iteration
    stopped: str  # diverged (the loss passed diverge_threshold x its minimum), not finite, or num_iter
    start_lr: float
    end_lr: float
    num_iter: int
    diverge_threshold: float
    group_ratios: list[float]  # each param group's lr over learning_rate during the sweep
    muon_lr: Optional[float] = None  # muon_lr at the same ratio to the suggestion as configured
    warning: Optional[str] = None  # the steepest fall lies next to the loss's minimum: at the edge of divergence
    seconds: float = 0.0
    folder: Optional[str] = None  # where lr_find.json and lr_find.png are

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BatchSpeed:
    """One batch size (per process) measured by the batch-size finder."""

    batch_size: int
    images_per_second: float  # at the median step time
    spread: float  # half the interquartile range of the step times, as a fraction of the median
    steps: int  # timed steps after a warm-up step
    verdict: str  # fastest, slower, or no difference measurable from the fastest


@dataclass(frozen=True)
class BatchSizeResult:
    """What the batch-size finder measured and suggests: a global batch_size (per process x world_size) and
    the learning rate scaled to it by the optimizer's rule."""

    device: str
    model: str
    image_size: int
    world_size: int
    config_batch_size: int
    speeds: list[BatchSpeed]
    batch_size: int  # suggested, global (0: nothing fit)
    reason: str
    learning_rate: Optional[float]
    rule: str
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ProbeResult:
    """Training throughput of the probe model in one setting."""

    setting: str  # e.g. "fp32", "fp32 + channels_last", "bf16 autocast + channels_last"
    images_per_second: float  # at the median step time; 0.0 when not measurable
    steps: int  # timed steps after one warm-up step (fewer than diagnostics.MIN_STEPS: not measurable)
    relative_to_fp32: Optional[float]  # median speed over fp32's; None when either was not measurable
    spread: float = 0.0  # half the interquartile range of the step times, as a fraction of the median
    verdict: str = ""  # against fp32: faster, slower, no difference measurable here, or why not measurable


@dataclass(frozen=True)
class DoctorReport:
    """What ``doctor`` found: versions, the machine, the probe's figures, what with_amp=auto picks, advice."""

    versions: dict[str, str]
    cpu: dict[str, Any]
    gpus: list[dict[str, Any]]
    nccl: str | None
    backends: dict[str, bool]
    device: str  # where the probe ran and a run would train: cuda or cpu
    auto_precision: str  # what with_amp=auto picks on that device, and why
    probe_model: str
    probe_batch_size: int  # the batch probed (smaller than asked when the machine was too slow for it)
    probe_budget_seconds: float
    probes: list[ProbeResult] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    seconds: float = 0.0
    layout_numerics: Optional[str] = None  # on a CPU: channels-last's fp32 error against the contiguous layout's
    scaling: list[str] = field(default_factory=list)  # with a link: the throughput at N nodes (system.scaling)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ReportResult:
    """A comparison of run folders: the table, the time-to-accuracy table (with targets), the plot written, and a
    line for each folder that could not be read in full."""

    table: str
    plot: str
    times: Optional[str] = None
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PreparedData:
    """A dataset made ready in ``folder``: downloaded and checked, or written synthetic."""

    folder: str
    train_images: int
    test_images: int
    synthetic: bool
    official: Optional[bool] = None  # the files' md5 sums match the official release (None: synthetic)
    card: Optional[str] = None  # dataset=folder: classes, counts, sizes, checks, cache (prepare-data prints it)


@dataclass(frozen=True)
class TuneResult:
    """A tuning study after this process's trials (also its tuning_summary.json): trial counts by state, the best
    trial with its val accuracy and values, the plots written, and the final test when it ran."""

    study: str
    study_dir: str
    states: dict[str, int]
    best_trial: Optional[int] = None
    best_value: Optional[float] = None
    best_params: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    final_test: Optional[dict[str, Any]] = None  # trial, checkpoint, accuracy, loss, num_samples, seconds

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BestResult:
    """The best evaluation of a run on the split that chose its best model (val, test, or their EMA's)."""

    split: str
    accuracy: float
    epoch: int
    metric: str = "accuracy"  # the best_metric that chose it
    value: Optional[float] = None  # that metric's value (older summaries: None, the accuracy chose)


@dataclass(frozen=True)
class RunSummary:
    """summary.json of a finished run, written (``to_dict``) and read (``from_dict``) through this one record:
    the best and final numbers, times, where and how it ran, its files; for a tuning trial its trial and the
    epoch it was pruned at. Read from older folders, the fields they lack keep their defaults."""

    run_dir: str
    best: Optional[BestResult] = None
    final: dict[str, SplitMetrics] = field(default_factory=dict)
    epochs: Optional[int] = None
    iterations: Optional[int] = None
    stopped_early: Optional[int] = None
    total_time: Optional[float] = None  # this launch, seconds
    training_time: Optional[float] = None  # the sum of the epoch times
    warm_up_time: Optional[float] = None  # warm_up_steps: the warm-ups' seconds (outside training_time)
    world_size: Optional[int] = None
    world_size_changes: list[dict[str, Any]] = field(default_factory=list)
    backend: Optional[str] = None
    devices: dict[str, int] = field(default_factory=dict)
    precision: Optional[str] = None
    hardware: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[str] = field(default_factory=list)
    best_models: list[str] = field(default_factory=list)
    clearml_offline_folder: Optional[str] = None
    private_memory_mib: list[float] = field(default_factory=list)  # per rank, at the end
    # (memory_use.private_memory_mib)
    data_checks: dict[str, Any] = field(default_factory=dict)  # dataset=folder: what its checks found
    trackers: dict[str, Any] = field(default_factory=dict)  # an outside store that missed something: what and why
    trial: Optional[TrialSpec] = None  # set by tune: study, storage, number, params, pruner
    learning_rate_found: Optional[dict[str, Any]] = None  # learning_rate=find: the suggestion and how it was chosen
    profile: dict[str, Any] = field(default_factory=dict)  # profile=N: the trace and each part's share of the time
    calibration: Optional[dict[str, Any]] = None  # calibrate=temperature: T, val's NLL and ECE before and after
    pruned_at_epoch: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        if self.trial is None:  # only trials carry these two
            del values["trial"], values["pruned_at_epoch"]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunSummary:
        known = {f.name for f in dataclasses.fields(cls)}
        kept = {key: value for key, value in values.items() if key in known and value is not None}
        if "best" in kept:
            kept["best"] = BestResult(**kept["best"])
        if "trial" in kept:
            kept["trial"] = TrialSpec.from_mapping(kept["trial"])
        kept["final"] = {split: SplitMetrics(**metrics) for split, metrics in kept.get("final", {}).items()}
        return cls(**kept)

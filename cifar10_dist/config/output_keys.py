"""What a run evaluates, keeps and says: validation, early stopping, checkpoints and resuming, test-time augmentation,
calibration, logs and trackers. Fields of ``Config`` (``config.fields`` composes them; one flat set of keys for
flags, YAML and the API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from cifar10_dist.config.options import AT_LEAST_0, AT_LEAST_1, Bounds, option


@dataclass(frozen=True)
class OutputKeys:
    """What a run evaluates, keeps and says."""

    validate_every: int = option(
        3,
        "validate every N epochs (and always once at the end)",
        short="validate every N epochs",
        bounds=AT_LEAST_1,
        may_change_on_resume=True,
    )
    early_stopping_patience: Optional[int] = option(
        None,
        "stop after this many validations without a val "
        "best_metric gain above early_stopping_min_delta (needs "
        "val_split > 0)",
        short="validations without gain before a stop",
        bounds=Bounds(1, note=" (or None: off)"),
    )
    early_stopping_min_delta: float = option(
        0.0,
        "smallest val best_metric gain that counts as an improvement",
        short="smallest gain that counts",
        bounds=AT_LEAST_0,
    )
    best_metric: Literal["accuracy", "balanced_accuracy", "macro_f1"] = option(
        "accuracy",
        "what chooses the best model, drives early stopping and ranks tuning trials: accuracy, "
        "balanced_accuracy (the mean of per-class recalls) or macro_f1 (the mean of per-class F1)",
        short="what chooses the best model",
    )
    tta: Literal[0, 1, 2] = option(
        0,
        "test-time augmentation of val/test evaluations: 0 none, 1 mirror, 2 mirror and 1-pixel shifts (6 views)",
        short="test-time augmentation: 0, 1 or 2",
        choices_in_words="0 (none), 1 (mirror) or 2 (mirror + shifts)",
        inherited_by_evaluate=True,
        may_change_on_resume=True,  # (evaluation only: training goes on the same)
    )
    calibrate: Optional[Literal["temperature"]] = option(
        None,
        "temperature: after training, fit one temperature on the validation split (never the test set: needs "
        "val_split or a val/ folder) so that softmax(logits / T) are calibrated probabilities; stored with the "
        "model, used by evaluate, predict and export",
        short="fit a temperature on the val split",
        choices_in_words="temperature (or leave it unset)",
        tunable=False,
        may_change_on_resume=True,  # (evaluation only: training goes on the same)
    )
    checkpoint_every: int = option(
        200,
        "save a training checkpoint every N iterations (the last 2 are kept)",
        short="checkpoint every N iterations",
        bounds=AT_LEAST_1,
        may_change_on_resume=True,
    )
    checkpoint_in_background: bool = option(
        True,
        "write training checkpoints on a thread of their own: training "
        "waits for a copy of the state in host memory, not for the disk (a "
        "tracker that uploads checkpoints, ClearML, writes inline)",
        short="write checkpoints on a thread",
        tunable=False,
        may_change_on_resume=True,
    )
    figures: bool = option(
        True,
        "draw the run's figures at its end: curves.png, mistakes.png and calibration.png, and their images in "
        "TensorBoard, and a study's plots for tune (False: their .json files only, for many short runs, where "
        "drawing costs more than training)",
        short="draw the run's figures",
        tunable=False,
        may_change_on_resume=True,
    )
    log_every_iters: int = option(
        15,
        "log the training loss every N iterations",
        short="log the loss every N iterations",
        bounds=AT_LEAST_1,
        may_change_on_resume=True,
    )
    output_path: str = option(
        "output-cifar10/",
        "parent folder of run folders",
        short="parent folder of run folders",
        tunable=False,
        may_change_on_resume=True,
    )
    run_name: Optional[str] = option(
        None,
        "run folder name under output_path (default: model_backend-B-N_time)",
        short="run folder name",
        tunable=False,
        may_change_on_resume=True,
    )
    resume_from: Optional[str] = option(
        None,
        "training checkpoint to resume from, or auto: the newest in the run folder",
        short="checkpoint to resume from, or auto",
        tunable=False,
        may_change_on_resume=True,
    )
    resume_on_changed_data: bool = option(
        False,
        "resume even when the data is not what the checkpoint was made with "
        "(another checksum): the run goes on, no longer the same run; recorded in "
        "provenance",
        short="resume even on changed data",
        tunable=False,
        may_change_on_resume=True,
    )
    overwrite: bool = option(
        False,
        "start afresh in a run folder that holds a run: the old folder is moved aside to "
        "NAME.replaced-<time>, never deleted",
        short="start afresh; the old folder moves aside",
        tunable=False,
        may_change_on_resume=True,
    )
    with_clearml: bool = option(
        False,
        "track the run with ClearML (pip install cifar10-dist[clearml])",
        short="track with ClearML",
        per_tuning_worker=True,
    )
    clearml_project: str = option(
        "cifar10_dist",
        "ClearML project name (the task is named after the run folder)",
        short="ClearML project",
        per_tuning_worker=True,
    )
    clearml_offline: bool = option(
        False,
        "ClearML without a server: record the session locally for a later import",
        short="ClearML without a server",
        per_tuning_worker=True,
    )
    with_mlflow: bool = option(
        False,
        "track the run with MLflow (pip install cifar10-dist[mlflow]): config, "
        "metrics, provenance tags, artifacts; a resume continues the same MLflow run",
        short="track with MLflow",
        per_tuning_worker=True,
    )
    mlflow_tracking_uri: Optional[str] = option(
        None,
        "MLflow store: any URI MLflow accepts (default: MLFLOW_TRACKING_URI, else sqlite:///output_path/mlflow.db)",
        short="MLflow store",
        per_tuning_worker=True,
    )
    mlflow_experiment: str = option(
        "cifar10_dist",
        "MLflow experiment name (the run is named after the run folder)",
        short="MLflow experiment",
        per_tuning_worker=True,
    )
    mlflow_log_model: bool = option(
        False,
        "with_mlflow: also store the best model file as an MLflow artifact",
        short="store the best model in MLflow",
        per_tuning_worker=True,
    )
    with_wandb: bool = option(
        False,
        "track the run with Weights & Biases (pip install cifar10-dist[wandb]): config, "
        "metrics, provenance, the run's files; a resume continues the same W&B run",
        short="track with Weights & Biases",
        per_tuning_worker=True,
    )
    wandb_project: str = option(
        "cifar10_dist",
        "W&B project (the run is named after the run folder)",
        short="W&B project",
        per_tuning_worker=True,
    )
    wandb_entity: Optional[str] = option(
        None, "W&B entity, a user or team (default: W&B's own)", short="W&B user or team", per_tuning_worker=True
    )
    wandb_mode: Optional[Literal["online", "offline", "disabled"]] = option(
        None,
        "W&B mode: online, offline (kept in the run folder for wandb sync) or disabled (default: online when "
        "WANDB_API_KEY is set, else offline)",
        short="W&B: online, offline or disabled",
        choices_in_words="online, offline or disabled (or leave it unset)",
        per_tuning_worker=True,
    )
    wandb_log_model: bool = option(
        False,
        "with_wandb: also store the best model file as a W&B artifact",
        short="store the best model in W&B",
        per_tuning_worker=True,
    )
    profile: int = option(
        0,
        "profile N training iterations (after 5 of warm-up) with torch.profiler: a trace for "
        "TensorBoard or Perfetto in RUN/profile/, the top operators and each handler's share of the "
        "time in the log (0: off)",
        short="profile N iterations (0: off)",
        bounds=Bounds(0, in_words="0 (off) or more"),
        tunable=False,
        may_change_on_resume=True,
    )

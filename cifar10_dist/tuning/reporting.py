"""How a study is shown: one line per finished trial, the table of all trials (best first), Optuna's plots."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from cifar10_dist.errors import first_line
from cifar10_dist.outputs import files

logger = logging.getLogger("cifar10_dist")


PLOTS = ("optimization_history", "param_importances", "parallel_coordinate")


def format_params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{name}={_short(value)}" for name, value in params.items())


INTERRUPTED = "interrupted"  # a trial's user attribute: stopped by Ctrl-C or preemption, and queued again


def state_name(trial: Any) -> str:
    """Optuna's state of a trial, but INTERRUPTED for one stopped by Ctrl-C or preemption (Optuna fails it; a
    later trial continues it from its checkpoint): it is no failure of its values."""
    return "INTERRUPTED" if trial.user_attrs.get(INTERRUPTED) else trial.state.name


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_trial_line(trial: Any) -> str:
    from optuna.trial import TrialState

    value = "" if trial.value is None else f" value {trial.value:.4f}"
    pruned = f" at epoch {trial.last_step}" if trial.state == TrialState.PRUNED and trial.last_step is not None else ""
    reason = f": {trial.user_attrs['fail_reason']}" if "fail_reason" in trial.user_attrs else ""
    return (
        f"trial {trial.number}: {state_name(trial)}{pruned}{value} ({_minutes(trial):.1f} min) "
        f"{format_params(trial.params)}{reason}"
    )


def _minutes(trial: Any) -> float:
    if trial.datetime_start is None:
        return 0.0
    end = trial.datetime_complete
    seconds = (end - trial.datetime_start).total_seconds() if end else 0.0
    return seconds / 60


def trial_table(trials: list[Any]) -> str:
    """Trials sorted by value (best first; pruned and failed after), one line each."""
    from optuna.trial import TrialState

    ranked = sorted(
        trials, key=lambda t: (t.value is None or t.state != TrialState.COMPLETE, -(t.value or 0.0), t.number)
    )
    names = sorted({name for trial in trials for name in trial.params})
    header = f"{'trial':>5}  {'state':<11}{'value':>8}  {'epochs':>6}  {'minutes':>7}  " + "  ".join(names)
    lines = [header]
    for trial in ranked:
        value = f"{trial.value:.4f}" if trial.value is not None else "-"
        epochs = str(trial.last_step) if trial.last_step is not None else "-"
        params = "  ".join(f"{_short(trial.params.get(name, '-')):>{len(name)}}" for name in names)
        lines.append(
            f"{trial.number:>5}  {state_name(trial):<11}{value:>8}  {epochs:>6}  {_minutes(trial):>7.1f}  {params}"
        )
    return "\n".join(lines)


def write_plots(study: Any, study_dir: Path) -> list[str]:
    """Optuna's matplotlib plots as PNG (those it can draw with the trials so far)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as plots

    written = []
    for name in PLOTS:
        try:
            axes = getattr(plots, f"plot_{name}")(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as reason:  # too few trials for this plot
            logger.info("no %s plot yet: %s", name, first_line(reason))
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.set_size_inches(9, 5)
        figure.tight_layout()
        path = study_dir / f"{name}.png"
        files.write_file(path, lambda target: figure.savefig(target, format="png", dpi=100))
        plt.close(figure)
        written.append(str(path))
    return written

"""Temperature scaling (``calibrate=temperature``, Guo et al. 2017): after training, one temperature T > 0 is
fitted to the model chosen on the validation split, on that split's logits, by minimising their NLL (LBFGS on
log T); softmax(logits / T) are then its probabilities. The predicted classes do not change, only how sure the
model says it is. T is written beside the weights it was fitted to only (key ``temperature``): the chosen
best-model file, and the newest training checkpoint when it holds those weights (``checkpoint_layout``); evaluate,
predict and export read it (``models.viewing.TemperatureScaled``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from torch import nn

from cifar10_dist import checkpoint_layout
from cifar10_dist.errors import UserError
from cifar10_dist.models.viewing import TemperatureScaled
from cifar10_dist.outputs import checkpoint_files, files
from cifar10_dist.system import ranks
from cifar10_dist.training.loop.evaluators import CalibrationBins, expected_calibration_error

logger = logging.getLogger("cifar10_dist")


def scaled_test_model(calibrate: str | None, split: str, forward: nn.Module) -> TemperatureScaled | None:
    """With ``calibrate``, the model the test evaluation runs (T = 1 until it is fitted); refused in one line
    when the run has no validation split to fit it on (a folder without val/ and val_split=0)."""
    if calibrate is None:
        return None
    if split != "val":
        raise UserError(
            f"calibrate={calibrate} fits the temperature on a validation split, never on the test set, "
            "and this run has none: give val_split > 0 (e.g. --val_split=0.1) or a val/ folder"
        )
    return TemperatureScaled(forward, 1.0)


def with_temperature(model: nn.Module, checkpoint: dict[str, Any]) -> nn.Module:
    """The model as its checkpoint says it should be read: scaled by its temperature when it has one."""
    temperature = checkpoint_layout.temperature(checkpoint)
    return TemperatureScaled(model, temperature) if temperature is not None else model


def fit_temperature(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The T minimising the NLL of softmax(logits / T) over these logits (float64 LBFGS on log T, from T = 1)."""
    logits, targets = logits.double().cpu(), targets.cpu()
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(logits / log_t.exp(), targets)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_t.detach().exp())


class LogitsKept:
    """The logits and targets of an evaluator's next run, from every process (gathered, padded to the longest)."""

    def __init__(self, evaluator: Engine) -> None:
        self.parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.handle = evaluator.add_event_handler(Events.ITERATION_COMPLETED, self.keep)

    def keep(self, engine: Engine) -> None:
        logits, targets = engine.state.output  # type: ignore[misc]  # (Ignite types it as an int)
        self.parts.append((logits.detach().float(), targets))

    def gathered(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.handle.remove()
        logits = torch.cat([part[0] for part in self.parts])
        targets = torch.cat([part[1] for part in self.parts])
        count = torch.tensor([len(targets)], device=logits.device)
        longest = int(torch.as_tensor(idist.all_reduce(count.clone(), op="MAX")).item())
        padded = torch.cat(
            [
                torch.cat([logits, targets[:, None].float()], dim=1),
                torch.full((longest - len(targets), logits.shape[1] + 1), -1.0, device=logits.device),
            ]
        )
        rows = torch.as_tensor(idist.all_gather(padded)).cpu()
        rows = rows[rows[:, -1] >= 0]
        return rows[:, :-1], rows[:, -1].long()


def calibrate(evaluator: Engine, loader: Any, run_dir: Path, chosen: str) -> dict[str, Any]:
    """Fit T on the logits ``evaluator`` gives on ``loader`` (the validation split, the chosen model: the
    best-model file named ``chosen``, or "final"), write it beside those weights only (rank 0), and return what was
    found: T and the split's NLL and ECE before and after (the same on every rank)."""
    kept = LogitsKept(evaluator)
    evaluator.run(loader)
    logits, targets = kept.gathered()
    temperature = fit_temperature(logits, targets)
    found = {"temperature": temperature, "images": len(targets)}
    for when, scale in (("before", 1.0), ("after", temperature)):
        scaled = logits.double() / scale
        bins = CalibrationBins()
        bins.update((scaled, targets))
        found[f"val_nll_{when}"] = float(nn.functional.cross_entropy(scaled, targets))
        found[f"val_ece_{when}"] = expected_calibration_error(bins.compute())
    stored = ranks.on_rank_zero(store_temperature, run_dir, temperature, chosen)
    ranks.on_rank_zero(
        logger.info,
        "calibrate=temperature: T %.4f fitted on %d val images: NLL %.4f -> %.4f, ECE "
        "%.4f -> %.4f; stored with the model it was fitted to: %s",
        temperature,
        found["images"],
        found["val_nll_before"],
        found["val_nll_after"],
        found["val_ece_before"],
        found["val_ece_after"],
        ", ".join(stored or []) or "no file holds it",
    )
    return found


def store_temperature(run_dir: Path, temperature: float, chosen: str) -> list[str]:
    """Rank 0: T added to the files that hold the weights it was fitted to, each rewritten whole (a temporary
    file, then a rename): the chosen best-model file, and the newest training checkpoint where the weights it is
    read with (its EMA's, where it has one) are those; with no best-model file ("final"), the newest checkpoint.
    Other best-model files, of other epochs' models, are left alone. Returns the names of the files written."""
    best = run_dir / chosen if chosen != "final" else None
    newest = checkpoint_files.newest_valid_checkpoint(run_dir)
    fitted = checkpoint_files.load_checkpoint(best) if best is not None else None
    written = []
    for path in [best, newest]:
        if path is None or path.name in written:
            continue
        checkpoint = checkpoint_files.load_checkpoint(path)
        if fitted is not None and path != best and not holds_the_same_model(checkpoint, fitted):
            continue  # the newest checkpoint holds a later model than the one chosen on val
        checkpoint = checkpoint_layout.with_temperature(checkpoint, temperature)
        files.write_file(path, lambda target: torch.save(checkpoint, target))
        written.append(path.name)
    return written


def holds_the_same_model(checkpoint: dict[str, Any], best: dict[str, Any]) -> bool:
    """Whether a training checkpoint holds the model of a best-model file: written at the iteration the best
    model's PROGRESS records (weights change only at iterations), or, for files from before it was recorded,
    the same tensors as the best model's (the EMA's, where the checkpoint has one)."""
    chosen_at = checkpoint_layout.progress(best)
    if chosen_at is not None:
        return checkpoint_layout.iteration(checkpoint) == chosen_at["iteration"]
    return same_weights(
        checkpoint_layout.model_weights(checkpoint, prefer_ema=True), checkpoint_layout.model_weights(best)
    )


def same_weights(one: Any, other: Any) -> bool:
    return one.keys() == other.keys() and all(torch.equal(one[key], other[key]) for key in one)

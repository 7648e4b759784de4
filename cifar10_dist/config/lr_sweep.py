"""lr-find's sweep as plain data (``LrSweep``): its range, length, stop and how the suggestion is chosen,
checked before torch is imported. Its fields are lr-find's flags (``config.commands``): the CLI, the API and the
help page read them here, with ``OUTPUT_DIR``."""

from __future__ import annotations

from dataclasses import dataclass

from cifar10_dist.config.commands import flag, flags_of
from cifar10_dist.errors import UserError

SUGGESTION_RULES = {
    "steepest": "where the smoothed loss falls fastest, before its minimum (Ignite's lr_suggestion)",
    "minimum": "a tenth of where the smoothed loss is lowest",
}
MAX_ITERATIONS = 1000


@dataclass(frozen=True)
class LrFindOutput:
    """Where lr-find writes (its flag beside the sweep's)."""

    output_dir: str | None = flag(None, "where lr_find.png and .json go (default: a new output_path/lr_find-<time>)")


(OUTPUT_DIR,) = flags_of(LrFindOutput)


@dataclass(frozen=True)
class LrSweep:
    """learning_rate from ``start_lr`` to ``end_lr`` on a log scale over ``num_iter`` iterations at most, stopped
    when the smoothed loss passes ``diverge_threshold`` times its lowest; ``rule`` chooses the suggestion."""

    start_lr: float = flag(1e-6, "the sweep's lowest learning_rate")
    end_lr: float = flag(1.0, "its highest")
    num_iter: int = flag(100, f"iterations at most (5..{MAX_ITERATIONS})")
    diverge_threshold: float = flag(5.0, "stop when the smoothed loss passes this many times its lowest")
    rule: str = flag("steepest", "; ".join(f"{name}: {meaning}" for name, meaning in SUGGESTION_RULES.items()))
    smoothing: float = flag(
        0.05,
        "how much of each iteration's loss the smoothed loss takes (the rest from the point "
        "before: Ignite's smooth_f); higher follows a noisy loss more closely",
    )

    def check(self) -> None:
        for name in ("start_lr", "end_lr", "diverge_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UserError(f"{name}={value!r} must be a number, e.g. --{name}={getattr(LrSweep, name)}")
        if not 0 < self.start_lr < self.end_lr:
            raise UserError(
                f"start_lr={self.start_lr} and end_lr={self.end_lr}: the sweep needs 0 < start_lr < "
                "end_lr, "
                "e.g. --start_lr=1e-6 --end_lr=1"
            )
        if (
            isinstance(self.num_iter, bool)
            or not isinstance(self.num_iter, int)
            or not 5 <= self.num_iter <= MAX_ITERATIONS
        ):
            raise UserError(
                f"num_iter={self.num_iter!r} must be a whole number in 5..{MAX_ITERATIONS} (iterations of the sweep)"
            )
        if not self.diverge_threshold > 1:
            raise UserError(
                f"diverge_threshold={self.diverge_threshold} must be greater than 1 (the sweep stops when "
                "the smoothed loss passes this many times its lowest)"
            )
        if (
            isinstance(self.smoothing, bool)
            or not isinstance(self.smoothing, (int, float))
            or not 0 < self.smoothing < 1
        ):
            raise UserError(
                f"smoothing={self.smoothing!r} must be in (0, 1), e.g. 0.05 (the share of each "
                "iteration's loss in the smoothed loss)"
            )
        if self.rule not in SUGGESTION_RULES:
            raise UserError(f"rule='{self.rule}' is unknown: choose {' or '.join(SUGGESTION_RULES)}")

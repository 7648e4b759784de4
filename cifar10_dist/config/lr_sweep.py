"""lr-find's sweep as plain data (``LrSweep``): its range, length, stop and how the suggestion is chosen,
checked before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass

from cifar10_dist.errors import UserError

SUGGESTION_RULES = {
    "steepest": "where the smoothed loss falls fastest, before its minimum (Ignite's lr_suggestion)",
    "minimum": "a tenth of where the smoothed loss is lowest",
}
MAX_ITERATIONS = 1000


@dataclass(frozen=True)
class LrSweep:
    """learning_rate from ``start_lr`` to ``end_lr`` on a log scale over ``num_iter`` iterations at most, stopped
    when the smoothed loss passes ``diverge_threshold`` times its lowest; ``rule`` chooses the suggestion."""

    start_lr: float = 1e-6
    end_lr: float = 1.0
    num_iter: int = 100
    diverge_threshold: float = 5.0
    smoothing: float = 0.05  # each point: 0.05 of this iteration's loss, 0.95 of the previous point (Ignite's)
    rule: str = "steepest"

    def check(self) -> None:
        if not 0 < self.start_lr < self.end_lr:
            raise UserError(f"start_lr={self.start_lr} and end_lr={self.end_lr}: the sweep needs 0 < start_lr < end_lr, "
                            "e.g. --start_lr=1e-6 --end_lr=1")
        if isinstance(self.num_iter, bool) or not isinstance(self.num_iter, int) or not 5 <= self.num_iter <= MAX_ITERATIONS:
            raise UserError(f"num_iter={self.num_iter!r} must be a whole number in 5..{MAX_ITERATIONS} (iterations of "
                            "the sweep)")
        if not self.diverge_threshold > 1:
            raise UserError(f"diverge_threshold={self.diverge_threshold} must be greater than 1 (the sweep stops when "
                            "the smoothed loss passes this many times its lowest)")
        if self.rule not in SUGGESTION_RULES:
            raise UserError(f"rule='{self.rule}' is unknown: choose {' or '.join(SUGGESTION_RULES)}")

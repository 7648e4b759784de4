"""How a config field is declared: ``option`` (its default, one-line help, own rules and roles) and ``Bounds``
(a number's accepted range). ``fields`` declares every key with them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Bounds:
    """A number field's accepted range, declared with the field: ``low``/``high`` (either may be None), each
    included unless ``*_open``. ``in_words`` replaces how the rule reads in the error ("in 0..16 pixels"); ``note``
    follows it (", e.g. 0.999")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    in_words: str | None = None
    note: str = ""

    def accepts(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self, whole: bool) -> str:
        """'at least 1', '0 or more', 'greater than 0', 'in [0, 1)', 'in 1..20' (whole numbers), plus the note."""
        if self.in_words is not None:
            text = self.in_words
        elif self.high is None:
            text = (
                f"greater than {self.low:g}"
                if self.low_open
                else "0 or more"
                if self.low == 0
                else f"at least {self.low:g}"
            )
        elif whole:
            text = f"in {self.low:g}..{self.high:g}"
        else:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        return text + self.note


AT_LEAST_1, AT_LEAST_0, ABOVE_0 = Bounds(1), Bounds(0), Bounds(0, low_open=True)
FRACTION = Bounds(0, 1, high_open=True)  # [0, 1)


def option(
    default: Any,
    help: str,
    short: str = "",
    also_accepts: tuple[str, ...] = (),
    bounds: Bounds | None = None,
    choices_in_words: str | None = None,
    internal: bool = False,
    tunable: bool = True,
    per_tuning_worker: bool = False,
    inherited_by_evaluate: bool = False,
    may_change_on_resume: bool = False,
    only_with: tuple[str, str] | None = None,
    compare: bool = True,
) -> Any:
    """A config field with its help text, its own rules and its roles.

    Help: ``short``, the few words of its --help line; ``help``, the whole story (--help=KEY, docs/configuration.md).
    Rules: ``bounds`` for a number; the ``Literal`` annotation's choices for a word (``choices_in_words``: how they
    read in the error); ``also_accepts``: words accepted besides the field's type.
    Roles: ``internal``, set by the tool itself (left out of --help and the docs, never tuned); ``tunable=False``,
    never searched by ``tune`` (a command sets it for its runs, or it decides the data every trial must share);
    ``per_tuning_worker``, each tuning worker sets it for its own machine (not compared with the study's, never
    tuned); ``inherited_by_evaluate``, ``evaluate`` takes it from the checkpoint unless given;
    ``may_change_on_resume``, a resume may give it another value than the checkpoint's run had (it says how the run
    is kept, logged or made fast, not what it trains; every ``per_tuning_worker`` key may too); ``only_with=(KEY,
    VALUE)``, it takes effect only where KEY has VALUE (a resume compares it only there); ``compare=False``, a
    record of where the values came from, left out when two configs are compared. The lists of keys by role
    (``UNTUNABLE``, ``PER_TUNING_WORKER``, ``INHERITED_BY_EVALUATE``, ``MAY_CHANGE_ON_RESUME``, ``ONLY_WITH``) are
    derived from these, below the class."""
    return field(
        default=default,
        compare=compare,
        metadata={
            "help": help,
            "short": short or help,
            "also_accepts": also_accepts,
            "bounds": bounds,
            "choices_in_words": choices_in_words,
            "internal": internal,
            "tunable": tunable,
            "per_tuning_worker": per_tuning_worker,
            "inherited_by_evaluate": inherited_by_evaluate,
            "may_change_on_resume": may_change_on_resume,
            "only_with": only_with,
        },
    )

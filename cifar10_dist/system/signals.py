"""Which signals stop a run: Ctrl-C, and the preemption signals (SIGTERM and SIGUSR1, or those
``CIFAR10_DIST_PREEMPTION_SIGNALS`` names). Without torch: the launcher reads them before it imports it."""

from __future__ import annotations

import os
import signal

from cifar10_dist.errors import UserError

PREEMPTION_SIGNALS_VARIABLE = "CIFAR10_DIST_PREEMPTION_SIGNALS"  # e.g. SIGUSR2 or SIGTERM,SIGUSR2
DEFAULT_PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1")
NOT_FOR_PREEMPTION = ("SIGINT", "SIGKILL", "SIGSTOP", "SIGCHLD", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")


def preemption_signals() -> tuple[str, ...]:
    """The signals that mean "checkpoint and stop, to be continued" (a cluster's preemption or time-limit
    warning): SIGTERM and SIGUSR1 unless CIFAR10_DIST_PREEMPTION_SIGNALS names others (comma-separated)."""
    text = os.environ.get(PREEMPTION_SIGNALS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_PREEMPTION_SIGNALS
    names = tuple(
        name if name.startswith("SIG") else f"SIG{name}"
        for name in (part.strip().upper() for part in text.split(","))
        if name
    )
    for name in names:
        if name not in signal.Signals.__members__ or name in NOT_FOR_PREEMPTION:
            raise UserError(
                f"{PREEMPTION_SIGNALS_VARIABLE}='{text}': {name} cannot announce a preemption; give "
                "signal names such as SIGTERM, SIGUSR1, SIGUSR2, SIGHUP (comma-separated)"
            )
    return names


def stop_signals() -> tuple[signal.Signals, ...]:
    """Ctrl-C and the preemption signals: what a run handles (and a launcher passes on to its workers)."""
    return (signal.SIGINT, *(signal.Signals[name] for name in preemption_signals()))

"""Stopping safely: Ctrl-C and preemption signals, NaN loss, all processes agreeing at an iteration boundary;
outputs that cannot be written; peers that stop answering.

A signal handler only sets a flag. After every iteration all processes agree on two flags (a preemption signal
arrived somewhere; a Ctrl-C arrived somewhere), and at log, checkpoint and epoch-end iterations on a third (the
loss became NaN/inf somewhere since the last such check), so they all take the same decision at the same
iteration: on a stop request, write a checkpoint and raise Interrupted (Ctrl-C) or Preempted (SIGTERM/SIGUSR1, or
the signals CIFAR10_DIST_PREEMPTION_SIGNALS names); on NaN/inf, raise TrainingDiverged before any checkpoint of the
broken state is written. A second Ctrl-C does not wait: the process at the top (the launcher, or a single process)
ends at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import signal
import socket
from pathlib import Path
from typing import Any, Callable

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from cifar10_dist.errors import Interrupted, PeerLost, PeerSilent, Preempted, TrainingDiverged, resume_hint
from cifar10_dist.system.signals import preemption_signals, stop_signals

logger = logging.getLogger(__name__)


class StopRequest:
    """Records Ctrl-C (SIGINT) and the preemption signals (SIGTERM/SIGUSR1 by default); optionally passes each on to
    other processes (spawned workers). A second Ctrl-C calls ``on_second_interrupt`` (when given; a worker leaves that
    to its launcher)."""

    def __init__(
        self, forward_to: Callable[[], list[int]] | None = None, on_second_interrupt: Callable[[], None] | None = None
    ) -> None:
        self.received: list[str] = []
        self.forward_to = forward_to
        self.on_second_interrupt = on_second_interrupt
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handle the stop signals from now on (the handlers they had are kept for ``uninstall``); a stop signal
        that arrived while they were blocked (a spawned worker starting up) is handled now."""
        handled = stop_signals()
        self.previous = {stop_signal: signal.signal(stop_signal, self._handle) for stop_signal in handled}
        signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)

    def uninstall(self) -> None:
        """Give the stop signals back the handlers they had before ``install``."""
        for stop_signal, handler in self.previous.items():
            signal.signal(stop_signal, handler)
        self.previous = {}

    def __enter__(self) -> StopRequest:
        self.install()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        repeated = name == "SIGINT" and self.interrupted
        self.received.append(name)
        for pid in self.forward_to() if self.forward_to else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if repeated and self.on_second_interrupt is not None:
            self.on_second_interrupt()

    @property
    def interrupted(self) -> bool:
        return "SIGINT" in self.received

    @property
    def preempted(self) -> bool:
        return any(name in preemption_signals() for name in self.received)

    @property
    def signal_name(self) -> str | None:
        return self.received[0] if self.received else None


class LossWatch:
    """The training losses since the last read, kept as tensors on their device: appending costs no host-device
    synchronisation; ``first_non_finite`` reads them all at once (one synchronisation) and forgets them."""

    def __init__(self) -> None:
        self.pending: list[torch.Tensor] = []
        self.first_iteration = 0

    def add(self, loss: torch.Tensor, iteration: int) -> None:
        if not self.pending:
            self.first_iteration = iteration
        self.pending.append(loss)

    def first_non_finite(self) -> tuple[int, float] | None:
        """(iteration, loss) of the first NaN/inf loss since the last call, or None."""
        if not self.pending:
            return None
        losses, self.pending = torch.stack([torch.as_tensor(loss) for loss in self.pending]), []
        bad = ~torch.isfinite(losses)
        if not bool(bad.any()):
            return None
        index = int(bad.nonzero()[0, 0])
        return self.first_iteration + index, float(losses[index])


def attach_stop_checks(
    trainer: Engine,
    stop: StopRequest,
    save_checkpoint: Callable[[Engine], None],
    run_dir: Path,
    step_every: int = 1,
    reads_at: Callable[[int], bool] = lambda _: True,
) -> None:
    """After each iteration: agree on Ctrl-C and preemption across processes, and on NaN where ``reads_at`` the
    iteration (log, checkpoint and epoch-end iterations) or before a stop's checkpoint, then act on them; a stop
    waits for the next optimizer step (every ``step_every`` iterations), so that no accumulated gradient is lost.

    No iteration reads the device otherwise: the losses wait on it (``LossWatch``), and the stop requests, which
    live on the host, are agreed every iteration by one process alone or by CPU processes (gloo), and by
    processes on accelerators at the iterations that read anyway. Attach before the checkpoint handlers, so
    that a NaN iteration is never saved.
    """
    device = idist.device()
    agrees_every_iteration = idist.get_world_size() == 1 or device.type == "cpu"
    watch = LossWatch()

    @trainer.on(Events.ITERATION_COMPLETED)
    def check(engine: Engine) -> None:
        iteration, epoch = engine.state.iteration, engine.state.epoch
        watch.add(engine.state.output.loss, iteration)  # type: ignore[union-attr]  # (a StepOutput)
        reading = reads_at(iteration)
        if not (reading or agrees_every_iteration):
            return
        preempted, interrupted = agree(stop.preempted, stop.interrupted)
        if reading or preempted or interrupted:
            raise_if_diverged(watch, iteration, epoch)
        if iteration % step_every:
            return  # mid-accumulation: stop after the optimizer step
        if interrupted:
            save_checkpoint(engine)
            checkpoint = run_dir / f"training_checkpoint_{iteration}.pt"
            raise Interrupted(
                f"interrupted at epoch {epoch}, iteration {iteration}: checkpoint {checkpoint} written; "
                f"continue with {resume_hint(run_dir.name)}",
                str(checkpoint),
            )
        if preempted:
            save_checkpoint(engine)
            raise Preempted(
                f"stopped at iteration {iteration} on {stop.signal_name or 'a signal to another process'}: "
                f"checkpoint {run_dir / f'training_checkpoint_{iteration}.pt'} written; continue with "
                f"{resume_hint(run_dir.name)}"
            )


def attach_stop_without_checkpoint(engine: Engine, stop: StopRequest, command: str) -> None:
    """For a command that writes no checkpoint (lr-find, evaluate): after each iteration, agree on Ctrl-C and
    preemption across processes and end every process with one line that fits it (exit 130 or 75): nothing was
    written, run it again."""

    @engine.on(Events.ITERATION_COMPLETED)
    def check(running: Engine) -> None:
        preempted, interrupted = agree(stop.preempted, stop.interrupted)
        where = f"at iteration {running.state.iteration}: nothing written; run the same command again"
        if interrupted:
            raise Interrupted(f"{command} interrupted {where}")
        if preempted:
            raise Preempted(f"{command} stopped on {stop.signal_name or 'a signal to another process'} {where}")


def agree(*flags: bool) -> list[bool]:
    """Each flag, true when it is true on any process (one all-reduce; none in a single process)."""
    if idist.get_world_size() == 1:
        return list(flags)
    summed = idist.all_reduce(torch.tensor([float(flag) for flag in flags], device=idist.device()))
    return [value > 0 for value in torch.as_tensor(summed).tolist()]


def raise_if_diverged(watch: LossWatch, iteration: int, epoch: int) -> None:
    """TrainingDiverged on every process when the loss became NaN/inf on any since the last read."""
    found = watch.first_non_finite()
    (diverged,) = agree(found is not None)
    if diverged:
        where = f"{found[1]} at iteration {found[0]}" if found else "NaN/inf"
        raise TrainingDiverged(
            f"training stopped at iteration {iteration} (epoch {epoch}): the loss became {where} on at least one "
            "process; the checkpoints on disk are from before it (try a lower learning_rate)"
        )


def finite_weights_only(save: Callable[[Engine], None], model: torch.nn.Module) -> Callable[[Engine], None]:
    """Wrap a checkpoint handler so that it never writes NaN/inf parameters (keeps the last good file)."""

    def save_if_finite(engine: Engine) -> None:
        if not all(bool(torch.isfinite(parameter).all()) for parameter in model.parameters()):
            raise TrainingDiverged(
                f"training stopped at iteration {engine.state.iteration} (epoch {engine.state.epoch}): the weights "
                "became NaN/inf; the checkpoints on disk are from before it (try a lower learning_rate)"
            )
        save(engine)

    return save_if_finite


# ---------------------------------------------------------------- peers that stop answering or go away

PEERS: list[str] = []  # each rank's host and the address it reaches node 0 from ('vm 10.77.0.2'), once it joined


def note_peers(master_addr: str | None) -> None:
    """Gather every rank's host name and address once the process group is formed (one collective), so that an
    error about a process of another node can say which node that is."""
    PEERS.clear()
    if idist.get_world_size() > 1:
        gathered = idist.all_gather(f"{platform.node()} {_outward_address(master_addr)}")
        PEERS.extend(str(peer) for peer in gathered)  # type: ignore[union-attr]  # (a list of str)


def _outward_address(master_addr: str | None) -> str:
    """The address this host reaches node 0 from (a UDP socket's, connected but never sent on)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr or "127.0.0.1", 9))
            return str(probe.getsockname()[0])
    except OSError:
        return "an unknown address"


def other_nodes(rank: int) -> str:
    """The ranks of the other nodes and where they are: 'rank 1 on vm at 10.77.0.2' ('' where not known)."""
    if rank >= len(PEERS):
        return ""
    by_node: dict[str, list[int]] = {}
    for other, peer in enumerate(PEERS):
        if peer != PEERS[rank]:
            by_node.setdefault(peer, []).append(other)
    return "; ".join(
        f"{'rank' if len(found) == 1 else 'ranks'} {', '.join(map(str, found))} on {peer.replace(' ', ' at ', 1)}"
        for peer, found in by_node.items()
    )


def is_collective_timeout(error: BaseException) -> bool:
    """Whether an exception is a gloo/nccl collective that gave up waiting for another process."""
    return isinstance(error, RuntimeError) and re.search(r"timed out|timeout", str(error), re.IGNORECASE) is not None


SILENT = "another process stopped answering"  # the launcher replaces these words with the ranks it found silent


def silent_peer_error(error: BaseException, rank: int, timeout: int) -> PeerSilent:
    elsewhere = other_nodes(rank)
    where = f" (the processes of other nodes: {elsewhere})" if elsewhere else ""
    return PeerSilent(
        f"{SILENT}: rank {rank} waited {timeout} s (dist_timeout) for it in a collective operation{where}"
    )


LOST_CONNECTION = re.compile(r"Connection (?P<how>closed|reset) by peer(?: \[(?P<address>[^\]]+)\])?")


def is_lost_peer(error: BaseException) -> bool:
    """Whether an exception is a gloo collective whose connection to another process closed under it (that process
    ended: killed, out of memory, its node down)."""
    return isinstance(error, RuntimeError) and LOST_CONNECTION.search(str(error)) is not None


def lost_peer_error(error: BaseException, rank: int) -> PeerLost:
    found = LOST_CONNECTION.search(str(error))
    assert found is not None
    address = f" to {found['address']}" if found["address"] else ""
    elsewhere = other_nodes(rank)
    where = f" (the processes of other nodes: {elsewhere})" if elsewhere else ""
    return PeerLost(
        f"another process went away: rank {rank}'s connection{address} was {found['how']} by it in a collective "
        f"operation{where}"
    )

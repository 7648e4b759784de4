"""What a step would cost at N nodes on a given link, from what one process can measure: its compute time per
step, the bytes its gradients put on the wire (per ``grad_compression``), and the link's bandwidth. A ring
all-reduce sends 2 (N - 1) / N times the buffer from every node, so on a link of B bytes/s a step takes

    compute + exchange - min(exchange, 0.25 x compute),  exchange = 2 (N - 1) / N x bytes / (0.95 B) + 2 (N - 1) x
    latency

(0.95: TCP/IP's headers; 0.25: the part of the step DDP's exchange overlaps, sending a bucket while the backward pass
goes on, fitted to the two-node measurements).
Checked against two nodes in network namespaces at 1 Gbit/s and 100 Mbit/s (benchmarks.compression; the error is
in docs/launching.md). ``doctor --link=1gbit`` prints it for the probed model."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from cifar10_dist.config import FIELDS

POWERSGD_RANK = int(FIELDS["powersgd_rank"].default)  # type: ignore[arg-type]  # the rank a run takes unless given
KINDS = ("none", "bf16", "powersgd")  # what the estimate compares (fp16 puts the bytes of bf16 on the wire)
LATENCY_SECONDS = 100e-6  # a hop between nodes on Ethernet, for the small buffers
WIRE_EFFICIENCY = 0.95  # the payload's share of what a link carries (TCP/IP headers at a 1500-byte MTU)
OVERLAP = 0.25  # how much of one process's step the exchange hides behind (DDP sends a bucket while backward goes
# on): fitted to the 16 two-node measurements of benchmarks.compression (2-core Zen 4; docs/launching.md)


def link_bytes_per_second(link: str) -> float:
    """A link's speed as tc writes it (100mbit, 1gbit, 25gbit) or in bytes (1.5GB/s, 500MB/s); ValueError else."""
    found = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgGtT]?)(bit|B/s)\s*", link)
    number, prefix, unit = found.groups() if found is not None else ("", "", "")
    try:
        scaled = float(number) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[prefix.lower()]
    except ValueError:
        scaled = 0.0
    if not scaled > 0:  # (no number, or none above 0: nothing crosses such a link)
        raise ValueError(f"link={link!r}: give its speed, above 0, as 100mbit, 1gbit, 25gbit or 1.5GB/s")
    return scaled if unit == "B/s" else scaled / 8


def wire_bytes(model: nn.Module, kind: str = "none", rank: int = POWERSGD_RANK) -> int:
    """Bytes of one process's gradient exchange per step (before the ring's 2 (N - 1) / N): fp32 gradients; fp16 and
    bf16 half of it; PowerSGD its P and Q of rank ``rank`` for every matrix it compresses (as torch's hook decides:
    where that is smaller) and the rest whole."""
    total = 0
    for parameter in model.parameters():
        if not parameter.requires_grad:
            continue
        numel = parameter.numel()
        if kind in ("fp16", "bf16"):
            total += 2 * numel
        elif kind == "powersgd" and parameter.dim() > 1:
            n, m = parameter.shape[0], numel // parameter.shape[0]
            low = min(n, m, rank)
            total += 4 * (low * (n + m) if n * m >= 2 * (n + m) * low else numel)  # torch's min_compression_rate
        else:
            total += 4 * numel
    return total


@dataclass(frozen=True)
class Estimate:
    nodes: int
    kind: str
    seconds_per_step: float
    communicating: float  # the share of a step spent exchanging gradients
    images_per_second: float  # over all nodes


def estimate(
    compute_seconds: float, exchanged_bytes: int, bandwidth: float, nodes: int, images_per_step: int, kind: str = "none"
) -> Estimate:
    """One node's step at ``nodes`` nodes of ``images_per_step`` images each; ``compute_seconds``: one process's
    step alone (with the compression's own work, where it measures it)."""
    exchange = (
        0.0
        if nodes == 1
        else 2 * (nodes - 1) / nodes * exchanged_bytes / (bandwidth * WIRE_EFFICIENCY)
        + 2 * (nodes - 1) * LATENCY_SECONDS
    )
    step = compute_seconds + exchange - min(exchange, OVERLAP * compute_seconds)
    return Estimate(nodes, kind, step, exchange / step, nodes * images_per_step / step)


def table(
    model: nn.Module,
    compute_seconds: float,
    images_per_step: int,
    link: str,
    node_counts: tuple[int, ...] = (2, 4, 8, 16),
    rank: int = POWERSGD_RANK,
) -> list[str]:
    """The lines ``doctor --link`` prints: per node count, each kind's images/s and the share spent communicating."""
    bandwidth = link_bytes_per_second(link)
    sizes = {kind: wire_bytes(model, kind, rank) for kind in KINDS}
    lines = [
        f"on a {link} link ({bandwidth / 1e6:.1f} MB/s), a step of {compute_seconds * 1e3:.0f} ms compute on "
        f"{images_per_step} images per node, gradients {sizes['none'] / 1e6:.1f} MB (bf16 "
        f"{sizes['bf16'] / 1e6:.1f} MB, powersgd rank {rank} {sizes['powersgd'] / 1e6:.2f} MB):"
    ]
    for nodes in node_counts:
        cells = []
        for kind in KINDS:
            found = estimate(compute_seconds, sizes[kind], bandwidth, nodes, images_per_step, kind)
            cells.append(f"{kind} {found.images_per_second:,.0f} img/s ({found.communicating:.0%} communicating)")
        lines.append(f"  {nodes:>3} nodes: " + "; ".join(cells))
    return lines

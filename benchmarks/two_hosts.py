"""Two hosts on one machine, joined by a link of a chosen speed: two network namespaces and a veth pair between them,
each end rate-limited with ``tc``'s token bucket (so both directions carry at most the rate), for the multi-node
tests (tests/test_two_hosts.py) and benchmarks.compression. One process a namespace is one node: node 0 at
10.77.0.1, node 1 at 10.77.0.2 (addresses that live only inside the namespaces). Needs root and iproute2 (Debian's
``iproute2``; .ci/run installs it). Everything it made (namespaces, the link, the processes inside) goes on leaving
the context, also when the body raised.

    with two_hosts("100mbit") as hosts:
        node0 = hosts.start(0, ["python", "-m", "cifar10_dist", "run", ..., *hosts.node_flags(0)])
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Iterator

ADDRESSES = ("10.77.0.1", "10.77.0.2")
MASTER_PORT = 29500  # free in a namespace of its own
_made = itertools.count()


def unavailable() -> str | None:
    """Why two hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (Debian's iproute2)"
    probe = f"c10dprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def rate_bytes_per_second(rate: str) -> float:
    """tc's rate words as bytes per second: 100mbit, 1gbit, 500kbit."""
    number, unit = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", rate.lower()).groups()  # type: ignore[union-attr]
    return float(number) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[unit] / 8


@dataclass
class TwoHosts:
    namespaces: tuple[str, str]
    interfaces: tuple[str, str]
    rate: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def environment(self, node: int) -> dict[str, str]:
        """What a node's process needs to find the other: gloo on the link's interface (not loopback)."""
        return {
            "GLOO_SOCKET_IFNAME": self.interfaces[node],
            "MASTER_ADDR": ADDRESSES[0],
            "MASTER_PORT": str(MASTER_PORT),
        }

    def node_flags(self, node: int, processes: int = 1) -> list[str]:
        """cifar10-dist's own multi-node launch, one node a namespace."""
        return [
            "--backend=gloo",
            f"--nproc_per_node={processes}",
            "--nnodes=2",
            f"--node_rank={node}",
            f"--master_addr={ADDRESSES[0]}",
            f"--master_port={MASTER_PORT}",
        ]

    def start(
        self, node: int, command: list[str], env: dict[str, str] | None = None, **popen: object
    ) -> subprocess.Popen:
        """``command`` run inside the node's namespace, its environment ``env`` (default: this process's) with the
        node's; stopped with the hosts."""
        environment = {**(env if env is not None else os.environ), **self.environment(node)}
        process = subprocess.Popen(["ip", "netns", "exec", self.namespaces[node], *command], env=environment, **popen)  # type: ignore[call-overload]
        self.processes.append(process)
        return process

    def sent_bytes(self, node: int) -> int:
        """Bytes the node has sent over the link so far (its interface's counter)."""
        done = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.namespaces[node],
                "cat",
                f"/sys/class/net/{self.interfaces[node]}/statistics/tx_bytes",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(done.stdout)

    def kill_node(self, node: int) -> None:
        """SIGKILL every process inside the node's namespace (its launcher, its workers, a served process the CLI
        server forked there): the node dies as a machine that loses power does."""
        pids = subprocess.run(["ip", "netns", "pids", self.namespaces[node]], capture_output=True, text=True).stdout
        for pid in pids.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)
        for namespace in self.namespaces:  # whatever else runs inside (a worker the launcher started)
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            deadline = time.monotonic() + 10
            while pids and time.monotonic() < deadline:
                time.sleep(0.05)
                pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@contextlib.contextmanager
def two_hosts(rate: str = "1gbit") -> Iterator[TwoHosts]:
    """Two namespaces joined by a veth pair, each end limited to ``rate`` (tc tbf, a burst of 10 ms of it)."""
    tag = f"{os.getpid() % 100000}{next(_made)}"
    hosts = TwoHosts((f"c10d{tag}a", f"c10d{tag}b"), (f"v{tag}a", f"v{tag}b"), rate)
    try:
        for namespace in hosts.namespaces:
            ip("netns", "add", namespace)
        ip(
            "link",
            "add",
            hosts.interfaces[0],
            "netns",
            hosts.namespaces[0],
            "type",
            "veth",
            "peer",
            "name",
            hosts.interfaces[1],
            "netns",
            hosts.namespaces[1],
        )
        burst = max(int(rate_bytes_per_second(rate) / 100), 16 * 1024)
        for namespace, interface, address in zip(hosts.namespaces, hosts.interfaces, ADDRESSES):
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", interface)
            ip("-n", namespace, "link", "set", interface, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    namespace,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    interface,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    str(burst),
                    "latency",
                    "100ms",
                ],
                check=True,
                capture_output=True,
            )
        yield hosts
    finally:
        hosts.close()

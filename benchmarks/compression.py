"""Gradient compression on a slow link (issue 74): two nodes (network namespaces joined by a veth pair under tc tbf,
benchmarks.two_hosts) of one process each, gloo, ResNet-18 and the fast recipe's network: the step time and the bytes
each node sends per step for each ``grad_compression`` against none, at each link speed, in interleaved rounds; the
scaling estimate (cifar10_dist.system.scaling) against each measured step; and the accuracy each setting reaches on
a short real-data run (fast.yaml cut short, 2 gloo processes on loopback: the link changes the time, not the
numbers). Figures: docs/measured.md, "Gradient compression on a slow link".

    python -m benchmarks.compression speed [--links=1gbit,100mbit] [--models=resnet18,airbench] [--rounds=2] [--steps=4]
    python -m benchmarks.compression accuracy --data_path=DIR [--seeds=0,1,2] [--epochs=4] [--epoch_length=16]
    python -m benchmarks.compression epochs [--links=100mbit] [--rounds=1] [--kinds=...]
        (whole epochs of a real run on the two hosts: ResNet-18, 1,536 synthetic images, batch 64, 2 epochs)
    python -m benchmarks.compression exact     (that run with powersgd on 2 local gloo processes: twice, and once
        killed after a checkpoint and resumed; every tensor of the three final checkpoints compared)
    python -m benchmarks.compression summarise --json=PATH     (the estimate again over the runs it holds)
Each takes --json=PATH, --powersgd_rank=R and --powersgd_start_step=S (the run's defaults unless given; recorded).

Each speed measurement is a worker pair (``worker``, one a namespace) that joins the group over the link, builds the
model with the run's DDP wrapping and hook (training.setup.compression), times ``--steps`` training steps on
synthetic images after 3 untimed ones (DDP's bucket rebuild and PowerSGD's uncompressed start fall there), and reads
its interface's byte counter around the timed steps; first, each times the same steps in a DDP of its own process
alone with the same hook (the step and the hook's own work, no link: what the estimate starts from).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import records
from benchmarks.two_hosts import two_hosts

KINDS = ("none", "bf16", "fp16", "powersgd")
BATCH = {"resnet18": 64, "airbench": 128}  # images per node and step
WARM_STEPS = 3
OLDER_RANK = 2  # PowerSGD's rank in the records that name none (made while it was powersgd_rank's default)


def worker(model_name: str, kind: str, steps: int, rank: int) -> dict[str, Any]:
    """One node: compute-only steps, then steps through DDP and the hook over the link (run inside a namespace)."""
    import ignite.distributed as idist
    import torch

    from cifar10_dist import models
    from cifar10_dist.config import load_config
    from cifar10_dist.training.setup import compression

    torch.set_num_threads(1)
    torch.manual_seed(0)
    network = models.build_model(model_name, None, 10)
    images, labels = torch.randn(BATCH[model_name], 3, 32, 32), torch.randint(0, 10, (BATCH[model_name],))

    def timed(model: torch.nn.Module, count: int) -> float:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        started = time.perf_counter()
        for _ in range(count):
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        return (time.perf_counter() - started) / max(count, 1)

    idist.initialize("gloo")
    try:
        config = load_config(
            None,
            backend="gloo",
            nproc_per_node=1,
            nnodes=2,
            node_rank=idist.get_rank(),
            master_addr=os.environ["MASTER_ADDR"],
            master_port=int(os.environ["MASTER_PORT"]),
            grad_compression=kind,
            powersgd_rank=rank,
            powersgd_start_step=2,
        )
        alone = [torch.distributed.new_group([rank]) for rank in range(idist.get_world_size())][idist.get_rank()]
        solo = torch.nn.parallel.DistributedDataParallel(
            models.build_model(model_name, None, 10), process_group=alone
        )  # the hook, no link
        compression.attach(solo, config, process_group=alone)
        timed(solo, WARM_STEPS)
        local = timed(solo, steps)  # the step and the hook's own work: what one process measures
        ddp = torch.nn.parallel.DistributedDataParallel(network)
        compression.attach(ddp, config)
        timed(ddp, WARM_STEPS)
        counter = Path(f"/sys/class/net/{os.environ['GLOO_SOCKET_IFNAME']}/statistics/tx_bytes")
        idist.barrier()
        sent = int(counter.read_text())
        step = timed(ddp, steps)
        sent = int(counter.read_text()) - sent
    finally:
        idist.finalize()
    return {"compute_seconds": local, "step_seconds": step, "sent_bytes_per_step": sent / steps}


def measure(hosts: Any, model_name: str, kind: str, steps: int, rank: int) -> dict[str, Any]:
    """The worker pair on the hosts' link; node 0's figures."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.compression",
        "worker",
        f"--models={model_name}",
        f"--kind={kind}",
        f"--steps={steps}",
        f"--powersgd_rank={rank}",
    ]
    ranks = [{"RANK": str(node), "WORLD_SIZE": "2", "LOCAL_RANK": "0"} for node in (0, 1)]
    outputs = on_both_nodes(hosts, [command, command], ranks, f"{model_name} {kind}", timeout=1800)
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def on_both_nodes(hosts: Any, commands: list, environments: list, what: str, timeout: float) -> list[tuple[str, str]]:
    """Node N's command and environment in its namespace, one torch thread each; their (stdout, stderr) once both
    ended, or SystemExit with both stderr tails where either failed."""
    env = {**os.environ, "PYTHONPATH": str(records.REPO), "OMP_NUM_THREADS": "1"}
    processes = [
        hosts.start(
            node,
            commands[node],
            env={**env, **environments[node]},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [process.communicate(timeout=timeout) for process in processes]
    if any(process.returncode for process in processes):
        raise SystemExit(f"{what}: {outputs[0][1][-1500:]} {outputs[1][1][-1500:]}")
    return outputs


def speed(args: argparse.Namespace, out: dict[str, Any]) -> None:
    for link in args.links:
        with two_hosts(link) as hosts:
            for round_index in range(args.rounds):
                for model_name in args.models:
                    for kind in KINDS:  # interleaved: each round runs every setting once
                        found = measure(hosts, model_name, kind, args.steps, out["powersgd"]["powersgd_rank"])
                        out["speed"].setdefault(link, {}).setdefault(model_name, {}).setdefault(kind, []).append(found)
                        records.write(args.json, out) if args.json else None
                        print(
                            f"{link} {model_name} {kind} round {round_index}: {found['step_seconds']:.3f} s/step, "
                            f"{found['sent_bytes_per_step'] / 1e6:.2f} MB/step",
                            flush=True,
                        )
    summarise(out)


def summarise(out: dict[str, Any]) -> None:
    """Per link, model and setting: the median step, the estimate from the median local step, its error, the bytes
    sent against the bytes predicted, and the step over none's."""
    from cifar10_dist import models
    from cifar10_dist.system import scaling

    out["summary"] = {}
    rank = out.get("powersgd", {}).get("powersgd_rank", OLDER_RANK)
    for link, by_model in out["speed"].items():
        for model_name, by_kind in by_model.items():
            network = models.build_model(model_name, None, 10)
            for kind, runs in by_kind.items():
                step = statistics.median(run["step_seconds"] for run in runs)
                compute = statistics.median(run["compute_seconds"] for run in runs)
                wire = scaling.wire_bytes(network, kind, rank)
                predicted = scaling.estimate(
                    compute, wire, scaling.link_bytes_per_second(link), 2, BATCH[model_name], kind
                ).seconds_per_step
                out["summary"].setdefault(link, {}).setdefault(model_name, {})[kind] = {
                    "step_seconds": step,
                    "compute_seconds": compute,
                    "estimated_step_seconds": predicted,
                    "estimate_error": predicted / step - 1,
                    "sent_mb_per_step": statistics.median(run["sent_bytes_per_step"] for run in runs) / 1e6,
                    "wire_mb_predicted": wire / 1e6,
                    "over_none": step / statistics.median(r["step_seconds"] for r in by_kind["none"]),
                }
    errors = [
        abs(row["estimate_error"])
        for by_model in out["summary"].values()
        for by_kind in by_model.values()
        for row in by_kind.values()
    ]
    out["estimate_error_max"], out["estimate_error_mean"] = max(errors), statistics.mean(errors)


EPOCH_RUN = [  # the issue-84 run: ResNet-18 on 1,536 synthetic images, global batch 64 (24 steps an epoch), 2 epochs
    "--config=demo",
    "--model=resnet18",
    "--synthetic_size=1536",
    "--batch_size=64",
    "--num_epochs=2",
    "--num_warmup_epochs=0.5",
    "--num_workers=0",
    "--train_eval_size=0",
    "--validate_every=2",
    "--figures=False",
]


def epochs(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Each setting's whole epochs, as ``cifar10-dist run`` on the two hosts logs them (one process a node; PowerSGD
    from step 10 of 48, so epoch 2 is all compressed), interleaved rounds; then each epoch over none's."""
    for link in args.links:
        with two_hosts(link) as hosts:
            for round_index in range(args.rounds):
                for kind in args.kinds:
                    found = run_epochs(hosts, kind, flags_of(out["powersgd"]) if kind == "powersgd" else [])
                    out["epochs"].setdefault(link, {}).setdefault(kind, []).append(found)
                    records.write(args.json, out) if args.json else None
                    print(f"{link} {kind} round {round_index}: epochs {found['epoch_seconds']} s", flush=True)
    for link, by_kind in out["epochs"].items():
        none = [statistics.median(run["epoch_seconds"][epoch] for run in by_kind["none"]) for epoch in (0, 1)]
        out["epochs_summary"][link] = {
            kind: {
                "epoch_seconds": [statistics.median(run["epoch_seconds"][epoch] for run in runs) for epoch in (0, 1)],
                "over_none": [
                    statistics.median(run["epoch_seconds"][epoch] for run in runs) / none[epoch] for epoch in (0, 1)
                ],
            }
            for kind, runs in by_kind.items()
        }


def powersgd_settings(args: argparse.Namespace) -> dict[str, int]:
    """PowerSGD's rank and start step as given, else the run's defaults: every record names them."""
    from cifar10_dist.config import FIELDS

    keys = ("powersgd_rank", "powersgd_start_step")
    return {key: FIELDS[key].default if getattr(args, key) is None else getattr(args, key) for key in keys}


def flags_of(settings: dict[str, Any]) -> list[str]:
    return [f"--{key}={value}" for key, value in settings.items()]


def run_epochs(hosts: Any, kind: str, extra: list[str]) -> dict[str, Any]:
    """One run of EPOCH_RUN on the two nodes with ``grad_compression=kind`` (and ``extra`` flags): node 0's epoch
    times and result."""
    sent_before = hosts.sent_bytes(0)
    with tempfile.TemporaryDirectory() as output:
        command = [sys.executable, "-m", "cifar10_dist", "run", *EPOCH_RUN, f"--grad_compression={kind}", *extra]
        command += [f"--output_path={output}", "--run_name=epochs"]
        outputs = on_both_nodes(hosts, [[*command, *hosts.node_flags(node)] for node in (0, 1)], [{}, {}], kind, 3600)
        seconds = [float(found) for found in re.findall(r"epoch \d+ done in ([0-9.]+) s", outputs[0][1])]
        final = json.loads((Path(output) / "epochs" / "metrics.json").read_text())["test"]
    return {"epoch_seconds": seconds, "test": final, "sent_mb": (hosts.sent_bytes(0) - sent_before) / 1e6}


def exact(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """EPOCH_RUN with powersgd on 2 local gloo processes: two whole runs, and a third SIGKILLed once its checkpoint
    at step 24 is written, then resumed with --resume_from=auto; each final checkpoint against the first run's."""
    import signal

    from cifar10_dist.outputs.checkpoint_files import load_checkpoint

    command = [
        sys.executable,
        "-m",
        "cifar10_dist",
        "run",
        *EPOCH_RUN,
        "--grad_compression=powersgd",
        *flags_of(out["powersgd"]),
        "--backend=gloo",
        "--nproc_per_node=2",
        "--checkpoint_every=12",
    ]
    env = {**os.environ, "PYTHONPATH": str(records.REPO)}
    with tempfile.TemporaryDirectory() as output:
        finals = {}
        for name in ("first", "second"):
            started = time.perf_counter()
            subprocess.run([*command, f"--output_path={output}", f"--run_name={name}"], env=env, check=True)
            out["exact"].setdefault("seconds", {})[name] = time.perf_counter() - started
            finals[name] = Path(output) / name / "training_checkpoint_48.pt"
        killed = subprocess.Popen(
            [*command, f"--output_path={output}", "--run_name=killed"], env=env, start_new_session=True
        )
        while not (Path(output) / "killed" / "training_checkpoint_24.pt").exists():
            time.sleep(0.05)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        out["exact"]["killed_after"] = sorted(path.name for path in (Path(output) / "killed").glob("training_*.pt"))
        subprocess.run(
            [*command, f"--output_path={output}", "--run_name=killed", "--resume_from=auto"], env=env, check=True
        )
        finals["killed"] = Path(output) / "killed" / "training_checkpoint_48.pt"
        states = {name: load_checkpoint(path) for name, path in finals.items()}
        for name in ("second", "killed"):
            out["exact"][f"{name}_equals_first"] = same_state(states["first"], states[name])
        out["exact"]["powersgd_iter"] = int(states["first"]["grad_compression"]["iter"])
        out["exact"]["buckets"] = len(states["first"]["grad_compression"]["errors"])
    print(json.dumps(out["exact"], indent=1))


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Every tensor of the model, optimizer and PowerSGD state equal, bit for bit."""
    import torch

    def equal(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(equal(x[key], y[key]) for key in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(equal, x, y))
        return bool(x == y)

    return all(equal(a[key], b[key]) for key in ("model", "optimizer", "grad_compression", "trainer"))


def accuracy(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """fast.yaml on 2 gloo processes per setting and seed, without TTA: cut short (``--epochs`` of
    ``--epoch_length`` steps: 4 of 16 by default) or whole (``--epoch_length=0``: its 10 epochs of 48 steps)."""
    from benchmarks import runner

    length = {"epoch_length": args.epoch_length} if args.epoch_length else {}
    powersgd = out["powersgd"]
    out["accuracy_run"] = {"num_epochs": args.epochs, "epoch_length": args.epoch_length or "whole epochs", **powersgd}
    for seed in args.seeds:
        for kind in args.kinds:
            with tempfile.TemporaryDirectory() as output:
                run = runner.train_ours(
                    Path(output),
                    records.REPO / "configs" / "fast.yaml",
                    "cpu",
                    data_path=args.data_path,
                    seed=seed,
                    num_epochs=args.epochs,
                    **length,
                    tta=0,
                    backend="gloo",
                    nproc_per_node=2,
                    grad_compression=kind,
                    **(powersgd if kind == "powersgd" else {}),
                )
            out["accuracy"].setdefault(kind, {})[str(seed)] = run.accuracy
            records.write(args.json, out) if args.json else None
            print(f"accuracy {kind} seed {seed}: {run.accuracy:.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("speed", "epochs", "exact", "accuracy", "worker", "summarise"))
    parser.add_argument("--links", default="1gbit,100mbit", type=lambda text: text.split(","))
    parser.add_argument("--models", default="resnet18,airbench", type=lambda text: text.split(","))
    parser.add_argument("--kind", default="none")
    parser.add_argument("--rounds", default=2, type=int)
    parser.add_argument("--steps", default=4, type=int)
    parser.add_argument("--seeds", default="0,1,2", type=lambda text: [int(seed) for seed in text.split(",")])
    parser.add_argument("--data_path", default=None)
    parser.add_argument("--epochs", default=4, type=int)
    parser.add_argument("--epoch_length", default=16, type=int)
    parser.add_argument("--kinds", default=",".join(KINDS), type=lambda text: text.split(","))
    parser.add_argument("--powersgd_rank", default=None, type=int)
    parser.add_argument("--powersgd_start_step", default=None, type=int)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.part == "worker":
        print(json.dumps(worker(args.models[0], args.kind, args.steps, powersgd_settings(args)["powersgd_rank"])))
        return
    if args.part == "summarise":  # the estimate again, over the speed runs a JSON holds
        recorded = json.loads(Path(args.json).read_text())
        summarise(recorded)
        Path(args.json).write_text(json.dumps(recorded, indent=2) + "\n")
        return
    out: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": records.machine("cpu"),
        "speed": {},
        "summary": {},
        "accuracy": {},
        "epochs": {},
        "epochs_summary": {},
        "exact": {},
        "batch_per_node": BATCH,
        "powersgd": powersgd_settings(args),
    }
    {"speed": speed, "epochs": epochs, "exact": exact, "accuracy": accuracy}[args.part](args, out)
    if args.json:
        records.write(args.json, out)
    print(json.dumps(out["summary"] or out["epochs_summary"] or out["accuracy"], indent=1))


if __name__ == "__main__":
    main()

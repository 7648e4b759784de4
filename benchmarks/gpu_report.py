"""GPU report: gpu_report.md and gpu_report.json from what scripts/gpu_check.sh left in its folder (not a
measurement itself; the first one, from an H200, is docs/gpu-report.md). Takes a second.

    python -m benchmarks.gpu_report --out=DIR

Reads OUT/pytest.xml (the gpu checks' JUnit results), OUT/checks.jsonl (the figures the checks recorded) and
OUT/benchmark.json (benchmarks.gpu), and describes the machine (GPUs, driver, CUDA, torch).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import xml.etree.ElementTree as ElementTree
from datetime import date
from pathlib import Path
from typing import Any


def environment() -> dict[str, Any]:
    """GPU names, driver, CUDA and torch versions of this machine."""
    import torch

    names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    return {
        "date": date.today().isoformat(),
        "gpus": names,
        "driver": nvidia_driver(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if names else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def nvidia_driver() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else None


def read_checks(junit: Path, figures: Path) -> list[dict[str, Any]]:
    """One entry per check: name, outcome (passed, failed, skipped), the reason of a failure or skip, figures."""
    recorded: dict[str, list[dict[str, Any]]] = {}
    if figures.is_file():
        for line in figures.read_text().splitlines():
            figure = json.loads(line)
            recorded.setdefault(figure["test"], []).append(
                {"name": figure["name"], "value": figure["value"], "unit": figure["unit"]}
            )
    checks = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                reason = (found.get("message") or found.text or "").strip().splitlines()[0][:300]
                break
        checks.append(
            {
                "check": case.get("name"),
                "outcome": outcome,
                "reason": reason,
                "seconds": float(case.get("time", 0)),
                "figures": recorded.get(case.get("name"), []),
            }
        )
    return checks


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    gpus = ", ".join(env["gpus"]) or "no CUDA GPU"
    lines = [
        f"# GPU check, {env['date']}",
        "",
        f"{gpus}; driver {env['driver']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, torch {env['torch']}, "
        f"Python {env['python']}",
        "",
        f"{report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped",
        "",
        "| check | result | figures |",
        "|---|---|---|",
    ]
    for check in report["checks"]:
        figures = "; ".join(f"{f['name']}: {_number(f['value'])} {f['unit']}".strip() for f in check["figures"])
        result = check["outcome"] + (f" ({check['reason']})" if check["reason"] else "")
        lines.append(f"| {check['check']} | {result} | {figures} |")
    benchmark = report.get("benchmark")
    if benchmark:
        lines += ["", "## Benchmark", "", "```", benchmark.get("table", "").rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def build(out: Path, env: dict[str, Any] | None = None) -> dict[str, Any]:
    checks = read_checks(out / "pytest.xml", out / "checks.jsonl") if (out / "pytest.xml").is_file() else []
    benchmark_file = out / "benchmark.json"
    report = {
        "environment": env or environment(),
        "checks": checks,
        **{state: sum(c["outcome"] == state for c in checks) for state in ("passed", "failed", "skipped")},
        "benchmark": json.loads(benchmark_file.read_text()) if benchmark_file.is_file() else None,
    }
    (out / "gpu_report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_report.md").write_text(render(report))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the folder gpu_check.sh wrote into")
    report = build(Path(parser.parse_args().out))
    print(f"gpu report: {report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped")


if __name__ == "__main__":
    main()

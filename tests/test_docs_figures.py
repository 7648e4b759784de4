"""Figures quoted from a measurement are the measurement's: in README.md and docs/*.md such a figure is followed
by a marker, invisible once rendered, ``<!-- measured NAME.json /json/pointer [xSCALE] -->``; the number before
it must be the value at that pointer (RFC 6901) of docs/measurements/NAME.json, times SCALE, at the precision
quoted, and that file must name the command, the commit and the machine (its CPU kind) that produced it (the
way docs/configuration.md is checked against the config's fields)."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"(\d[\d,]*(?:\.\d+)?)[^\d<>|]{0,8}<!-- measured (\S+\.json) (/[^>]*?)(?: x(\d+))? -->")
CPU_KINDS = ("AMX", "AVX512", "AVX2")  # what hardware.describe names a CPU's kind by


def quoted_figures() -> list[tuple[str, str, str, str, int]]:
    """(page, number as quoted, JSON file, pointer, scale) for every marker."""
    found = []
    for page in PAGES:
        for number, name, pointer, scale in MARKER.findall(page.read_text()):
            found.append((page.name, number, name, pointer, int(scale or 1)))
    return found


def at_pointer(document: object, pointer: str) -> object:
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        document = document[int(part)] if isinstance(document, list) else document[part]
    return document


def test_every_marker_is_a_whole_marker():
    """A marker the pattern above does not read (a typo, a number too far from it) fails here, not silently."""
    for page in PAGES:
        text = page.read_text()
        assert text.count("<!-- measured ") == len(MARKER.findall(text)), page.name


def test_the_pages_that_quote_the_input_pipeline_and_the_doctor_mark_their_figures():
    assert {"measured.md", "your-data.md", "recipes.md"} <= {page for page, *_ in quoted_figures()}


@pytest.mark.parametrize("page, number, name, pointer, scale", quoted_figures())
def test_a_quoted_figure_is_the_value_its_json_records(page, number, name, pointer, scale):
    record = json.loads((REPO / "docs" / "measurements" / name).read_text())
    value = float(at_pointer(record, pointer)) * scale
    decimals = len(number.split(".")[1]) if "." in number else 0
    assert round(value, decimals) == float(number.replace(",", "")), (
        f"{page}: {number} quoted, {name} {pointer} is {value}"
    )
    assert record.get("command") and record.get("commit"), f"{name} does not name its command and commit"
    machine = f"{record.get('machine')} {record.get('hardware', {}).get('cpu', {}).get('capability')}"
    assert any(kind in machine for kind in CPU_KINDS), f"{name} does not name the CPU's kind"


def program_of(command: str) -> Path | None:
    """The file in this tree a record's command runs: ``-m benchmarks.NAME`` or ``python -m cifar10_dist`` (and the
    cifar10-dist console script), ``benchmarks/NAME.py`` or ``scripts/NAME.sh`` named as a path, or ``from
    benchmarks import NAME``; None when it names none of them."""
    module = re.search(r"-m (benchmarks\.\w+|cifar10_dist)\b|from (benchmarks) import (\w+)", command)
    if module and module.group(1):
        return REPO / (
            module.group(1).replace(".", "/") + ("/__init__.py" if module.group(1) == "cifar10_dist" else ".py")
        )
    if module:
        return REPO / "benchmarks" / f"{module.group(3)}.py"
    path = re.search(r"((?:benchmarks|scripts)/[\w/]+\.(?:py|sh))", command)
    if path:
        return REPO / path.group(1)
    return REPO / "cifar10_dist" / "__main__.py" if "cifar10-dist " in command else None


@pytest.mark.parametrize("name", sorted(path.name for path in (REPO / "docs" / "measurements").glob("*.json")))
def test_every_record_names_a_command_of_this_tree_its_commit_and_the_machine(name):
    """Every file in docs/measurements/, not only those a marker names: a command whose program is in the tree
    today, the commit it ran at, and the CPU or GPU (the machine)."""
    record = json.loads((REPO / "docs" / "measurements" / name).read_text())
    command, commit = record.get("command"), record.get("commit")
    machine = record.get("machine") or json.dumps(record.get("hardware", {}).get("cpu", {}).get("model"))
    assert isinstance(command, str) and command, f"{name} names no command"
    program = program_of(command)
    assert program is not None and program.is_file(), f"{name}: its command ({command[:80]}) runs nothing of this tree"
    assert isinstance(commit, str) and re.search(r"[0-9a-f]{7}", commit), f"{name} names no commit"
    assert isinstance(machine, str) and re.search(r"EPYC|Xeon|Intel|AMD|NVIDIA|H100|H200|CPU", machine), name


@pytest.mark.parametrize("name", sorted(path.stem for path in (REPO / "benchmarks").glob("*.py")))
def test_every_benchmark_imports(name):
    """A record's command must still run: each benchmark module imports what it names from the package today (a
    rename once left ``benchmarks.ddp`` importing a function from a module that no longer had it)."""
    importlib.import_module(f"benchmarks.{name}")

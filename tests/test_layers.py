"""The package's floors: every module imports only modules on lower floors (imports inside functions count), so
there is no import circle and nothing below reaches up. README's "Development" section draws the same floors."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cifar10_dist"

# top to bottom; a module imports only from floors below its own
FLOORS = [
    ("cli",),
    ("api", "cli_help"),
    ("tuning", "diagnostics"),
    ("runs", "exporting"),
    ("training", "inference", "evaluation"),
    ("process_setup", "run_data", "batches"),
    ("launch", "trials", "provenance"),
    ("checks", "tracking", "run_folder", "study_report"),
    ("folder_data",),
    ("optimizers", "checkpointing", "reports", "files", "loaders", "augmentation"),
    ("engines", "schedules", "models", "data", "faults", "xla_compat", "search_space"),
    ("image_folders",),
    ("results",),
    ("config", "hardware", "ranks"),
    ("errors",),
]
FLOOR = {module: level for level, modules in enumerate(FLOORS) for module in modules}


def package_imports(module: str) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its file (top level or inside functions)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cifar10_dist":
            parts = node.module.split(".")
            found.update([alias.name for alias in node.names] if len(parts) == 1 else [parts[1]])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names
                         if alias.name.startswith("cifar10_dist."))
    return {name for name in found if (PACKAGE / f"{name}.py").is_file() and name != module}


def modules() -> list[str]:
    return sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem not in ("__init__", "__main__"))


def test_every_module_has_a_floor():
    assert set(modules()) == set(FLOOR), "place new modules on a floor (and in README's layout)"


def test_every_import_goes_down_a_floor_so_there_is_no_circle():
    upward = [f"{module} (floor {FLOOR[module]}) imports {imported} (floor {FLOOR[imported]})"
              for module in modules() for imported in sorted(package_imports(module))
              if FLOOR[imported] <= FLOOR[module]]
    assert upward == []


def test_the_floor_check_sees_imports_inside_functions(tmp_path, monkeypatch):
    """The check would catch what the old tuning -> api import did: an import inside a function, upward."""
    (tmp_path / "low.py").write_text("def f():\n    from cifar10_dist import high\n    return high\n")
    (tmp_path / "high.py").write_text("import cifar10_dist.low\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert package_imports("low") == {"high"} and package_imports("high") == {"low"}


def test_benchmarks_and_tests_import_by_name_never_by_path():
    """The benchmarks are one package (``python -m benchmarks.NAME``) and tests import it by name: no module of
    ours is loaded from a file path or found through an edited sys.path."""
    repo = PACKAGE.parent
    sources = [*repo.glob("benchmarks/*.py"), *repo.glob("scripts/**/*.py"), *repo.glob("tests/**/*.py")]
    assert len(sources) > 30
    this_file = Path(__file__).resolve()
    found = [f"{path.relative_to(repo)}: {needle}" for path in sources if path.resolve() != this_file
             for needle in ("sys.path.insert", "sys.path.append", "spec_from_file_location")
             if needle in path.read_text()]
    assert found == []

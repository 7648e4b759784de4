"""The package's floors: the subpackages (``cifar10_dist.data``, ``cifar10_dist.training``, ...) and the top-level
modules each sit on a floor, and every module imports only from floors below its own (imports inside functions
count), so no package reaches up and there is no import circle between them. docs/development.md
draws the same floors."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cifar10_dist"

# top to bottom; a unit (a subpackage, or a module at the top of the package) imports only from floors below
FLOORS = [
    ("cli",),
    ("api",),
    ("tuning",),
    ("runs",),
    ("preflight",),
    ("launch", "deployment"),
    ("training",),
    ("recipes",),
    ("data",),
    ("outputs",),
    ("system",),
    ("models",),
    ("results", "checkpoint_layout"),
    ("config",),
    ("sources",),
    ("errors",),
]
FLOOR = {unit: level for level, units in enumerate(FLOORS) for unit in units}
TOP_LEVEL_LIMIT = 10  # modules at the top of cifar10_dist/, __init__ and __main__ included
LINE_LIMIT = 400


def dotted(path: Path, package: Path) -> str:
    """cifar10_dist/train/step.py -> 'train.step'; cifar10_dist/train/__init__.py -> 'train'."""
    parts = path.relative_to(package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(name: str) -> str:
    """The floor's unit of a dotted module name: its subpackage, or the top-level module itself."""
    return name.split(".")[0]


def package_imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The package's modules (dotted, without 'cifar10_dist.') that the file imports anywhere (top level or
    inside functions), as far as the import names them."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cifar10_dist":
            base = node.module.split(".")[1:]
            if base:
                found.add(".".join(base))
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(
                ".".join(alias.name.split(".")[1:]) for alias in node.names if alias.name.startswith("cifar10_dist.")
            )
    return found - {dotted(path, package)}


def sources(package: Path = PACKAGE) -> list[Path]:
    return sorted(
        path for path in package.rglob("*.py") if path.name != "__main__.py" and path != package / "__init__.py"
    )


def test_every_unit_has_a_floor():
    units = {unit_of(dotted(path, PACKAGE)) for path in sources()}
    assert units == set(FLOOR), (
        "place new packages and top-level modules on a floor (and in docs/development.md's layout)"
    )


def test_every_import_goes_down_a_floor_so_no_package_reaches_up():
    upward = [
        f"{dotted(path, PACKAGE)} (floor {FLOOR[unit_of(dotted(path, PACKAGE))]}) imports {imported} "
        f"(floor {FLOOR[unit_of(imported)]})"
        for path in sources()
        for imported in sorted(package_imports(path))
        if unit_of(imported) != unit_of(dotted(path, PACKAGE))
        and FLOOR[unit_of(imported)] <= FLOOR[unit_of(dotted(path, PACKAGE))]
    ]
    assert upward == []


def test_the_floor_check_sees_imports_inside_functions(tmp_path):
    """An import inside a function counts: the check would catch one that reaches up to a higher package."""
    (tmp_path / "low").mkdir()
    (tmp_path / "low" / "mod.py").write_text("def f():\n    from cifar10_dist.high import thing\n    return thing\n")
    (tmp_path / "high").mkdir()
    (tmp_path / "high" / "thing.py").write_text("import cifar10_dist.low.mod\n")
    assert package_imports(tmp_path / "low" / "mod.py", tmp_path) == {"high"}
    assert package_imports(tmp_path / "high" / "thing.py", tmp_path) == {"low.mod"}


def test_the_top_of_the_package_holds_few_modules_and_each_package_says_what_it_holds():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top
    for package in sorted(path.parent for path in PACKAGE.glob("*/__init__.py")):
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert docstring and "import" in docstring.lower(), f"{package.name}/__init__.py: say what it holds and imports"


def test_no_module_is_over_its_line_limit():
    """The package's modules and the benchmarks' alike: a file over 400 lines holds more than one job."""
    benchmarks = sorted((PACKAGE.parent / "benchmarks").glob("*.py"))
    long = [
        f"{path.relative_to(PACKAGE.parent)}: {count} lines"
        for path in [*sources(), *benchmarks]
        if (count := len(path.read_text().splitlines())) > LINE_LIMIT
    ]
    assert long == []


def test_no_function_is_over_60_lines():
    """A function over 60 lines does several things: split it into named builders (the package and the benchmarks)."""
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for path in [*sorted(PACKAGE.rglob("*.py")), *sorted((PACKAGE.parent / "benchmarks").glob("*.py"))]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []


def test_benchmarks_and_tests_import_by_name_never_by_path():
    """The benchmarks are one package (``python -m benchmarks.NAME``) and tests import it by name: no module of
    ours is loaded from a file path or found through an edited sys.path."""
    repo = PACKAGE.parent
    found_sources = [*repo.glob("benchmarks/*.py"), *repo.glob("scripts/**/*.py"), *repo.glob("tests/**/*.py")]
    assert len(found_sources) > 30
    this_file = Path(__file__).resolve()
    found = [
        f"{path.relative_to(repo)}: {needle}"
        for path in found_sources
        if path.resolve() != this_file
        for needle in ("sys.path.insert", "sys.path.append", "spec_from_file_location")
        if needle in path.read_text()
    ]
    assert found == []


def test_nothing_in_data_knows_models():
    """data/ sets up images for any model: a pretrained start's normalisation reaches it as numbers, resolved in the
    training worker (``setup_pretrained``), never through models."""
    for path in sorted((PACKAGE / "data").glob("*.py")):
        assert not [name for name in package_imports(path) if unit_of(name) == "models"], path.name


def module_imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The package's modules (dotted) that the file imports anywhere, resolved to modules: ``from
    cifar10_dist.training import run`` is training.run; a package's ``__init__`` is not counted (it only
    names what its modules hold)."""
    modules = {dotted(source, package) for source in sources(package) if source.name != "__init__.py"}
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cifar10_dist":
            base = ".".join(node.module.split(".")[1:])
            found.update(
                f"{base}.{alias.name}".strip(".") if f"{base}.{alias.name}".strip(".") in modules else base
                for alias in node.names
            )
        elif isinstance(node, ast.Import):
            found.update(
                ".".join(alias.name.split(".")[1:]) for alias in node.names if alias.name.startswith("cifar10_dist.")
            )
    return {name for name in found if name in modules} - {dotted(path, package)}


def import_circles(package: Path = PACKAGE) -> list[list[str]]:
    """Every circle of imports between modules (imports inside functions included), each as the modules on it."""
    graph = {
        dotted(path, package): module_imports(path, package) for path in sources(package) if path.name != "__init__.py"
    }
    circles, done = [], set()

    def walk(module: str, path: list[str]) -> None:
        for imported in sorted(graph.get(module, ())):
            if imported in path:
                circle = path[path.index(imported) :]
                if sorted(circle) not in [sorted(found) for found in circles]:
                    circles.append(circle)
            elif imported not in done:
                walk(imported, [*path, imported])
        done.add(module)

    for module in sorted(graph):
        walk(module, [module])
    return circles


def test_no_two_modules_import_each_other_even_inside_functions():
    assert import_circles() == []


def test_the_circle_check_finds_one_through_an_import_inside_a_function(tmp_path):
    (tmp_path / "room").mkdir()
    (tmp_path / "room" / "__init__.py").write_text("")
    (tmp_path / "room" / "one.py").write_text("from cifar10_dist.room import two\n")
    (tmp_path / "room" / "two.py").write_text("def f():\n    from cifar10_dist.room import one\n    return one\n")
    assert import_circles(tmp_path) == [["room.one", "room.two"]]


def test_no_isinstance_on_a_concrete_model_class_outside_models():
    """What a recipe needs of a model is asked through ``models.traits`` (protocols); no code outside ``models``
    tests for one of its concrete networks."""
    concrete = {
        node.name
        for path in (PACKAGE / "models").glob("*.py")
        if path.name != "traits.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    found = []
    for path in sources():
        if dotted(path, PACKAGE).startswith("models"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                named = {getattr(part, "attr", getattr(part, "id", None)) for part in ast.walk(node.args[1])}
                found += [f"{dotted(path, PACKAGE)}:{node.lineno} {name}" for name in sorted(named & concrete)]
    assert concrete >= {"AirbenchNet"} and found == []


def test_no_protocol_is_runtime_checkable():
    """From Python 3.12 on, ``isinstance`` against a runtime-checkable protocol reads attributes statically and
    misses an ``nn.Module``'s submodules. CI's Python 3.11 still found them, while an H200's 3.12 trained fast.yaml
    without its whitening (docs/gpu-report.md). A trait is asked with a function, as ``is_whitened_from_data``."""
    root = PACKAGE.parent
    paths = [*sources(), *(root / "benchmarks").glob("*.py"), *(root / "examples").rglob("*.py")]
    found = [
        f"{path.relative_to(root)}:{node.lineno}"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Name) and node.id == "runtime_checkable")
        or (isinstance(node, ast.Attribute) and node.attr == "runtime_checkable")
        or (isinstance(node, ast.ImportFrom) and any(alias.name == "runtime_checkable" for alias in node.names))
    ]
    assert found == []


def test_the_benchmarks_index_names_every_benchmark():
    import benchmarks

    folder = PACKAGE.parent / "benchmarks"
    index = benchmarks.__doc__
    named = set(re.findall(r"^    (\w+) ", index, re.M)) | set(re.findall(r"``(\w+)``", index))
    assert {path.stem for path in folder.glob("*.py") if path.stem != "__init__"} <= named


def room_arrows(package: Path = PACKAGE) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """For every package (the top one and each subpackage), which of its rooms (its subpackages and its own
    modules) import which: (package, room) -> {(package, imported room)}, imports inside functions included."""
    arrows: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for path in sources(package):
        if path.name == "__init__.py":
            continue
        name = dotted(path, package).split(".")
        for imported in module_imports(path, package):
            other = imported.split(".")
            for depth in range(min(len(name), len(other))):  # the package both sit in, and their rooms there
                if name[:depth] != other[:depth]:
                    break
                if name[depth] != other[depth]:
                    parent = ".".join(name[:depth])
                    arrows.setdefault((parent, name[depth]), set()).add((parent, other[depth]))
                    break
    return arrows


def test_no_two_sibling_rooms_of_any_package_import_each_other():
    """Inside every package, its rooms (subpackages and modules) are layered too: where one imports another, the
    other never imports it back (training/: setup below loop, below before_training and trained_models, below run)."""
    arrows = room_arrows()
    both_ways = sorted(
        f"{parent or 'cifar10_dist'}: {room} <-> {other}"
        for (parent, room), targets in arrows.items()
        for (_, other) in targets
        if room < other and (parent, room) in arrows.get((parent, other), set())
    )
    assert both_ways == []


def test_the_room_check_sees_a_two_way_arrow_between_subpackages(tmp_path):
    for room, imported in (("upper", "lower.b"), ("lower", "upper.a")):
        (tmp_path / "house" / room).mkdir(parents=True)
        (tmp_path / "house" / room / "__init__.py").write_text("")
    (tmp_path / "house" / "__init__.py").write_text("")
    (tmp_path / "house" / "upper" / "a.py").write_text("from cifar10_dist.house.lower import b\n")
    (tmp_path / "house" / "lower" / "b.py").write_text("def f():\n    from cifar10_dist.house.upper import a\n")
    assert room_arrows(tmp_path)[("house", "lower")] == {("house", "upper")}
    assert room_arrows(tmp_path)[("house", "upper")] == {("house", "lower")}


def test_no_training_or_data_code_names_a_recipe_or_its_parts():
    """What makes a recipe (airbench's whitening from data, its frozen bias and its group, the forward branches to
    warm up) is declared by its model (``models.traits``) and its recipe module (``recipes``), and the loop asks
    for it through ``recipes.parts_of``: no name in training/, data/, launch/ or deployment/ names the network or its
    whitening."""
    named = [
        f"{dotted(path, PACKAGE)}:{node.lineno} {name}"
        for room in ("training", "data", "launch", "deployment")
        for path in sorted((PACKAGE / room).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        for name in [getattr(node, "name", None) or getattr(node, "id", None) or getattr(node, "attr", None)]
        if isinstance(name, str) and any(word in name.lower() for word in ("airbench", "whiten"))
    ]
    assert named == []


# the rules that settle an auto (or find) key or fit a value to the run, each declared in its own module: the planner
# alone calls them
SETTLING_RULES = {
    "candidates_for",  # export --quantize=int8's calibration_method=auto (config.export_flags)
    "settle_data_on_device",
    "workers_for",
    "settle_augment_per_pass",
    "fused_on",
    "warm_up_steps_for",
    "setup_precision",
    "settled_precision",
    "decide",
    "settle_channels_last",
    "checkpoints_after_steps",  # a file's or the default's checkpoint_every fitted to accumulation (config_fitting)
    "warmup_scaled",  # a file's or the default's warmup fitted to a shorter run (config_fitting)
}
PLANNER = "training.setup.plan"
PLANNERS = {PLANNER, "training.setup.config_fitting"}  # config_fitting: the planner's torch-free part


def calls_of(path: Path, names: set[str]) -> set[str]:
    """The names among ``names`` that the file calls, as ``name(...)`` or ``module.name(...)``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in names:
                found.add(called)
    return found


def test_every_auto_is_settled_by_the_planner_alone():
    """run, lr-find, evaluate and batch-size ask training.setup.plan; a module that settled a key itself (as
    setup_data once settled data_on_device from the config it was given) would decide apart from the plan the run
    records; not even the module that declares the rule calls it."""
    elsewhere = [
        f"{dotted(path, PACKAGE)} calls {name}"
        for path in sources()
        for name in sorted(calls_of(path, SETTLING_RULES))
        if dotted(path, PACKAGE) not in PLANNERS
    ]
    assert elsewhere == []


def test_the_planner_check_sees_a_rule_called_outside_the_planner(tmp_path):
    (tmp_path / "loader.py").write_text("from x import loaders\n\ndef f(c, d):\n    return loaders.workers_for(c, d)\n")
    assert calls_of(tmp_path / "loader.py", SETTLING_RULES) == {"workers_for"}


def test_the_precision_is_chosen_by_the_planner_alone():
    """with_amp=auto's rule (system.precision: choose_precision, automatic_precision) is called by the planner and
    the process set-up it calls (doctor and batch-size ask the planner), nowhere else."""
    callers = {
        dotted(path, PACKAGE) for path in sources() if calls_of(path, {"choose_precision", "automatic_precision"})
    }
    assert callers <= {PLANNER, "training.setup.process_setup", "system.precision"}, callers

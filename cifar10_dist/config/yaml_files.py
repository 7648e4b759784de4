"""Config and search-space files: which file a ``--config`` names (a path, or the name of a shipped one), and
reading one strictly: UTF-8, spaces for indentation, each key once, a mapping at the top. Every other case is one
line naming the file, the line and what is wrong there (a ``UserError``: exit 2, before anything is written)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cifar10_dist.errors import UserError, first_line

SHIPPED = Path(__file__).resolve().parents[1] / "configs"  # the configs the package ships (package data)
SUFFIXES = (".yaml", ".yml")


def shipped_configs() -> dict[str, Path]:
    """The shipped configs by name (demo, default, fast, ..., the search spaces space_*), sorted."""
    return {path.stem: path for path in sorted(SHIPPED.glob("*.yaml"))}


@dataclass(frozen=True)
class ConfigSource:
    """The file a config was read from: its path, and whether the package ships it (``--config=NAME``)."""

    path: str
    shipped: bool

    def describe(self) -> str:
        """'demo (shipped: /.../configs/demo.yaml)' or the path of the user's own file."""
        path = Path(self.path)
        return f"{path.stem} (shipped: {path})" if self.shipped else str(path)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "shipped": self.shipped}


def config_path(given: str | Path) -> Path:
    """A config (or search space) as given: a path to a file that exists wins; otherwise a name with no folder, or
    with the checkout's ``configs/``, is the shipped one of that name (``demo``, ``fast.yaml``,
    ``configs/fast.yaml``: the same from any folder and from an installed wheel). A path that is neither is
    returned as given, for its one-line error."""
    path = Path(given)
    if path.exists() or path.parent not in (Path("."), Path("configs")):
        return path
    return shipped_configs().get(path.name.removesuffix(".yaml"), path)


def source_of(path: Path) -> ConfigSource:
    resolved = path.resolve()
    return ConfigSource(str(resolved), resolved.parent == SHIPPED)


def unread_namesake(given: str | Path, path: Path) -> Path | None:
    """A file in the working folder that a bare name (``--config=demo``) did not read because the shipped config of
    that name did: ``demo.yaml`` here (None when there is none, or the name read a file of the user's)."""
    if Path(given).parent != Path(".") or not source_of(path).shipped:
        return None
    for suffix in SUFFIXES:
        candidate = Path(f"{Path(given).name.removesuffix(suffix)}{suffix}")
        if candidate.is_file() and candidate.resolve() != path.resolve():
            return candidate
    return None


def read_yaml_mapping(path: Path, what: str = "config file", example: str = "default") -> dict[str, Any]:
    """A YAML file holding a mapping ({} when empty); every other case one line naming the file (``what``), where
    in it, and what is wanted (a YAML file like ``example``). Anything that reads as a file works (``/dev/null``,
    a shell's ``<(...)``)."""
    if path.is_dir():
        raise UserError(f"{what} '{path}' is a folder: give a YAML file (e.g. {example})")
    if not path.exists():
        raise UserError(f"{what} '{path}' does not exist: {_what_exists(path, example)}")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise UserError(f"{what} '{path}' cannot be read: {error.strerror}") from error
    loaded = parse_mapping(_decoded(raw, f"{what} '{path}'"), f"{what} '{path}'")
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UserError(f"{what} '{path}' must hold a mapping of key: value, not {type(loaded).__name__}")
    return loaded


def _what_exists(path: Path, example: str) -> str:
    """The advice for a file that does not exist: the closest shipped name or file beside it, then what is shipped."""
    names = shipped_configs()
    stem = path.name
    for suffix in SUFFIXES:
        stem = stem.removesuffix(suffix)
    close = difflib.get_close_matches(stem, list(names), n=1, cutoff=0.6)
    beside = sorted(p.name for p in path.parent.glob("*") if p.suffix in SUFFIXES) if path.parent.is_dir() else []
    near = difflib.get_close_matches(path.name, beside, n=1, cutoff=0.75)
    if near:
        hint = f"did you mean '{near[0] if path.parent == Path('.') else path.parent / near[0]}'? "
    elif close and path.parent in (Path("."), Path("configs")):
        hint = f"did you mean '{close[0] if path.parent == Path('.') else f'configs/{close[0]}.yaml'}'? "
    else:
        hint = ""
    return (
        f"{hint}give a path to a YAML file, or the name of a shipped one (e.g. {example}; shipped: {', '.join(names)})"
    )


def _decoded(raw: bytes, what: str) -> str:
    """The file's text (UTF-8, a byte-order mark allowed), or one line naming the line and column of the first byte
    that is not UTF-8."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        before = raw[: error.start]
        line, column = before.count(b"\n") + 1, error.start - (before.rfind(b"\n") + 1) + 1
        raise UserError(
            f"{what} is not UTF-8 text at line {line}, column {column}: byte 0x{raw[error.start]:02x} "
            "(saved as Latin-1 or Windows-1252?): save it as UTF-8"
        ) from error


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names a key twice (YAML forbids it; PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(f"gives '{key}' twice (lines {seen[key]} and {line}): keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    pass


def parse_mapping(text: str, what: str) -> Any:
    """YAML text read strictly (``_UniqueKeyLoader``); a syntax error as one line with its line and column."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except _DuplicateKey as error:
        raise UserError(f"{what} {error}") from error
    except yaml.YAMLError as error:
        raise UserError(f"{what} {_syntax_error(error, text)}") from error


def _syntax_error(error: yaml.YAMLError, text: str) -> str:
    """Where and what: 'is not valid YAML at line 2, column 1: a tab ...; YAML takes spaces only'."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or first_line(error)
    if mark is None:
        return f"is not valid YAML: {problem}"
    where = f"is not valid YAML at line {mark.line + 1}, column {mark.column + 1}"
    lines = text.splitlines()
    at = lines[mark.line] if mark.line < len(lines) else ""
    if "\\t" in problem or "\t" in at[: mark.column + 1]:
        return f"{where}: a tab indents or separates this line, and YAML takes spaces only (replace the tab)"
    return f"{where}: {problem}"

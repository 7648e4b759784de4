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


MAX_FILE_BYTES = 1024 * 1024  # a config or search space is a few KB of YAML
MAX_VALUES = 100_000  # what a file's values may hold once its aliases are followed (scalars, lists and mappings)


@dataclass(frozen=True)
class YamlMapping:
    """A YAML file's top-level mapping (``values``), and the line each of its keys stands on (``lines``), so that
    an error about a key can say where it is."""

    path: Path
    values: dict[str, Any]
    lines: dict[str, int]


def read_yaml_file(path: Path, what: str = "config file", example: str = "default") -> YamlMapping:
    """A YAML file holding a mapping (empty when the file is); every other case one line naming the file
    (``what``), where in it, and what is wanted (a YAML file like ``example``). The file is untrusted: at most
    ``MAX_FILE_BYTES``, and its aliases may not make its values hold more than ``MAX_VALUES`` (an alias bomb is
    refused before anything is built from it). Anything that reads as a file works (``/dev/null``, a shell's
    ``<(...)``)."""
    if path.is_dir():
        raise UserError(f"{what} '{path}' is a folder: give a YAML file (e.g. {example})")
    if not path.exists():
        raise UserError(f"{what} '{path}' does not exist: {_what_exists(path, example)}")
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise UserError(f"{what} '{path}' cannot be read: {error.strerror}") from error
    if len(raw) > MAX_FILE_BYTES:
        raise UserError(
            f"{what} '{path}' is over {MAX_FILE_BYTES // 1024} KiB: a {what} is a few KB of YAML (e.g. {example})"
        )
    named = f"{what} '{path}'"
    loaded, lines = parse_mapping(_decoded(raw, named), named)
    if loaded is None:
        return YamlMapping(path, {}, {})
    if not isinstance(loaded, dict):
        raise UserError(f"{named} must hold a mapping of key: value, not {type(loaded).__name__}")
    return YamlMapping(path, loaded, lines)


def _what_exists(path: Path, example: str) -> str:
    """The advice for a file that does not exist: the closest shipped name or file beside it, then what is shipped."""
    names = shipped_configs()
    stem = path.name
    for suffix in SUFFIXES:
        stem = stem.removesuffix(suffix)
    close = difflib.get_close_matches(stem.lower(), list(names), n=1, cutoff=0.6)  # (the names are lower case)
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


MERGE_TAG = "tag:yaml.org,2002:merge"


def parse_mapping(text: str, what: str) -> tuple[Any, dict[str, int]]:
    """YAML text read strictly, with PyYAML's safe loader: each key of a mapping once (YAML forbids a second; PyYAML
    keeps the last), merge keys (``<<: *base``) as YAML defines them, and at most ``MAX_VALUES`` values once its
    aliases are followed, all checked on the parsed nodes before anything is built. Returns the document and the
    line of each key of its top-level mapping. A syntax error is one line with its line and column."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _check_size(node, what)
        _check_unique_keys(node, what)
        lines = {
            str(key.value): key.start_mark.line + 1
            for key, _ in (node.value if isinstance(node, yaml.MappingNode) else [])
            if isinstance(key, yaml.ScalarNode) and key.tag != MERGE_TAG
        }
        return loader.construct_document(node), lines
    except yaml.YAMLError as error:
        raise UserError(f"{what} {_syntax_error(error, text)}") from error
    except RecursionError as error:
        raise UserError(f"{what} nests its values too deeply to be a config: write them out flat") from error
    finally:
        loader.dispose()


class _HoldsItself(Exception):
    pass


def _check_size(root: yaml.Node, what: str) -> None:
    """Refuse a document whose values hold more than ``MAX_VALUES`` once every alias is followed (an alias bomb:
    a few lines that would expand to billions), or a value that holds itself; each node is counted once, so the
    check costs what the file's own lines do. Names the line of the top-level key where it happens."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _HoldsItself
        open_nodes.add(id(node))
        sizes[id(node)] = min(1 + sum(size(child) for child in _children(node)), MAX_VALUES + 1)
        open_nodes.discard(id(node))
        return sizes[id(node)]

    pairs = root.value if isinstance(root, yaml.MappingNode) else [(root, root)]
    for key, value in pairs:
        where = f"{what} line {key.start_mark.line + 1}"
        try:
            too_many = size(value) > MAX_VALUES
        except _HoldsItself:
            raise UserError(f"{where}: an alias (*name) in the value there refers to the value itself: write it out")
        if too_many:
            raise UserError(
                f"{where}: the value there holds more than {MAX_VALUES:,} values once its aliases (*name) are "
                "followed: a config holds a few hundred; write the values out"
            )


def _check_unique_keys(node: yaml.Node, what: str, seen_nodes: set[int] | None = None) -> None:
    """Each mapping in the document names each key once (merge keys aside: what they bring may be overridden)."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[Any, int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE_TAG:
                continue
            line = key.start_mark.line + 1
            if (key.tag, key.value) in lines:
                raise UserError(
                    f"{what} gives '{key.value}' twice (lines {lines[(key.tag, key.value)]} and {line}): keep one"
                )
            lines[(key.tag, key.value)] = line
    for child in _children(node):
        _check_unique_keys(child, what, seen_nodes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    """A sequence's items, a mapping's keys and values, a scalar's nothing."""
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


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

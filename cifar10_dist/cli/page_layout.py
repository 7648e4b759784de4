"""How a help page lays out its words: a flag's line (the flag and its default, then its text from a column,
wrapped to the page's width), a usage line, a block of flag lines. Plain strings; the declarations they show are
``config.commands``' and ``config.fields``'."""

from __future__ import annotations

import textwrap
from typing import Iterable

from cifar10_dist.config.commands import Flag

HELP_COLUMN = 29  # where a flag's help starts on a help page
PAGE_WIDTH = 80  # a help page's width where no terminal says otherwise (shutil.get_terminal_size's fallback)


def option_line(head: str, text: str, width: int = PAGE_WIDTH, column: int = HELP_COLUMN) -> str:
    """``head`` (a flag and its default), then ``text`` from ``column``, wrapped to ``width``, a paragraph for each
    of its lines; a head that reaches the column stands on its own line (cut at the width where longer)."""
    indent = " " * column
    lines = [
        line
        for paragraph in text.split("\n")
        for line in textwrap.wrap(
            paragraph, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )
        or [indent]
    ]
    if len(head) >= column - 1:
        return "\n".join([head if len(head) <= width else head[: width - 3] + "...", *lines])
    return head.ljust(column) + lines[0].lstrip() + "".join("\n" + line for line in lines[1:])


def flag_line(flag: Flag, width: int = PAGE_WIDTH) -> str:
    """The flag on a help page: ``--name=default`` (``--name`` for a switch), then its help, wrapped to ``width``."""
    head = (
        f"  --{flag.name}"
        if flag.default is False and flag.shown is None
        else f"  --{flag.name}={flag.shown if flag.shown is not None else flag.default}"
    )
    return option_line(head, flag.help, width)


def help_block(*declared: Iterable[Flag], width: int = PAGE_WIDTH) -> str:
    """The flag lines of a help page, in the order declared."""
    return "\n".join(flag_line(one, width) for flags in declared for one in flags)


def usage(
    command: str,
    *declared: Iterable[Flag],
    before: Iterable[str] = (),
    after: Iterable[str] = (),
    width: int = PAGE_WIDTH,
) -> str:
    """A help page's usage, made from the declared flags: the required ones, the words ``before`` (paths), every
    other flag with its default, then ``after``; wrapped under the command at ``width``."""
    flags = [one for group in declared for one in group]
    words = [
        *(one.usage() for one in flags if one.required),
        *before,
        *(one.usage() for one in flags if not one.required),
        *after,
    ]
    head = f"Usage: cifar10-dist {command} "
    lines, line = [], head
    for word in words:
        if len(line) + len(word) > width and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += word + " "
    return "\n".join([*lines, line.rstrip()])

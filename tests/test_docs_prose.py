"""The docs are written for people: across README.md and docs/*.md the prose (tables, headings, code blocks and
comments aside) has sentences of about 20 words, median at most 20 and none over 60, measured as the before-stop
check measures them; and no fact a user needs is dropped: every config key, command and shipped config is named.

Run ``python tests/test_docs_prose.py [PAGE ...]`` to see each page's figures and its sentences over 40 words."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MEDIAN_WORDS, MOST_WORDS = 20, 60


def sentences(page: Path) -> list[str]:
    """The page's prose sentences: code blocks and comments removed, table rows and headings left out, the rest
    joined and split after a full stop, question or exclamation mark that a capital, backtick, asterisk, bracket or
    parenthesis follows; fragments of two words or fewer are not sentences."""
    text = re.sub(r"<!--.*?-->", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith(("|", "#"))]
    split = re.split(r"(?<=[.!?])\s+(?=[A-Z`*(\[])", " ".join(lines))
    return [sentence for sentence in split if len(sentence.split()) > 2]


def test_prose_sentences_are_short():
    lengths = {page.name: [len(sentence.split()) for sentence in sentences(page)] for page in PAGES}
    every = [length for page in lengths.values() for length in page]
    longest = {name: max(found) for name, found in lengths.items() if found and max(found) > MOST_WORDS}
    assert statistics.median(every) <= MEDIAN_WORDS, f"median {statistics.median(every)} words"
    assert longest == {}, f"sentences over {MOST_WORDS} words (python tests/test_docs_prose.py shows them)"


def test_every_key_command_and_shipped_config_is_named_in_the_docs():
    from cifar10_dist.cli.entry import COMMANDS
    from cifar10_dist.config import FIELDS, shipped_configs

    text = "\n".join(page.read_text() for page in PAGES)
    keys = [name for name, field in FIELDS.items() if not field.metadata["internal"]]
    assert [key for key in keys if f"`{key}`" not in text and f"--{key}" not in text] == []
    assert [command for command in COMMANDS if f"cifar10-dist {command}" not in text] == []
    assert [name for name in shipped_configs() if name not in text] == []


def report(pages: list[Path]) -> None:
    for page in pages:
        found = sentences(page)
        lengths = [len(sentence.split()) for sentence in found]
        if not lengths:
            continue
        print(f"{page.name}: {len(lengths)} sentences, median {statistics.median(lengths)}, longest {max(lengths)}")
        for sentence in found:
            if len(sentence.split()) > 40:
                print(f"  {len(sentence.split())}: {sentence[:160]}...")
    every = [len(sentence.split()) for page in PAGES for sentence in sentences(page)]
    print(f"all pages: median {statistics.median(every)}, over {MOST_WORDS}: {sum(n > MOST_WORDS for n in every)}")


if __name__ == "__main__":
    report([Path(arg).resolve() for arg in sys.argv[1:]] or PAGES)

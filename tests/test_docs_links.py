"""Links between the pages lead somewhere: in README.md and docs/*.md every relative link names a file that exists,
and a link to ``#anchor`` (on its own page or another) names a heading that page has, as GitHub makes its
anchors (lowercase, punctuation dropped, spaces as hyphens, a repeated heading numbered -1, -2, ...)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]+))?\)")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text (headings inside code blocks are not headings)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else re.match(r"#{1,6} (.+)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(f"{slug}-{counts[slug]}" if slug in counts else slug)
            counts[slug] = counts.get(slug, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file or heading is missing, as written."""
    broken = []
    for target, anchor in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        destination = (page.parent / target) if target else page
        if not destination.exists():
            broken.append(f"{target}#{anchor}" if anchor else target)
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination.read_text()):
            broken.append(f"{target}#{anchor}")
    return broken


def test_the_anchors_are_githubs():
    text = "# Fast recipe\n## Doing less work: `fast_lean.yaml`, 50%\n```\n# not a heading\n```\n## Fast recipe\n"
    assert anchors(text) == {"fast-recipe", "doing-less-work-fast_leanyaml-50", "fast-recipe-1"}


def test_a_missing_heading_or_file_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Here\nSee [here](#here), [there](#there), [gone](gone.md) and [site](https://x.org/#y).\n")
    assert broken_links(page) == ["#there", "gone.md"]


def test_every_link_between_the_pages_leads_somewhere():
    broken = {page.name: found for page in PAGES if (found := broken_links(page))}
    assert broken == {}

"""The documentation site's pages, their links and their fenced Python examples.

Shared by ``test_docs_site.py`` (nav, links, anchors, Ray names: no Ray, no lumos
import) and ``test_docs_examples.py`` (runs the examples on the session's cluster).

A fenced ``python`` block is an example that runs, in page order, in one namespace per
page (a later block may use what an earlier one defined), unless the line just above
its fence (blank lines aside) is ``<!-- no-test: why -->``: a fragment, or an example
that needs what a test machine lacks (a cluster to join, a tracking server), with the
reason.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,}|~{3,})(?P<info>[^`]*)$")
NO_TEST = re.compile(r"^\s*<!--\s*no-test:\s*(?P<why>\S.*?)\s*-->\s*$")
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.+?)\s*#*\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  # relative to docs/
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    no_test: str | None  # the reason given in <!-- no-test: ... -->, else None


def pages() -> list[str]:
    """Every Markdown page under docs/, relative to it (the hooks folder is not a page)."""
    return sorted(
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if "hooks" not in p.relative_to(DOCS).parts
    )


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of ``page``, in order."""
    lines = (DOCS / page).read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, ticks = match.group("indent"), match.group("ticks")
        lang = match.group("info").strip().split(" ")[0] if match.group("info").strip() else ""
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != ticks:
            body.append(lines[i])
            i += 1
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        marker = NO_TEST.match(lines[prev]) if prev >= 0 else None
        code = textwrap.dedent(
            "\n".join(b[len(indent) :] if b.startswith(indent) else b for b in body)
        )
        out.append(
            Block(page, start + 1, lang, code + "\n", marker.group("why") if marker else None)
        )
        i += 1
    return out


def runnable(page: str) -> list[Block]:
    """The page's Python examples that run (no ``no-test`` marker)."""
    return [b for b in blocks(page) if b.lang == "python" and b.no_test is None]


def prose(page: str) -> str:
    """The page's text outside fenced blocks (where links and headings count)."""
    lines = (DOCS / page).read_text().splitlines()
    keep: list[str] = []
    fence: str | None = None
    for line in lines:
        match = FENCE.match(line)
        if fence is None and match is not None:
            fence = match.group("ticks")
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            keep.append(line)
    return "\n".join(keep)


def slug(title: str) -> str:
    """The anchor Python-Markdown's ``toc`` extension gives a heading (its default slugify)."""
    import unicodedata

    text = re.sub(r"`([^`]*)`", r"\1", title)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: str) -> set[str]:
    """The heading anchors of ``page`` (a repeated heading gets ``_1``, ``_2``, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose(page).splitlines():
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group("title"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}_{n}")
    return out


def links(page: str) -> list[str]:
    """Every link and image target in the page's prose."""
    return [m.group("target") for m in LINK.finditer(prose(page))]


def nav_pages(nav: object) -> list[str]:
    """The pages named in mkdocs.yml's ``nav`` (nested sections flattened)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []

"""Every relative link in README.md and docs/*.md points at a file or folder that exists (anchors not checked)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and [text](target "title"); inline code spans are dropped first, so `[x](y)` in code is not a link
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def relative_links(page: Path) -> list[str]:
    """The targets of the page's links that are not URLs or pure anchors, without their ``#anchor``."""
    targets = LINK.findall(CODE.sub("", page.read_text(encoding="utf8")))
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def test_the_pages_have_links_to_check():
    assert (ROOT / "docs").is_dir() and len(PAGES) > 1
    assert sum(len(relative_links(page)) for page in PAGES) > 20


def test_every_relative_link_resolves():
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in PAGES
        for target in relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, "broken relative links:\n" + "\n".join(broken)

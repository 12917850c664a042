"""The documentation's relative links point at files that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted(ROOT.glob("platform/**/README.md")),
    *ROOT.glob("helm/**/README.md"),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(doc: Path) -> list[str]:
    targets = (m.group(1).split("#")[0] for m in LINK.finditer(doc.read_text()))
    return [t for t in targets if t and not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    links = relative_links(doc)
    missing = [link for link in links if not (doc.parent / link).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def test_the_readme_links_the_benchmark_results():
    assert "platform/infergate/bench/results/README.md" in relative_links(ROOT / "README.md")

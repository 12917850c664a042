"""The documentation's relative links point at files that exist, and the README's links to
a heading (its own, or a docs page's) name one that exists. Links between docs pages are
checked by the site's strict build (tests/integration/test_docs_site.py)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted(ROOT.glob("docs/*.md")),
    *sorted(ROOT.glob("platform/**/README.md")),
    *ROOT.glob("helm/**/README.md"),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCED = re.compile(r"^```.*?^```", re.M | re.S)


def relative_links(doc: Path, anchors: bool = False) -> list[str]:
    targets = (m.group(1) for m in LINK.finditer(doc.read_text()))
    if not anchors:
        targets = (t.split("#")[0] for t in targets)
    return [t for t in targets if t and not re.match(r"[a-z]+:", t)]


def heading_anchors(doc: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as both a forge and MkDocs spell them for
    plain headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", FENCED.sub("", doc.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    links = relative_links(doc)
    missing = [link for link in links if not (doc.parent / link).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def test_the_readmes_links_to_headings_find_them():
    readme = ROOT / "README.md"
    checked = 0
    for link in relative_links(readme, anchors=True):
        path, _, anchor = link.partition("#")
        if anchor:
            target = readme.parent / path if path else readme
            assert anchor in heading_anchors(target), f"README.md: no heading for {link}"
            checked += 1
    assert checked  # the README does link to headings


def test_the_readme_links_the_benchmark_results():
    assert "platform/infergate/bench/results/README.md" in relative_links(ROOT / "README.md")


def test_the_readme_links_every_docs_page():
    linked = set(relative_links(ROOT / "README.md"))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"the README does not link {sorted(pages - linked)}"


# The demo's `ner` model is redistributed under CC BY 4.0, which asks for its source and
# licence to be given; nothing else in the documentation links outside the repository.
ATTRIBUTION = {
    "https://creativecommons.org/licenses/by/4.0/",
    "https://huggingface.co/nationaldesignstudio/rampart",
}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_outside_the_repository_is_linked_but_the_attribution(doc):
    prose = re.sub(r"`[^`]*`", "", FENCED.sub("", doc.read_text()))  # examples hold addresses
    outside = set(re.findall(r"\bhttps?://[^\s)>\]]+", prose)) - ATTRIBUTION
    assert not outside, f"{doc.relative_to(ROOT)} links outside the repository: {outside}"

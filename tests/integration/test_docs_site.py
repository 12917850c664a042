"""The documentation site (mkdocs.yml, docs/*.md) builds with `mkdocs build --strict`, the
command docs/index.md shows: every link between its pages and every anchor resolves, and
every page is in the nav. A link to a missing heading fails the build, and the built site
loads no script or stylesheet from outside."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from readme_blocks import ROOT, bash_commands, readme_blocks

HERE = f"tests/integration/{Path(__file__).name}"


def documented_build() -> list[str]:
    """The words of the build command docs/index.md shows (its block is checked here)."""
    (block,) = [
        b for b in readme_blocks() if b.marker and b.marker[0] == "checked by"
        and b.marker[1].split()[0] == HERE
    ]  # fmt: skip
    (command,) = bash_commands(block.code)
    return shlex.split(command)


def build(project: Path, site: Path, options: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", *options, "--site-dir", str(site)],
        cwd=project, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_the_site_builds_strictly(tmp_path: Path):
    words = documented_build()
    assert words[:3] == [".venv/bin/mkdocs", "build", "--strict"], words
    site = tmp_path / "site"
    run = build(ROOT, site, words[2:])
    assert run.returncode == 0, run.stdout + run.stderr
    built = {p.parent.name for p in site.glob("*/index.html")}
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"}
    assert (site / "index.html").is_file() and pages <= built, (pages, built)
    outside = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
    for page in site.rglob("*.html"):
        assert not outside.search(page.read_text()), f"{page} loads something from outside"


def test_a_link_to_a_missing_heading_fails_the_build(tmp_path: Path):
    """`anchors` is only logged by default; mkdocs.yml makes it a warning, which --strict
    turns into an error."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project)
    shutil.copytree(ROOT / "docs", project / "docs")
    with (project / "docs" / "index.md").open("a") as index:
        index.write("\nSee [the top](index.md#no-such-heading).\n")
    run = build(project, tmp_path / "site", ["--strict"])
    assert run.returncode != 0
    assert re.search(r"WARNING .*#no-such-heading", run.stdout + run.stderr), run.stderr

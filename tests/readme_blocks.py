"""The fenced code blocks of the README and of the documentation site's pages, what each
says about itself, and how to compare what a block prints with what its page says it
prints. Pure: reads text, runs nothing.

The pages are README.md, then docs/*.md in the order of mkdocs.yml's nav: the order a
reader meets them, and the order tests/e2e/test_readme.py runs their blocks in (the
canary rollout's blocks roll out the model the registration page's blocks registered).

Every fenced block has a language, and a ``bash`` or ``python`` block is one of:

- run by ``tests/e2e/test_readme.py`` (the default). What it prints must match what the
  page says: a ``json`` or ``text`` block right after a ``bash`` block is its output
  (none: it prints nothing); in a ``python`` block each ``print(...)`` line ends with a
  ``# comment`` holding what that call prints.
- marked, by an HTML comment on the line before its fence:
  ``<!-- not run: REASON -->`` (it needs what this machine lacks, say), or
  ``<!-- checked by tests/PATH.py -->`` (a test there reads the block from its page, and
  names that page, e.g. ``docs/registration.md``).

A ``text`` block not right after a command block is a diagram or a listing. In expected
outputs ``...`` stands for any text, and a decimal number for any number within one unit
of its last digit (``0.98`` matches 0.97 to 0.99); integers and other text are literal,
and whitespace matches any whitespace.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MKDOCS = ROOT / "mkdocs.yml"
COMMAND_LANGUAGES = ("bash", "python")
OUTPUT_LANGUAGES = ("json", "text")
FENCE = re.compile(r"^```(.*)$")
PRINT = re.compile(r"\s*print\(.*?\)(?:\s+#\s?(.*?))?\s*$")  # print(...)  # OUTPUT
MARKER = re.compile(r"^<!--\s*(not run|checked by)\s*:?\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced block: ``line`` is the line of its opening fence (1-based)."""

    line: int
    language: str
    code: str
    marker: tuple[str, str] | None = None  # ("not run", reason) or ("checked by", path)
    output: Block | None = None  # the output block right after a command block
    page: str = "README.md"  # the file it is in, relative to the repository

    @property
    def runs(self) -> bool:
        return self.language in COMMAND_LANGUAGES and self.marker is None

    @property
    def name(self) -> str:
        """A short id for test reports: the line and the first command's first words."""
        first = next((s for s in self.code.splitlines() if s and not s.startswith("#")), "")
        words = [
            re.sub(r"^\w+://[^/]+/|^\.venv/bin/", "", word)
            for word in first.split()
            if not word.startswith("-") and not re.match(r"[A-Z_]+=", word)
        ]
        words_id = re.sub(r"[^\w.]+", "-", " ".join(words[:3])).strip("-")
        return f"{Path(self.page).stem}-L{self.line}-{words_id}"


def pages() -> list[Path]:
    """README.md, then the site's pages in the order of mkdocs.yml's nav."""
    site = yaml.safe_load(MKDOCS.read_text())
    docs = ROOT / site.get("docs_dir", "docs")
    return [README, *(docs / name for name in _nav_files(site["nav"]))]


def _nav_files(nav: list[Any]) -> list[str]:
    """The files of a nav, in order: entries are ``file``, ``{title: file}`` or
    ``{title: [entries]}``."""
    files: list[str] = []
    for entry in nav:
        for item in entry.values() if isinstance(entry, dict) else [entry]:
            files.extend(_nav_files(item) if isinstance(item, list) else [item])
    return files


def read_blocks(text: str, page: str = "README.md") -> tuple[list[Block], list[str]]:
    """Every fenced block of a Markdown ``text`` (the file ``page``), each output block
    attached to the command block before it, and the problems found (a block that is
    neither run nor marked, ...)."""
    lines = text.splitlines()
    raw: list[tuple[int, str, str, str | None, int]] = []  # line, language, code, marker, end
    problems: list[str] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            if lines[i].lstrip().startswith("```"):  # skipped, with the block it opens
                problems.append(f"line {i + 1}: an indented fence, which this reader skips")
                i = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), i)
            i += 1
            continue
        start, language = i, fence.group(1).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        if end is None:
            problems.append(f"line {start + 1}: the block is never closed")
            break
        before = lines[start - 1].strip() if start > 0 else ""
        marker = before if before.startswith("<!--") else None
        raw.append((start + 1, language, "\n".join(lines[start + 1 : end]) + "\n", marker, end))
        i = end + 1
    blocks: list[Block] = []
    previous_end = -2
    for line, language, code, marker_text, end in raw:
        where = f"line {line}"
        adjacent = all(not s.strip() for s in lines[previous_end + 1 : line - 1])
        previous_end = end
        if language not in COMMAND_LANGUAGES + OUTPUT_LANGUAGES:
            problems.append(
                f"{where}: a block of language {language!r}; give it one of "
                f"{', '.join(COMMAND_LANGUAGES + OUTPUT_LANGUAGES)}"
            )
            continue
        marker = None
        if marker_text is not None:
            parsed = MARKER.match(marker_text)
            if not parsed or not parsed.group(2):
                problems.append(
                    f"{where}: {marker_text!r} is not '<!-- not run: REASON -->' "
                    "or '<!-- checked by tests/PATH.py -->'"
                )
            else:
                marker = (parsed.group(1), parsed.group(2))
        previous = blocks[-1] if blocks else None
        is_output = (
            language in OUTPUT_LANGUAGES
            and adjacent
            and previous is not None
            and previous.language in COMMAND_LANGUAGES
            and previous.output is None
        )
        if is_output and previous is not None:  # (a marker's line would part the two)
            blocks[-1] = Block(previous.line, previous.language, previous.code, previous.marker,
                               Block(line, language, code, page=page), page)  # fmt: skip
            continue
        if language == "json":
            problems.append(f"{where}: a json block that is no command's output")
        if language in OUTPUT_LANGUAGES and marker is not None:
            problems.append(f"{where}: a {language} block runs nothing; it needs no marker")
        blocks.append(Block(line, language, code, marker, page=page))
    for block in blocks:
        problems.extend(_command_problems(block))
    return blocks, problems


def _command_problems(block: Block) -> list[str]:
    where = f"line {block.line}"
    problems = []
    if block.marker and block.marker[0] == "checked by":
        path = ROOT / block.marker[1].split()[0]
        if not path.is_file():
            problems.append(f"{where}: checked by {block.marker[1]}, which is not a file")
        elif block.page not in path.read_text():
            problems.append(f"{where}: {block.marker[1]} does not read {block.page}")
    if block.runs and block.language == "python":
        if block.output is not None:
            problems.append(f"{where}: say what a python block prints in its print lines")
        for number, statement in enumerate(block.code.splitlines(), start=block.line + 1):
            found = PRINT.match(statement)
            if found and not found.group(1):
                problems.append(
                    f"line {number}: say what it prints in a comment: print(...)  # OUTPUT"
                )
    return problems


def printed_comments(code: str) -> list[str]:
    """What each ``print(...)  # OUTPUT`` line of python ``code`` says it prints, in order."""
    return [found.group(1) or "" for line in code.splitlines() if (found := PRINT.match(line))]


def readme_blocks() -> list[Block]:
    """The blocks of every page (README.md, then the site's pages in its nav's order); raises
    when a page has problems (the unit test lists them)."""
    blocks: list[Block] = []
    for path in pages():
        page = str(path.relative_to(ROOT))
        found, problems = read_blocks(path.read_text(), page)
        if problems:
            raise ValueError(f"{page}: " + "; ".join(problems))
        blocks.extend(found)
    return blocks


def bash_commands(code: str) -> list[str]:
    """The commands of a bash block, one per item, continuation lines joined; comments and
    blank lines dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", code)
    return [s.strip() for s in joined.splitlines() if s.strip() and not s.lstrip().startswith("#")]


# -- expected output ----------------------------------------------------------------------

_EXPECTED_TOKEN = re.compile(r"(\.\.\.)|(\s+)|((?<![\w.])-?\d+\.\d+(?![\w.]))|(.)", re.S)
_NUMBER = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"


def _pattern(expected: str) -> tuple[re.Pattern[str], list[str]]:
    parts: list[str] = []
    decimals: list[str] = []
    tokens = list(_EXPECTED_TOKEN.finditer(expected))
    for index, token in enumerate(tokens):
        ellipsis, space, decimal, other = token.groups()
        if ellipsis:
            parts.append(".*?")
        elif space:
            before = tokens[index - 1].group() if index else ""
            after = tokens[index + 1].group() if index + 1 < len(tokens) else ""
            word_gap = re.match(r"\w", before[-1:]) and re.match(r"\w", after[:1])
            parts.append(r"\s+" if word_gap else r"\s*")
        elif decimal:
            parts.append(_NUMBER)
            decimals.append(decimal)
        else:
            parts.append(re.escape(other))
    return re.compile("".join(parts), re.S), decimals


def output_mismatch(expected: str, actual: str) -> str | None:
    """None when ``actual`` is what ``expected`` says (see the module's docstring); else
    what differs."""
    pattern, decimals = _pattern(expected.strip())
    found = pattern.fullmatch(actual.strip())
    if found is None:
        return f"expected:\n{expected.strip()}\ngot:\n{actual.strip()}"
    for written, got in zip(decimals, found.groups(), strict=True):
        unit = 10.0 ** -len(written.split(".")[1])
        if not math.isclose(float(got), float(written), abs_tol=unit * 1.0001):
            return f"{got} where the page says {written}\ngot:\n{actual.strip()}"
    return None

"""A real Prometheus for tests: started from the installed binary in a tmp folder on a
free port, stopped (by its own process handle) when the test is done."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from infergate.stack.processes import free_ports

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

needs_prometheus = pytest.mark.machine(
    "prometheus", None if PROMETHEUS and PROMTOOL else "no prometheus/promtool (Debian package)"
)


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@contextmanager
def running_prometheus(
    config: str, workdir: Path, files: dict[str, str] | None = None
) -> Iterator[str]:
    """Start Prometheus with ``config`` (YAML text, plus ``files`` beside it); yield its URL."""
    assert PROMETHEUS is not None
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(config)
    for name, text in (files or {}).items():
        (workdir / name).write_text(text)
    [port] = free_ports(1)
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url, process, workdir), 30, "Prometheus to be ready")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _ready(url: str, process: subprocess.Popen[bytes], workdir: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(
            "Prometheus exited:\n" + (workdir / "prometheus.log").read_text()[-2000:]
        )
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, expr: str) -> dict[str, Any]:
    """The JSON body of an instant query (success or error)."""
    return httpx.post(f"{url}/api/v1/query", data={"query": expr}, timeout=5).json()


# Words of PromQL that are not metric names when not followed by "(".
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan", "Inf", "NaN"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small lexer, enough for ours):
    strings, ranges, grouping label lists, matchers, durations and numbers are removed, and an
    identifier followed by "(" is a function or an aggregation."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', " ", expr)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"(?<![\w:])\d+(?:ms|[smhdwy])\b", " ", text)  # offset durations
    text = re.sub(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group() in _KEYWORDS:
            continue
        names.add(match.group())
    return names

"""Memory and CPU of a scenario's processes, read from Linux's ``/proc``.

A scenario is the process tree under the processes the harness started (psutil is not a
dependency; ``/proc`` has all that is needed). Memory is reported as RSS summed over the
processes, as asked, and as PSS (proportional set size, ``smaps_rollup``), which counts a
page shared by N processes as 1/N in each: summing RSS over forked workers (uvicorn, Ray)
counts their shared libraries several times.

Components are named from the command line, so the memory and CPU tables can say which
part of a scenario uses what.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infergate.stack.processes import alive, descendants, live_pids, stat_fields

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MB = 1024 * 1024

# First match wins: (substring of the command line, component name).
COMPONENT_RULES: tuple[tuple[str, str], ...] = (
    ("triton_python_backend_stub", "triton python stub"),
    ("tritonserver", "tritonserver"),
    ("ray::ServeReplica", "serve replica"),
    ("ray::ServeController", "serve controller"),
    ("ray::ProxyActor", "serve proxy"),
    ("ray::HAProxyManager", "serve proxy"),
    ("haproxy", "haproxy ingress"),
    ("ray::", "ray agents and actors"),
    ("/site-packages/ray/", "ray system"),  # GCS, raylet, dashboard, monitors
    ("mlflow", "mlflow"),
    ("prometheus", "prometheus"),
    ("uvicorn", "uvicorn"),
    ("multiprocessing.spawn", "uvicorn worker"),  # uvicorn --workers N spawns them
    ("multiprocessing.resource_tracker", "uvicorn"),
    ("infergate.bench.ceiling", "onnxruntime"),
    ("infergate.bench.inprocess_server", "supervisor"),
    ("infergate", "supervisor"),
)


def component_of(cmdline: str) -> str:
    """The component a process belongs to, from its command line."""
    for needle, name in COMPONENT_RULES:
        if needle in cmdline:
            return name
    return cmdline.split(" ", 1)[0].rsplit("/", 1)[-1] or "other"


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    component: str
    command: str  # the start of the command line
    cpu_s: float  # user + system time since the process started
    rss_bytes: int
    pss_bytes: int | None  # None when smaps_rollup is not readable
    start_ticks: int  # when it started, since boot: tells a reused pid from the original

    def still_running(self) -> bool:
        """The same process (not a reuse of its pid) is alive and not a zombie."""
        fields = stat_fields(self.pid)
        return fields is not None and fields[0] != "Z" and int(fields[19]) == self.start_ticks


def session_members(session: int) -> list[int]:
    """Processes of a session, including those whose parent died (Ray's agents outlive
    their raylet); a child started with ``start_new_session`` leads a session of its pid."""
    members = []
    for pid in live_pids():
        fields = stat_fields(pid)
        if fields is not None and int(fields[3]) == session and fields[0] != "Z":
            members.append(pid)
    return sorted(members)


def tree(roots: Iterable[int]) -> list[int]:
    """``roots`` that are alive and every process below them."""
    roots = list(roots)
    return sorted({*filter(alive, roots), *descendants(roots)})


def _pss_bytes(pid: int) -> int | None:
    try:
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_info(pid: int, memory: bool = True) -> ProcessInfo | None:
    """What ``/proc`` says about ``pid``; None if it is gone. ``memory=False`` skips the
    PSS, which costs a walk of the process's page tables."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    # Fields after the command name, 0-based: utime 11, stime 12, starttime 19, rss 21 (pages).
    cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    rss = int(fields[21]) * PAGE_BYTES
    cmdline = cmdline.strip()
    pss = _pss_bytes(pid) if memory else None
    return ProcessInfo(pid, component_of(cmdline), cmdline[:80], cpu_s, rss, pss, int(fields[19]))


def snapshot(roots: Iterable[int], memory: bool = True) -> dict[int, ProcessInfo]:
    """Every live process of the trees under ``roots``."""
    infos = (process_info(pid, memory) for pid in tree(roots))
    return {info.pid: info for info in infos if info is not None}


def memory_by_component(processes: dict[int, ProcessInfo]) -> dict[str, dict[str, float]]:
    """Summed RSS and PSS (MiB) and process count per component, plus a ``total`` entry."""
    table: dict[str, dict[str, float]] = {}
    for info in processes.values():
        for name in (info.component, "total"):
            row = table.setdefault(name, {"rss_mb": 0.0, "pss_mb": 0.0, "processes": 0})
            row["rss_mb"] += info.rss_bytes / MB
            row["pss_mb"] += (info.pss_bytes or 0) / MB
            row["processes"] += 1
    return {name: {k: round(v, 1) for k, v in row.items()} for name, row in table.items()}


def cpu_by_component(
    before: dict[int, ProcessInfo], after: dict[int, ProcessInfo]
) -> dict[str, float]:
    """CPU seconds each component used between two snapshots (processes started in between
    count from their start; processes that ended in between are lost), plus ``total``."""
    used: dict[str, float] = {}
    for pid, info in after.items():
        spent = info.cpu_s - (before[pid].cpu_s if pid in before else 0.0)
        for name in (info.component, "total"):
            used[name] = used.get(name, 0.0) + max(spent, 0.0)
    return {name: round(seconds, 3) for name, seconds in used.items()}


TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)


def triton_counters(metrics_url: str) -> dict[str, dict[str, float]]:
    """Triton's cumulative per-model counters from its Prometheus endpoint; {} if it does
    not answer. https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md
    """
    import urllib.request

    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return parse_triton_counters(text)


_SAMPLE = re.compile(r'^(nv_inference_\w+)\{[^}]*model="([^"]+)"[^}]*\}\s+(\S+)')


def parse_triton_counters(text: str) -> dict[str, dict[str, float]]:
    """model -> counter -> value, summed over versions, from Prometheus text.

    Parsed by hand: prometheus_client's parser renames counter samples to ``*_total``.
    """
    counters: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match[1] in TRITON_COUNTERS:
            model = counters.setdefault(match[2], {})
            model[match[1]] = model.get(match[1], 0.0) + float(match[3])
    return counters


def triton_batching(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Per model between two :func:`triton_counters`: requests, executions, the mean batch
    the dynamic batcher formed (rows per execution), queue time per request and compute
    time per execution (ms).

    Triton adds a batch's compute time to each request in it, so the compute time of an
    execution is the compute total over the requests, not over the executions.
    """
    table = {}
    for model, now in after.items():
        then = before.get(model, {})
        delta = {name: now.get(name, 0.0) - then.get(name, 0.0) for name in TRITON_COUNTERS}
        requests = delta["nv_inference_request_success"]
        executions = delta["nv_inference_exec_count"]
        if requests <= 0:
            continue
        table[model] = {
            "requests": requests,
            "executions": executions,
            "rows_per_execution": round(delta["nv_inference_count"] / max(executions, 1), 2),
            "queue_ms_per_request": round(
                delta["nv_inference_queue_duration_us"] / requests / 1e3, 3
            ),
            "compute_ms_per_execution": round(
                delta["nv_inference_compute_infer_duration_us"] / requests / 1e3, 3
            ),
        }
    return table


def system_busy_s() -> float:
    """CPU seconds all cores spent not idle since boot (``/proc/stat``)."""
    fields = (PROC / "stat").read_text().splitlines()[0].split()[1:]
    # user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
    ticks = [int(value) for value in fields[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS


def wait_for_quiet(
    roots: Iterable[int], threshold_percent: float, max_wait_s: float,
    say: Callable[[str], None] = lambda _: None,
) -> float:  # fmt: skip
    """Wait (at most ``max_wait_s``) until processes outside ``roots`` and this one use less
    than ``threshold_percent`` of a core over a second; return the last figure.

    On a shared 2-core box other work changes every figure; this only waits, the caller
    measures anyway when the box does not calm down (and reports its 'other CPU')."""
    roots = list(roots)
    deadline = time.monotonic() + max_wait_s
    waited = False
    while True:
        before = snapshot(roots, memory=False)
        busy, own = system_busy_s(), time.process_time()
        time.sleep(1.0)
        ours = cpu_by_component(before, snapshot(roots, memory=False)).get("total", 0.0)
        ours += time.process_time() - own
        other = 100 * max(system_busy_s() - busy - ours, 0.0)
        if other < threshold_percent or time.monotonic() > deadline:
            if waited:
                say(f"  (other load now {other:.0f}% of a core)")
            return other
        if not waited:
            say(f"  waiting for the box to calm down: other load {other:.0f}% of a core")
            waited = True


def keep_quietest(
    measure: Callable[[], dict[str, Any]], noisy_percent: float, retries: int,
    before_retry: Callable[[], object] = lambda: None,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:  # fmt: skip
    """Run ``measure`` again (after ``before_retry``), at most ``retries`` more times, while
    other work on the box used more than ``noisy_percent`` of a core during it (the
    figures' ``other_cpu_percent``); keep the quietest attempt, saying how many it took
    and whether it stayed noisy."""
    attempts = [measure()]
    while attempts[-1]["other_cpu_percent"] > noisy_percent and len(attempts) <= retries:
        say(f"  noisy: other load {attempts[-1]['other_cpu_percent']:.0f}%, measuring again")
        before_retry()
        attempts.append(measure())
    best = min(attempts, key=lambda attempt: attempt["other_cpu_percent"])
    best["attempts"] = len(attempts)
    best["noisy"] = best["other_cpu_percent"] > noisy_percent
    return best

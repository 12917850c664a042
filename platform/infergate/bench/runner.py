"""One benchmark run: prepare the model, then for each scenario start it, measure every
cell of the profile with the same load generator, read its memory and CPU, stop it.

A scenario that fails to start or stop is recorded with its error and the run goes on:
the report shows what failed rather than leaving it out.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infergate.bench import procfs
from infergate.bench.analysis import WITHOUT_MODEL, cell_row, single_text_target_rps
from infergate.bench.baselines import EnsembleTriton, FloorServe, InprocessServe, NaiveServer
from infergate.bench.loadgen import HttpTarget, run_load, run_sync, send_once
from infergate.bench.prepare import PreparedModel, prepare_model
from infergate.bench.scenarios import Scenario
from infergate.bench.stack_scenarios import InfergateStack, LeanStack
from infergate.bench.workload import PROBE_TEXTS, Cell, Profile, TextSets, build_text_sets
from infergate.config import PROJECT_ROOT, load_config

ALL_SCENARIOS = ("ceiling", "infergate", "lean", "inprocess", "floor", "ensemble", "naive")
DISTINCT_BODIES = 64
# Other work on the box, in percent of one core: below QUIET a cell may start, above NOISY
# a measurement is taken again.
QUIET_CPU_PERCENT = 25.0
NOISY_CPU_PERCENT = 30.0
# The ceiling is the denominator of the targets, and ONNX Runtime's two threads lose about
# a third of their throughput to 20% of a core taken by something else (measured here), so
# it is held to a stricter standard.
CEILING_NOISY_CPU_PERCENT = 10.0
# The ceiling has the whole machine, whatever the platform's Triton instances use: one
# session with ONNX Runtime's default of a thread per core (its largest batch also tries a
# session per core, see infergate.bench.ceiling).
CEILING_THREADS = 0
# The paced floor runs at the concurrency of the single-text throughput target, and is
# measured again when it falls more than this fraction short of its pace.
PACED_CONCURRENCY = 32
PACE_TOLERANCE = 0.05
Say = Callable[[str], None]
SCENARIOS: dict[str, type[Scenario]] = {
    cls.name: cls
    for cls in (InfergateStack, LeanStack, InprocessServe, FloorServe, EnsembleTriton, NaiveServer)
}


@dataclass(frozen=True)
class Variant:
    """The infergate scenario once more under other settings, measured in the same run:
    how one change is priced side by side (``infergate bench --variant``)."""

    label: str
    env: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``LABEL:NAME=VALUE[,NAME=VALUE...]``, names being environment variables."""
        label, sep, assignments = text.partition(":")
        pairs = [item.partition("=") for item in assignments.split(",") if item]
        if not sep or not label.strip() or not pairs or any(not p[1] or not p[0] for p in pairs):
            raise ValueError(
                f"variant {text!r}: expected LABEL:NAME=VALUE[,NAME=VALUE...], e.g. "
                "'no-coalescing:INFERGATE_FRONTEND__BATCH_MAX_ROWS=1'"
            )
        return cls(label.strip(), {name.strip(): value for name, _, value in pairs})


@dataclass(frozen=True)
class BenchOptions:
    """What ``infergate bench`` was asked to do."""

    profile: Profile
    scenarios: tuple[str, ...] = ALL_SCENARIOS
    cache_dir: Path | None = None
    refresh_model: bool = False
    timeout_s: float = 60.0
    quiet_wait_s: float = 0.0  # per cell, how long to wait for other load to calm down
    noisy_retries: int = 2  # measurements disturbed by other load are repeated this often
    variants: tuple[Variant, ...] = ()


def machine_info() -> dict[str, Any]:
    """The box and software the figures were measured on."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    meminfo = Path("/proc/meminfo").read_text().split()
    versions = {}
    for package in ("onnxruntime", "ray", "torch", "transformers", "tokenizers", "tritonclient"):
        try:
            from importlib.metadata import version

            versions[package] = version(package if package != "onnxruntime" else "onnxruntime-gpu")
        except Exception:
            versions[package] = None
    commit = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": versions,
        "git_commit": commit or None,
        "load_average_at_start": list(os.getloadavg()),
    }


def _bodies(scenario: Scenario, texts: TextSets, cell: Cell) -> list[bytes]:
    return [scenario.body(texts.request_texts(cell, i)) for i in range(DISTINCT_BODIES)]


def measure_cell(
    scenario: Scenario, texts: TextSets, cell: Cell, profile: Profile, options: BenchOptions,
    say: Say, target: HttpTarget | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Drive one cell and return its row: load figures, CPU by component, memory.

    A measurement during which other work on the box used more than ``NOISY_CPU_PERCENT``
    of a core is repeated (``options.noisy_retries`` times at most) and the quietest
    attempt is kept; the row says how many attempts it took and whether it stayed noisy.
    ``target`` replaces the scenario's own (a paced one, see :func:`measure_paced`).
    """
    target = target or scenario.target(_bodies(scenario, texts, cell))
    roots = scenario.roots()

    def settle() -> None:
        if options.quiet_wait_s > 0:
            procfs.wait_for_quiet(roots, QUIET_CPU_PERCENT, options.quiet_wait_s, say)

    settle()
    return procfs.keep_quietest(
        lambda: _measure_once(scenario, target, cell, profile, options.timeout_s),
        NOISY_CPU_PERCENT, options.noisy_retries, settle, say,
    )  # fmt: skip


def _measure_once(
    scenario: Scenario, target: HttpTarget, cell: Cell, profile: Profile, timeout_s: float
) -> dict[str, Any]:
    roots, metrics_url = scenario.roots(), scenario.triton_metrics_url
    triton_before = procfs.triton_counters(metrics_url) if metrics_url else {}
    before, busy_before = procfs.snapshot(roots, memory=False), procfs.system_busy_s()
    result = run_sync(
        lambda: run_load(
            target,
            concurrency=cell.concurrency,
            duration_s=profile.duration_s,
            warmup_s=profile.warmup_s,
            timeout_s=timeout_s,
        )
    )
    after, busy_after = procfs.snapshot(roots), procfs.system_busy_s()
    triton_after = procfs.triton_counters(metrics_url) if metrics_url else {}
    summary = result.summary()
    cpu = procfs.cpu_by_component(before, after)
    elapsed = result.elapsed_s or 1.0
    other = (busy_after - busy_before) - cpu.get("total", 0.0) - result.client_cpu_s
    return {
        "cell": cell.key,
        "texts": cell.texts,
        "tokens": cell.tokens,
        **summary,
        "sequences_per_s": summary["requests_per_s"] * cell.texts,
        # Percent of one core over the run (warm-up included); 100 * cores is the box.
        "server_cpu_percent": {k: round(100 * v / elapsed, 1) for k, v in cpu.items()},
        "other_cpu_percent": round(100 * max(other, 0.0) / elapsed, 1),
        "memory": procfs.memory_by_component(after),
        "triton": procfs.triton_batching(triton_before, triton_after),
    }


def run_ceiling(prepared: PreparedModel, profile: Profile, options: BenchOptions) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "infergate.bench.ceiling",
        f"--onnx={prepared.onnx_path}",
        f"--tokenizer={prepared.tokenizer_dir}",
        f"--spec={prepared.served_dir / 'infergate.json'}",
        "--lengths=" + ",".join(map(str, profile.token_lengths)),
        f"--duration={profile.ceiling_duration_s}",
        f"--threads={CEILING_THREADS}",
        f"--retries={options.noisy_retries}",
        f"--noisy-cpu-percent={CEILING_NOISY_CPU_PERCENT}",
        f"--quiet-wait={options.quiet_wait_s}",
    ]
    # stderr (a line per measurement) goes straight to the terminal as progress.
    done = subprocess.run(
        command, stdout=subprocess.PIPE, text=True, timeout=options.timeout_s * 20, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the ceiling run failed with exit code {done.returncode}")
    return json.loads(done.stdout)


def merge_ceiling_runs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The ceiling measured at the start and at the end of a run: per row, the faster of
    the two (the other's figure kept beside it).

    This shared host has slow phases that do not show as other load inside the machine
    (the same batch-1 row measured 0.8 and 1.85 ms p50 half an hour apart); a ceiling
    measured in one would flatter every ratio. The faster row keeps them conservative.
    """
    merged = dict(second)
    rows = {(r["tokens"], r["batch"]): r for r in first.get("rows", [])}
    for row in second.get("rows", []):
        key = (row["tokens"], row["batch"])
        earlier = rows.get(key)
        if earlier is None:
            rows[key] = row
            continue
        faster, slower = sorted((row, earlier), key=lambda r: -r["sequences_per_s"])
        rows[key] = {**faster, "slower_run_sequences_per_s": slower["sequences_per_s"]}
    merged["rows"] = sorted(rows.values(), key=lambda r: (r["tokens"], r["batch"]))
    merged["runs"] = 2
    return merged


def _triton_alone(
    scenario: Scenario,
    texts: TextSets,
    profile: Profile,
    record: dict[str, Any],
    say: Say,
    when: str,
) -> list[dict[str, Any]]:
    """``scenario.triton_alone`` with progress, its rows marked ``run: when`` ("before" or
    "after" the cells); a failure is recorded as ``triton_alone_error_<when>``, and the
    cells stand without it."""
    try:
        rows = [{**row, "run": when} for row in scenario.triton_alone(texts, profile)]
    except Exception as exc:
        record[f"triton_alone_error_{when}"] = f"{type(exc).__name__}: {exc}"
        say(f"[{scenario.name}] Triton alone ({when} the cells) FAILED: {exc}")
        return []
    for row in rows:
        say(
            f"  {scenario.name:<9} Triton alone, c=1 tokens={row['tokens']:<4} p50 "
            f"{row['p50_ms']:7.2f}  p99 {row['p99_ms']:7.2f} ms ({row['calls']} calls)"
        )
    return rows


def faster_rows(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per token length, the row with the lower p50 of two measurements (before and after
    the cells), the other's p50 beside it: an estimate of the least latency must not
    rise with a slow phase of the host."""
    by_tokens: dict[int, list[dict[str, Any]]] = {}
    for row in [*first, *second]:
        by_tokens.setdefault(row["tokens"], []).append(row)
    merged = []
    for tokens in sorted(by_tokens):
        rows = sorted(by_tokens[tokens], key=lambda row: row["p50_ms"])
        best = dict(rows[0])
        if len(rows) > 1:
            best["other_p50_ms"] = rows[1]["p50_ms"]
        merged.append(best)
    return merged


def measure_paced(
    scenario: Scenario,
    texts: TextSets,
    profile: Profile,
    paces: dict[str, dict[int, float]],
    options: BenchOptions,
    say: Say,
) -> list[dict[str, Any]]:
    """The single-text c=32 cell once more per pace, every answer held back so that the
    closed loop runs at about that many requests a second; [] for a scenario that cannot
    hold answers back (only the floor can).

    ``paces`` maps what a rate is (``"target"``: what the single-text target asks of
    infergate; ``"infergate"``: what infergate reached) to requests/s per token length.
    Each client also waits for the answer itself, so a cell that falls more than
    ``PACE_TOLERANCE`` short of its pace is measured again with that wait taken out of
    the delay; the measurement closer to the pace is kept.
    """
    rows = []
    for purpose, rates in paces.items():
        for tokens, rps in sorted(rates.items()):
            cell = Cell(PACED_CONCURRENCY, 1, tokens)
            bodies = _bodies(scenario, texts, cell)
            delay_ms = 1e3 * cell.concurrency / rps
            attempts: list[dict[str, Any]] = []
            while True:
                target = scenario.paced_target(bodies, delay_ms)
                if target is None:
                    return []
                row = measure_cell(scenario, texts, cell, profile, options, say, target)
                attempts.append({**row, "delay_ms": delay_ms})
                achieved = row["requests_per_s"]
                if len(attempts) == 2 or not achieved or achieved >= (1 - PACE_TOLERANCE) * rps:
                    break
                # A client's round trip is the delay plus the wait for the answer itself:
                # take the median wait out of the delay (the median, not the mean the rate
                # implies, so that a slow start of the cell does not overcorrect it).
                delay_ms = max(0.0, 1e3 * cell.concurrency / rps - (row["p50_ms"] - delay_ms))
            best = min(attempts, key=lambda attempt: abs(attempt["requests_per_s"] - rps))
            rows.append({**best, "paced_for": purpose, "paced_for_requests_per_s": rps})
            say(progress_line(scenario.name, best) + f"  (paced for {rps:.0f} req/s, {purpose})")
    return rows


def floor_paces(results: dict[str, Any], lengths: Sequence[int]) -> dict[str, dict[int, float]]:
    """The rates to pace the floor to, per token length: what the single-text target asks
    of infergate and, when infergate has run, what it reached (single texts, c=32)."""
    paces: dict[str, dict[int, float]] = {"target": {}, "infergate": {}}
    for tokens in lengths:
        if (rps := single_text_target_rps(results, tokens)) is not None:
            paces["target"][tokens] = rps
        ours = cell_row(results, "infergate", PACED_CONCURRENCY, 1, tokens)
        if ours and ours["requests_per_s"] > 0 and not ours["errors"]:
            paces["infergate"][tokens] = ours["requests_per_s"]
    return {purpose: rates for purpose, rates in paces.items() if rates}


def run_scenario(
    scenario: Scenario,
    texts: TextSets,
    profile: Profile,
    reference_labels: list[str] | None,
    options: BenchOptions,
    say: Say,
    paces: dict[str, dict[int, float]] | None = None,
) -> dict[str, Any]:
    """Start, probe, measure every cell (and the paced ones, see :func:`measure_paced`),
    stop; errors are recorded, not raised."""
    record: dict[str, Any] = {"description": scenario.description, "cells": []}
    started = time.monotonic()
    try:
        say(f"[{scenario.name}] starting: {scenario.description}")
        scenario.start()
        record["start_s"] = round(time.monotonic() - started, 1)
        say(f"[{scenario.name}] up in {record['start_s']:.0f} s on port {scenario.port}")
        status, answer = run_sync(
            lambda: send_once(scenario.target([b""]), scenario.body(PROBE_TEXTS), options.timeout_s)
        )
        labels = scenario.labels(answer) if status == 200 else None
        record["probe"] = {"status": status, "labels": labels}
        record["probe"]["agrees_with_ceiling"] = (
            labels == reference_labels
            if reference_labels is not None and scenario.name not in WITHOUT_MODEL
            else None
        )
        alone_before = _triton_alone(scenario, texts, profile, record, say, "before")
        for cell in sorted(profile.cells, key=lambda c: (c.tokens, c.texts, c.concurrency)):
            row = measure_cell(scenario, texts, cell, profile, options, say)
            record["cells"].append(row)
            say(progress_line(scenario.name, row))
        if paced := measure_paced(scenario, texts, profile, paces or {}, options, say):
            record["paced_cells"] = paced
        record["memory"] = _peak_memory(record["cells"])
        alone_after = _triton_alone(scenario, texts, profile, record, say, "after")
        if alone := faster_rows(alone_before, alone_after):
            record["triton_alone"] = alone
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["log_tail"] = scenario.log_tail()
        say(f"[{scenario.name}] FAILED: {record['error']}")
        traceback.print_exc()
    finally:
        try:
            scenario.stop()
        except Exception as exc:
            record["stop_error"] = f"{type(exc).__name__}: {exc}"
            say(f"[{scenario.name}] stop failed: {exc}")
    if scenario.info:
        record["info"] = scenario.info
    return record


def _peak_memory(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    measured = [row["memory"] for row in rows if row.get("memory")]
    return max(measured, key=lambda m: m.get("total", {}).get("rss_mb", 0.0), default={})


def progress_line(scenario: str, row: dict[str, Any]) -> str:
    cpu = row["server_cpu_percent"].get("total", 0.0)
    return (
        f"  {scenario:<9} c={row['concurrency']:<3} texts={row['texts']:<3} "
        f"tokens={row['tokens']:<4} {row['requests_per_s']:8.1f} req/s "
        f"{row['sequences_per_s']:8.1f} seq/s  p50 {row['p50_ms']:7.2f}  "
        f"p99 {row['p99_ms']:7.2f} ms"
        f"  errors {row['errors']}  server cpu {cpu:.0f}%  client cpu "
        f"{row['client_cpu_percent']:.0f}%  other {row['other_cpu_percent']:.0f}%"
    )


def run_bench(options: BenchOptions, say: Say = print) -> dict[str, Any]:
    """The whole run; returns the results document (see ``infergate.bench.analysis``)."""
    profile = options.profile
    unknown = set(options.scenarios) - set(ALL_SCENARIOS)
    if unknown:
        raise ValueError(f"unknown scenarios {sorted(unknown)}; choose from {ALL_SCENARIOS}")
    config = load_config()
    cache = {"cache_dir": options.cache_dir} if options.cache_dir else {}
    prepared = prepare_model(**cache, refresh=options.refresh_model, say=say)
    texts = build_text_sets(prepared.tokenizer_dir, profile.token_lengths)
    overrides = {k: v for k, v in sorted(os.environ.items()) if k.startswith("INFERGATE_")}
    results: dict[str, Any] = {
        "meta": {
            **machine_info(),
            "profile": profile.name,
            "duration_s": profile.duration_s,
            "warmup_s": profile.warmup_s,
            "model": {
                "name": "sentiment",
                "version": prepared.version,
                "precision": prepared.spec.get("precision"),
                "onnx_sha256": prepared.onnx_sha256,
                "hf_dir": str(prepared.hf_dir),
            },
            "mean_tokens": texts.mean_tokens,
            "triton": config.triton.model_dump(mode="json"),
            "autoscaling": config.serve.autoscaling.model_dump(mode="json"),
            "env_overrides": overrides,
        },
        "ceiling": None,
        "scenarios": {},
    }
    started = time.monotonic()
    reference_labels: list[str] | None = None
    if "ceiling" in options.scenarios:
        say("[ceiling] ONNX Runtime in one process on the served file")
        if options.quiet_wait_s > 0:
            procfs.wait_for_quiet([], QUIET_CPU_PERCENT, options.quiet_wait_s, say)
        try:
            results["ceiling"] = run_ceiling(prepared, profile, options)
            reference_labels = results["ceiling"]["probe_labels"]
        except Exception as exc:
            results["ceiling"] = {"error": f"{type(exc).__name__}: {exc}"}
            say(f"[ceiling] FAILED: {exc}")
    with tempfile.TemporaryDirectory(prefix="infergate-bench-") as tmp:
        for name in options.scenarios:
            if name == "ceiling":
                continue
            workdir = Path(tmp) / name
            workdir.mkdir()
            scenario = SCENARIOS[name](prepared, workdir)
            paces = floor_paces(results, profile.token_lengths)
            results["scenarios"][name] = run_scenario(
                scenario, texts, profile, reference_labels, options, say, paces
            )
        for variant in options.variants:
            workdir = Path(tmp) / f"variant-{len(results['scenarios'])}"
            workdir.mkdir()
            scenario = InfergateStack(prepared, workdir, variant.env, label=variant.label)
            record = run_scenario(scenario, texts, profile, reference_labels, options, say)
            results["scenarios"][scenario.name] = {**record, "env": variant.env}
    ceiling = results["ceiling"] or {}
    if ceiling.get("rows"):
        say("[ceiling] measured again at the end; each row keeps the faster run")
        try:
            again = run_ceiling(prepared, profile, options)
            results["ceiling"] = merge_ceiling_runs(ceiling, again)
        except Exception as exc:
            say(f"[ceiling] second run failed: {exc}")
    results["meta"]["wall_s"] = round(time.monotonic() - started, 1)
    results["meta"]["load_average_at_end"] = list(os.getloadavg())
    return results

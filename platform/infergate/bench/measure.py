"""Taking the figures: one cell of a running scenario under the load generator (taken again
when other work on the box disturbed it), the floor's cells paced to a rate, and the ceiling
in a process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from infergate.bench import procfs
from infergate.bench.analysis import cell_row, single_text_target_rps
from infergate.bench.loadgen import LoadTarget, run_load, run_sync
from infergate.bench.options import BenchOptions, Say
from infergate.bench.prepare import PreparedModel
from infergate.bench.scenarios import Scenario
from infergate.bench.workload import Cell, Profile, TextSets

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


def _bodies(scenario: Scenario, texts: TextSets, cell: Cell) -> list[bytes]:
    return [scenario.body(texts.request_texts(cell, i)) for i in range(DISTINCT_BODIES)]


def measure_cell(
    scenario: Scenario, texts: TextSets, cell: Cell, profile: Profile, options: BenchOptions,
    say: Say, target: LoadTarget | None = None,
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
    scenario: Scenario, target: LoadTarget, cell: Cell, profile: Profile, timeout_s: float
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

"""One benchmark run: prepare the model, then for each scenario start it, measure every
cell of the profile with the same load generator, read its memory and CPU, stop it.

A scenario that fails to start or stop is recorded with its error and the run goes on:
the report shows what failed rather than leaving it out. The ceiling is measured at the
start and again at the end; how a cell and the ceiling are measured is
``infergate.bench.measure``.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from infergate.bench import grpc_cell, procfs
from infergate.bench.analysis import WITHOUT_MODEL
from infergate.bench.baselines import (
    EnsembleTriton,
    FloorServe,
    InprocessServe,
    NaiveInt8Server,
    NaiveServer,
)
from infergate.bench.batch_cell import measure_batch_cell, on_own_stack
from infergate.bench.loadgen import run_sync, send_once
from infergate.bench.measure import (
    QUIET_CPU_PERCENT,
    floor_paces,
    measure_cell,
    measure_paced,
    merge_ceiling_runs,
    progress_line,
    run_ceiling,
)
from infergate.bench.options import ALL_SCENARIOS, STACK_SCENARIOS, BenchOptions, Say
from infergate.bench.prepare import DEFAULT_CACHE_DIR, prepare_model
from infergate.bench.scenarios import Scenario
from infergate.bench.stack_scenarios import InfergateStack, LeanStack, StandInStack
from infergate.bench.task_cells import TaskRun
from infergate.bench.workload import PROBE_TEXTS, Profile, TextSets, build_text_sets
from infergate.config import PROJECT_ROOT, load_config

SCENARIOS: dict[str, type[Scenario]] = {
    cls.name: cls
    for cls in (
        InfergateStack,
        StandInStack,
        LeanStack,
        InprocessServe,
        FloorServe,
        EnsembleTriton,
        NaiveServer,
        NaiveInt8Server,
    )
}


# The smoke checks that every part runs, not its figures: there the task cells are
# measured on the lean scenario's stack, which then starts once for both. The quick and
# full runs give the task cells a stack of their own, so that no figure carries another
# part's processes.
SHARED_STACK_PROFILES = ("smoke",)


def machine_info() -> dict[str, Any]:
    """The box and software the figures were measured on."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    meminfo = Path("/proc/meminfo").read_text().split()
    versions: dict[str, str | None] = {}
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


S = TypeVar("S", bound=Scenario)


def in_turn(*steps: Callable[[S], None] | None) -> Callable[[S], None] | None:
    """Each of ``steps`` given, in turn, whatever the ones before met (None: none given)."""
    given = [step for step in steps if step is not None]
    if not given:
        return None

    def every(scenario: S) -> None:
        try:
            given[0](scenario)
        finally:
            if rest := in_turn(*given[1:]):
                rest(scenario)

    return every


def run_scenario(
    scenario: S,
    texts: TextSets,
    profile: Profile,
    reference_labels: list[str] | None,
    options: BenchOptions,
    say: Say,
    paces: dict[str, dict[int, float]] | None = None,
    also_on_it: Callable[[S], None] | None = None,
) -> dict[str, Any]:
    """Start, probe, measure every cell (and the paced ones, see :func:`measure_paced`),
    run ``also_on_it`` (once it started, whatever its cells met), stop; errors are
    recorded, not raised."""
    record: dict[str, Any] = {"description": scenario.description, "cells": []}
    started = time.monotonic()
    up = False
    try:
        say(f"[{scenario.name}] starting: {scenario.description}")
        scenario.start()
        up = True
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
        if up and also_on_it is not None:
            try:
                also_on_it(scenario)
            except Exception as exc:  # its own failures are its to record
                say(f"[{scenario.name}] what else ran on it FAILED: {exc}")
                traceback.print_exc()
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
            "gpu_sequences_per_s": options.gpu_sequences_per_s,
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
        # The task part (with its own stack, after the scenarios, or, when shared, run
        # with the lean scenario in its place among them).
        share = "lean" in options.scenarios and profile.name in SHARED_STACK_PROFILES
        tasks: TaskRun | None = None
        shared: dict[str, Any] | None = None  # its stack entry, once measured on lean's

        # The gRPC and batch cells run on the first stack scenario's stack, after its
        # cells, or each on one of its own.
        stacks = [n for n in options.scenarios if n in STACK_SCENARIOS]
        batch_on = stacks[0] if "batch" in options.scenarios and stacks else None
        grpc_on = stacks[0] if "grpc" in options.scenarios and stacks else None

        def grpc_beside_http(stack: Scenario) -> None:
            assert isinstance(stack, InfergateStack), stack.name
            results["grpc"] = grpc_cell.measure_grpc_cell(stack, texts, profile, options, say)

        def batch_cell(stack: Scenario) -> None:
            assert isinstance(stack, InfergateStack), stack.name
            results["batch"] = measure_batch_cell(stack, profile, Path(tmp) / "batch", say)

        def task_run() -> TaskRun:
            return TaskRun(
                prepared, options.tasks, options.peers, options, Path(tmp) / "tasks", say,
                options.cache_dir or DEFAULT_CACHE_DIR,
            )  # fmt: skip

        for name in options.scenarios:
            if name in ("ceiling", "batch", "grpc"):
                continue
            with_grpc = grpc_beside_http if name == grpc_on else None
            workdir = Path(tmp) / name
            workdir.mkdir()
            paces = floor_paces(results, profile.token_lengths)
            if options.tasks and share and name == "lean":
                tasks = task_run()
                tasks.ceilings()  # before the stack, as when the task part runs alone
                # The task store holds the scenarios' sentiment model too (task_models).
                on_task_store = replace(prepared, store_dir=tasks.prepared_tasks.store_dir)
                lean = LeanStack(on_task_store, workdir)
                results["scenarios"][name] = run_scenario(
                    lean, texts, profile, reference_labels, options, say, paces,
                    also_on_it=in_turn(
                        with_grpc, tasks.measure_on, batch_cell if batch_on == name else None
                    ),
                )  # fmt: skip
                shared = tasks.shared_stack(lean, results["scenarios"][name])
                continue
            scenario = SCENARIOS[name](prepared, workdir)
            results["scenarios"][name] = run_scenario(
                scenario, texts, profile, reference_labels, options, say, paces,
                also_on_it=in_turn(with_grpc, batch_cell if name == batch_on else None),
            )  # fmt: skip
        if "grpc" in options.scenarios and grpc_on is None:
            results["grpc"] = grpc_cell.on_own_stack(
                prepared, texts, profile, options, Path(tmp) / "grpc", say
            )
        elif grpc_on is not None and "grpc" not in results:
            results["grpc"] = {"error": f"the {grpc_on} scenario's stack did not start"}
        if "batch" in options.scenarios and batch_on is None:
            results["batch"] = on_own_stack(prepared, profile, Path(tmp) / "batch", say)
        elif batch_on is not None and "batch" not in results:
            results["batch"] = {"error": f"the {batch_on} scenario's stack did not start"}
        for variant in options.variants:
            workdir = Path(tmp) / f"variant-{len(results['scenarios'])}"
            workdir.mkdir()
            scenario = InfergateStack(prepared, workdir, variant.env, label=variant.label)
            record = run_scenario(scenario, texts, profile, reference_labels, options, say)
            results["scenarios"][scenario.name] = {**record, "env": variant.env}
        if options.tasks:
            if tasks is None or shared is None:
                tasks = task_run()
                tasks.ceilings()
                shared = tasks.on_own_stack()
            results["tasks"] = tasks.finish(shared)
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

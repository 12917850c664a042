"""The pure parts of the benchmark harness: percentiles, HTTP heads, texts, process
accounting, targets and the report."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infergate.bench import procfs
from infergate.bench.analysis import ceiling_shares, cell_row, triton_hop
from infergate.bench.loadgen import (
    HttpTarget,
    LoadResult,
    parse_head,
    percentile,
    run_load,
    run_sync,
)
from infergate.bench.report import markdown, verdict, write_report
from infergate.bench.targets import check, evaluate_targets
from infergate.bench.workload import PROFILES, TARGET_CELLS, Cell, TextSets, texts_of_length

# -- percentiles and load results ------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 7, 100, 1001])
def test_percentile_matches_numpy_linear_interpolation(size):
    rng = random.Random(size)
    values = sorted(rng.uniform(0, 50) for _ in range(size))
    for q in (0, 1, 50, 95, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_percentile_of_nothing_is_nan_and_q_is_checked():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match=r"expected 0\.\.100"):
        percentile([1.0], 101)


def test_load_result_summary():
    result = LoadResult(concurrency=4, latencies_ms=[4.0, 1.0, 2.0, 3.0], window_s=2.0)
    result.errors["HTTP 503"] += 1
    result.elapsed_s, result.client_cpu_s = 4.0, 1.0
    summary = result.summary()
    assert summary["ok"] == 4 and summary["errors"] == 1 and summary["requests"] == 5
    assert summary["requests_per_s"] == 2.0
    assert summary["p50_ms"] == 2.5 and summary["max_ms"] == 4.0
    assert summary["error_kinds"] == {"HTTP 503": 1}
    assert summary["client_cpu_percent"] == 25.0


# -- HTTP ------------------------------------------------------------------------------------


def test_parse_head_reads_status_and_lowercased_headers():
    status, headers = parse_head(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\nX-Thing: a: b\r\n\r\n"
    )
    assert status == 503
    assert headers == {"content-length": "12", "x-thing": "a: b"}


def test_parse_head_refuses_what_is_not_http():
    with pytest.raises(ValueError, match="not an HTTP response"):
        parse_head(b"SSH-2.0-OpenSSH\r\n\r\n")


def test_target_builds_a_complete_request_and_stays_on_loopback():
    target = HttpTarget("127.0.0.1", 8000, "/predict", (b'{"inputs": "x"}',))
    request = target.request_bytes(target.bodies[0])
    head, body = request.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /predict HTTP/1.1\r\n")
    assert b"Content-Length: 15" in head and body == b'{"inputs": "x"}'
    HttpTarget("::1", 1, "/", (b"",))
    HttpTarget("localhost", 1, "/", (b"",))
    for host in ("10.0.0.1", "example.com", "0.0.0.0"):
        with pytest.raises(ValueError, match="not a loopback address"):
            HttpTarget(host, 80, "/", (b"",))


def serve_http(statuses: list[int]):
    """A tiny keep-alive HTTP server answering each request with the next status in turn."""
    import asyncio

    seen = {"requests": 0}
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                status = statuses[seen["requests"] % len(statuses)]
                seen["requests"] += 1
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok".encode())
                await writer.drain()

    async def with_server(body):
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await body(port), seen["requests"]
        finally:
            server.close()
            for writer in writers:
                writer.close()
            await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)

    return with_server


@pytest.mark.parametrize("statuses", [[200], [200, 503]])
def test_load_counts_answers_in_the_window_and_errors_by_kind(statuses):
    with_server = serve_http(statuses)

    async def load(port: int) -> LoadResult:
        target = HttpTarget("127.0.0.1", port, "/p", (b"{}", b'{"a": 1}'))
        return await run_load(target, concurrency=4, duration_s=0.3, warmup_s=0.1)

    result, served = run_sync(lambda: with_server(load))
    summary = result.summary()
    # (How many fit in 0.3 s depends on the machine's load: seen 8 under a load of 19.)
    assert summary["ok"] > 0 and summary["requests_per_s"] > 0
    assert result.warmup_requests > 0
    # Answers after the window closed and warm-up answers are served but not counted.
    assert summary["requests"] + result.warmup_requests <= served
    if 503 in statuses:
        assert summary["error_kinds"] == {"HTTP 503": summary["errors"]}
        # Served alternately; the window's edges may cut either kind (a few per worker).
        assert abs(summary["errors"] - summary["ok"]) <= 8
    else:
        assert summary["errors"] == 0
    with pytest.raises(ValueError, match="concurrency"):
        run_sync(lambda: run_load(HttpTarget("127.0.0.1", 1, "/", (b"",)), concurrency=0,
                                  duration_s=1.0))  # fmt: skip


# -- workload --------------------------------------------------------------------------------


def test_texts_reach_the_token_target():
    def count(text: str) -> int:  # one token per word plus two special tokens
        return len(text.split()) + 2

    sentences = ["one two three", "four five", "six seven eight nine"]
    texts = texts_of_length(6, count, sentences, count=5)
    assert len(texts) == 5 and all(count(t) == 6 for t in texts)
    assert texts[0].startswith("one") and texts[1].startswith("four")


def test_request_texts_cycle_through_the_pool():
    sets = TextSets({16: ["a", "b", "c"]}, {16: 16.0})
    assert sets.request_texts(Cell(1, 2, 16), 0) == ["a", "b"]
    assert sets.request_texts(Cell(1, 2, 16), 1) == ["c", "a"]


def test_every_profile_measures_the_target_cells():
    for profile in PROFILES.values():
        assert set(TARGET_CELLS) <= set(profile.cells), profile.name
    # The full profile is the grid the workload module describes, each cell once.
    grid = [Cell(c, t, n) for c in (1, 8, 32) for t in (1, 16) for n in (16, 128)]
    assert sorted(PROFILES["full"].cells) == sorted(grid)


# -- /proc accounting ------------------------------------------------------------------------


def test_components_are_named_from_the_command_line():
    name = procfs.component_of
    assert name("/x/triton-backends/python/triton_python_backend_stub /r/m/1/model.py") == (
        "triton python stub"
    )
    assert name("/venv/pytriton/tritonserver/bin/tritonserver --model-repository=/r") == (
        "tritonserver"
    )
    assert name("ray::ServeReplica:infergate:frontend") == "serve replica"
    assert name("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet") == (
        "ray system"
    )
    assert name("/usr/bin/prometheus --config.file=x") == "prometheus"
    assert name("/usr/local/bin/something --flag") == "something"


def _info(pid: int, component: str, cpu_s: float, rss_mb: float) -> procfs.ProcessInfo:
    rss = int(rss_mb * procfs.MB)
    return procfs.ProcessInfo(pid, component, component, cpu_s, rss, rss // 2, 0)


def test_memory_and_cpu_are_summed_per_component():
    before = {1: _info(1, "a", 1.0, 10), 2: _info(2, "b", 5.0, 20)}
    after = {1: _info(1, "a", 1.5, 12), 2: _info(2, "b", 6.0, 20), 3: _info(3, "b", 0.25, 8)}
    memory = procfs.memory_by_component(after)
    assert memory["b"] == {"rss_mb": 28.0, "pss_mb": 14.0, "processes": 2}
    assert memory["total"]["rss_mb"] == 40.0 and memory["total"]["processes"] == 3
    cpu = procfs.cpu_by_component(before, after)
    assert cpu == {"a": 0.5, "b": 1.25, "total": 1.75}


def test_keep_quietest_measures_again_while_noisy_and_keeps_the_quietest():
    figures = iter(
        {"other_cpu_percent": other, "n": n} for n, other in enumerate([50.0, 35.0, 40.0, 1.0], 1)
    )
    waits, said = [], []
    best = procfs.keep_quietest(
        lambda: next(figures), 30.0, retries=2, before_retry=lambda: waits.append(1),
        say=said.append,
    )  # fmt: skip
    assert (best["n"], best["attempts"], best["noisy"]) == (2, 3, True)
    assert len(waits) == 2 and len(said) == 2
    quiet = procfs.keep_quietest(lambda: {"other_cpu_percent": 3.0}, 30.0, retries=2)
    assert (quiet["attempts"], quiet["noisy"]) == (1, False)


def test_ceiling_sessions_run_side_by_side_and_count_every_row():
    """Bounds that hold however busy the box is (a sleep only ever runs long)."""
    import time as clock

    from infergate.bench.ceiling import measure

    class Session:  # stands in for ONNX Runtime: at least 10 ms a batch, the GIL released
        def __init__(self) -> None:
            self.spans: list[tuple[float, float]] = []

        def run(self, outputs, feeds):
            began = clock.perf_counter()
            clock.sleep(0.01)
            self.spans.append((began, clock.perf_counter()))

    batches = [{"input_ids": np.zeros((4, 8), np.int64)}]
    for sessions in ([Session()], [Session(), Session()]):
        began = clock.perf_counter()
        figures = measure(sessions, "logits", batches, 0.3)
        wall_s = clock.perf_counter() - began
        # Every run's 4 rows counted, over no more than the call's own time...
        assert figures["sequences_per_s"] >= 4 * figures["runs"] / wall_s
        # ... and no faster than 10 ms a batch per session allows.
        assert figures["sequences_per_s"] <= len(sessions) * 400 * 1.01
        assert figures["runs"] >= len(sessions) * 5 and figures["p50_ms"] >= 10
    first, second = sessions
    overlapping = [a for a in first.spans for b in second.spans if a[0] < b[1] and b[0] < a[1]]
    assert len(overlapping) >= 5  # side by side, not one after the other


def test_this_process_is_readable_from_proc():
    import os

    info = procfs.process_info(os.getpid())
    assert info is not None and info.rss_bytes > 0 and info.still_running()
    assert os.getpid() in procfs.tree([os.getpid()])
    assert procfs.process_info(os.getpid(), memory=False).pss_bytes is None


# -- targets ---------------------------------------------------------------------------------


def test_check_passes_fails_and_says_by_how_much():
    assert check("t", "c", 0.6, 0.55, at_least=True, unit="x")["passed"] is True
    missed = check("t", "c", 0.44, 0.55, at_least=True, unit="x")
    assert missed["passed"] is False and missed["shortfall"] == pytest.approx(0.2)
    over = check("t", "c", 6.0, 5.0, at_least=False, unit="ms")
    assert over["passed"] is False and over["shortfall"] == pytest.approx(0.2)
    assert verdict(over) == "MISS 20% over"
    assert verdict(missed) == "MISS 20% short"
    unknown = check("t", "c", None, 0.55, at_least=True, unit="x", missing="not measured: naive")
    assert unknown["passed"] is None and verdict(unknown) == "n/a (not measured: naive)"
    errored = check("t", "c", 0.9, 0.55, at_least=True, unit="x", errors=3)
    assert errored["passed"] is False and "3 failed requests" in verdict(errored)


def _cell(c: int, texts: int, tokens: int, rps: float, p50: float, p99: float, errors: int = 0):
    return {
        "cell": Cell(c, texts, tokens).key,
        "concurrency": c,
        "texts": texts,
        "tokens": tokens,
        "requests_per_s": rps,
        "sequences_per_s": rps * texts,
        "p50_ms": p50,
        "p95_ms": p99,
        "p99_ms": p99,
        "errors": errors,
        "client_cpu_percent": 10.0,
        "other_cpu_percent": 1.0,
        "server_cpu_percent": {"total": 150.0, "tritonserver": 100.0, "serve replica": 50.0},
        "memory": {"total": {"rss_mb": 100.0, "pss_mb": 80.0, "processes": 2}},
    }


def _results() -> dict:
    ceiling_rows = [
        {"tokens": 16, "batch": 1, "sequences_per_s": 400.0, "p50_ms": 2.0, "p95_ms": 3.0,
         "p99_ms": 4.0},
        {"tokens": 16, "batch": 32, "sequences_per_s": 1000.0, "p50_ms": 30.0, "p95_ms": 31.0,
         "p99_ms": 32.0},
    ]  # fmt: skip
    memory = {
        "total": {"rss_mb": 3000.0, "pss_mb": 2000.0, "processes": 20},
        "tritonserver": {"rss_mb": 1000.0, "pss_mb": 900.0, "processes": 1},
        "serve replica": {"rss_mb": 2000.0, "pss_mb": 1100.0, "processes": 19},
    }
    return {
        "meta": {"profile": "quick", "cpus": 2, "env_overrides": {"INFERGATE_X": "1"}},
        "ceiling": {"rows": ceiling_rows, "memory": {"total": memory["total"]}},
        "scenarios": {
            "infergate": {
                "cells": [
                    _cell(1, 1, 16, 250.0, 3.0, 5.0),  # p50 within 2 + 1.5; p99 <= 6
                    _cell(32, 1, 16, 500.0, 60.0, 90.0),  # 0.50 of the ceiling: a miss
                    _cell(32, 16, 16, 60.0, 500.0, 600.0, errors=2),  # 0.96 but errors
                ],
                "memory": memory,
            },
            "naive": {"cells": [_cell(32, 1, 16, 50.0, 600.0, 900.0)]},
            "inprocess": {"cells": [_cell(32, 1, 16, 750.0, 40.0, 60.0)]},
        },
    }


def test_targets_are_evaluated_and_nothing_is_dropped():
    rows = {(r["target"], r["cell"]): r for r in evaluate_targets(_results())}
    single = rows[("infergate vs ceiling (1 text)", "c=32 texts=1 tokens=16")]
    assert single["value"] == pytest.approx(0.5) and single["passed"] is False
    assert single["shortfall"] == pytest.approx(0.05 / 0.55)
    multi = rows[("infergate vs ceiling (16 texts)", "c=32 texts=16 tokens=16")]
    assert multi["value"] == pytest.approx(0.96) and multi["passed"] is False  # 2 errors
    naive = rows[("infergate vs naive", "c=32 texts=1 tokens=16")]
    assert naive["value"] == pytest.approx(10.0) and naive["passed"] is True
    naive_multi = rows[("infergate vs naive", "c=32 texts=16 tokens=16")]
    assert naive_multi["passed"] is None and naive_multi["note"] == "not measured: naive"
    ensemble = rows[("infergate vs ensemble", "c=32 texts=1 tokens=16")]
    assert ensemble["passed"] is None and ensemble["note"] == "not measured: ensemble"
    p50 = rows[("c=1 p50 <= ceiling batch-1 p50 + 1.5 ms", "c=1 texts=1 tokens=16")]
    assert p50["value"] == 3.0 and p50["required"] == 3.5 and p50["passed"] is True
    p99 = rows[("c=1 p99 <= 2 x p50", "c=1 texts=1 tokens=16")]
    assert p99["required"] == 6.0 and p99["passed"] is True


def test_a_missed_share_says_what_the_lean_front_end_reached():
    results = _results()
    results["scenarios"]["lean"] = {
        "cells": [
            _cell(1, 1, 16, 260.0, 2.9, 4.0),
            _cell(32, 1, 16, 520.0, 55.0, 80.0),
            _cell(32, 16, 16, 61.0, 490.0, 600.0),
        ]
    }
    rows = {(r["target"], r["cell"]): r for r in evaluate_targets(results)}
    single = rows[("infergate vs ceiling (1 text)", "c=32 texts=1 tokens=16")]
    assert single["passed"] is False and single["note"] == "the lean front-end 0.52"
    assert verdict(single) == "MISS 9% short, the lean front-end 0.52"
    # A miss from failed requests keeps its own note first.
    multi = rows[("infergate vs ceiling (16 texts)", "c=32 texts=16 tokens=16")]
    assert multi["note"] == "2 failed requests in the cell, the lean front-end 0.98"
    # A target met needs no note: infergate's c=1 p50 of 3.0 is within 2 + 1.5 ms.
    latency = rows[("c=1 p50 <= ceiling batch-1 p50 + 1.5 ms", "c=1 texts=1 tokens=16")]
    assert latency["passed"] is True and latency["note"] == ""
    results["scenarios"]["infergate"]["cells"][0]["p50_ms"] = 4.0
    rows = {(r["target"], r["cell"]): r for r in evaluate_targets(results)}
    latency = rows[("c=1 p50 <= ceiling batch-1 p50 + 1.5 ms", "c=1 texts=1 tokens=16")]
    assert latency["note"] == "the lean front-end 2.90 ms"
    results["scenarios"]["lean"]["cells"][1]["errors"] = 1  # a lean cell that failed: no note
    rows = {(r["target"], r["cell"]): r for r in evaluate_targets(results)}
    assert rows[("infergate vs ceiling (1 text)", "c=32 texts=1 tokens=16")]["note"] == ""
    order = markdown(results).split("## Scenarios", 1)[1].split("\n\n")[1]
    assert [line.split(" | ")[0][2:] for line in order.splitlines()[2:]][3:6] == ["lean"] * 3


def test_targets_without_the_platform_say_so():
    results = _results()
    del results["scenarios"]["infergate"]
    rows = evaluate_targets(results)
    assert rows and all(r["passed"] is None for r in rows)
    assert all("infergate" in r["note"] for r in rows)


def test_informational_ratios():
    results = _results()
    hop = triton_hop(results)
    assert [h["cell"] for h in hop] == ["c32-t1-n16"]
    assert hop[0]["inprocess_over_infergate"] == pytest.approx(1.5)
    assert hop[0]["p50_saved_ms"] == pytest.approx(20.0)
    shares = {(s["scenario"], s["cell"]): s["share"] for s in ceiling_shares(results)}
    assert shares[("naive", "c32-t1-n16")] == pytest.approx(0.05)
    assert shares[("infergate", "c32-t16-n16")] == pytest.approx(0.96)


def test_markdown_report_shows_every_table_and_every_miss():
    text = markdown(_results())
    for heading in ("## Targets", "## Ceiling", "## Scenarios", "## Memory", "## Where the CPU"):
        assert heading in text
    assert "| infergate vs ceiling (1 text) | c=32 texts=1 tokens=16 | 0.50 x ceiling seq/s |" in (
        text
    )
    assert "MISS 9% short" in text
    assert "MISS 2 failed requests in the cell" in text
    assert "n/a (not measured: ensemble)" in text
    assert "| infergate | 32 | 1 | 16 | 500.0 | 500.0 | 60.00 |" in text
    assert "tritonserver 100%, serve replica 50%" in text
    assert "serve replica 2000 (19), tritonserver 1000 (1)" in text
    assert "`INFERGATE_X=1`" in text
    # What a request costs: 50 % of a core in the replica at 500 req/s is 1 ms a request,
    # 253 cores at the default GPU's 253,000 sequences a second.
    assert "| scenario | cell | req/s | replica ms/req | triton ms/req | total ms/req |" in text
    row = (
        "| infergate | c32-t1-n16 | 500.0 | 1.000 | 2.000 | 3.000 | 1,000.0 | 1,000.0 | 253 | 253 |"
    )
    assert row in text
    assert "times 253,000 sequences/s" in text


def test_write_report_writes_json_markdown_and_plots(tmp_path: Path):
    import json

    files = write_report(_results(), tmp_path)
    assert set(files) == {"json", "markdown", "throughput", "latency", "memory"}
    for path in files.values():
        assert path.exists() and path.stat().st_size > 0
    document = json.loads(files["json"].read_text())
    assert len(document["targets"]) == 8 and document["triton_hop"]
    assert {(row["scenario"], row["cell"]) for row in document["cost"]} == {
        ("infergate", "c32-t1-n16"), ("infergate", "c32-t16-n16"),
        ("naive", "c32-t1-n16"), ("inprocess", "c32-t1-n16"),
    }  # fmt: skip
    assert files["throughput"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_triton_batching_from_two_counter_snapshots():
    before = {"m": {"nv_inference_request_success": 10.0, "nv_inference_count": 10.0,
                    "nv_inference_exec_count": 10.0, "nv_inference_queue_duration_us": 1000.0,
                    "nv_inference_compute_infer_duration_us": 5000.0}}  # fmt: skip
    after = {
        "m": {"nv_inference_request_success": 110.0, "nv_inference_count": 410.0,
              "nv_inference_exec_count": 60.0, "nv_inference_queue_duration_us": 51000.0,
              "nv_inference_compute_infer_duration_us": 255000.0},
        "idle": {"nv_inference_request_success": 3.0},
    }  # fmt: skip
    table = procfs.triton_batching(before, after)
    assert set(table) == {"m", "idle"}
    assert table["m"] == {
        "requests": 100.0,
        "executions": 50.0,
        "rows_per_execution": 8.0,
        "queue_ms_per_request": 0.5,
        "compute_ms_per_execution": 2.5,
    }


def test_triton_counters_parsed_from_prometheus_text():
    text = (
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="ensemble",version="1"} 10\n'
        'nv_inference_count{model="sentiment__v1",version="1"} 4.5e+01\n'
        'nv_inference_exec_count{model="sentiment__v1",version="1"} 5\n'
        "nv_cpu_utilization{} 0.5\n"
        'nv_inference_pending_request_count{model="ensemble",version="1"} 3\n'
    )
    assert procfs.parse_triton_counters(text) == {
        "ensemble": {"nv_inference_count": 10.0},
        "sentiment__v1": {"nv_inference_count": 45.0, "nv_inference_exec_count": 5.0},
    }


def test_the_ceiling_keeps_the_faster_of_its_two_runs_per_row():
    from infergate.bench.measure import merge_ceiling_runs

    first = {
        "rows": [
            {"tokens": 16, "batch": 1, "sequences_per_s": 1200.0, "p50_ms": 0.8},
            {"tokens": 16, "batch": 32, "sequences_per_s": 900.0, "p50_ms": 40.0},
        ]
    }
    second = {"rows": [{"tokens": 16, "batch": 1, "sequences_per_s": 540.0, "p50_ms": 1.9},
                       {"tokens": 16, "batch": 32, "sequences_per_s": 1700.0, "p50_ms": 19.0},
                       {"tokens": 128, "batch": 1, "sequences_per_s": 190.0, "p50_ms": 5.0}],
              "probe_labels": ["positive"]}  # fmt: skip
    merged = merge_ceiling_runs(first, second)
    assert [r["p50_ms"] for r in merged["rows"]] == [0.8, 19.0, 5.0]
    assert [r.get("slower_run_sequences_per_s") for r in merged["rows"]] == [540.0, 900.0, None]
    assert merged["probe_labels"] == ["positive"] and merged["runs"] == 2


def test_variants_are_parsed_and_refused_when_malformed():
    from infergate.bench.options import Variant

    variant = Variant.parse("two-instances:INFERGATE_TRITON__INSTANCE_COUNT=2,X=a=b")
    assert variant == Variant(
        "two-instances", {"INFERGATE_TRITON__INSTANCE_COUNT": "2", "X": "a=b"}
    )
    for text in ("no-colon", ":A=1", "label:", "label:A", "label:=1"):
        with pytest.raises(ValueError, match="LABEL:NAME=VALUE"):
            Variant.parse(text)


def test_a_variant_is_reported_right_after_infergate():
    results = _results()
    results["scenarios"]["infergate (one-instance)"] = {
        "cells": [_cell(32, 1, 16, 400.0, 80.0, 120.0)]
    }
    scenario_table = markdown(results).split("## Scenarios", 1)[1].split("\n\n")[1]
    names = [line.split(" | ")[0][2:] for line in scenario_table.splitlines()[2:]]
    assert names == ["infergate"] * 3 + ["infergate (one-instance)", "inprocess", "naive"]


def test_cpu_budget_bounds_what_a_front_end_could_reach():
    from infergate.bench.analysis import cpu_budget

    results = _results()
    results["ceiling"]["rows"][1]["cpu_ms_per_sequence"] = 2.0  # 1000 seq/s on 2 cores
    floor = _cell(32, 1, 16, 1500.0, 20.0, 30.0)
    floor["server_cpu_percent"] = {"total": 150.0}  # 1.5 cores / 1500 req/s = 1 ms each
    results["scenarios"]["floor"] = {"cells": [floor]}
    [budget] = cpu_budget(results)
    assert budget["model_cpu_ms_per_sequence"] == 2.0
    assert budget["floor_cpu_ms_per_request"] == pytest.approx(1.0)
    # infergate: 150 % of a core at 500 req/s.
    assert budget["infergate_cpu_ms_per_request"] == pytest.approx(3.0)
    # 2 cores / (2 + 1) ms = 667 req/s, two thirds of the ceiling's 1000.
    assert budget["bound_share"] == pytest.approx(2 / 3)
    assert budget["infergate_share"] == pytest.approx(0.5)
    floor["noisy"] = True  # disturbed by other load: it prices nothing
    assert cpu_budget(results) == []
    floor["noisy"] = False
    # Without a paced floor there is no room to compute, and the share's miss says nothing.
    assert budget["floor_at_target_cpu_ms_per_request"] is None and budget["room_ms"] is None
    assert budget["own_work_ms"] is None
    text = markdown(results)
    assert "| 16 | 2.00 | 1.00 | 550.00 | - | - | 3.00 | - | - | 0.67 | 0.50 |" in text
    assert _single_text_share(results)["note"] == ""


def _single_text_share(results: dict) -> dict:
    [share] = [
        t for t in evaluate_targets(results) if t["target"] == "infergate vs ceiling (1 text)"
    ]
    return share


def _paced(purpose: str, pace: float, rps: float, server: float, client: float) -> dict:
    paced = _cell(32, 1, 16, rps, 35.0, 40.0)
    paced.update(server_cpu_percent={"total": server}, client_cpu_percent=client)
    return {**paced, "paced_for": purpose, "paced_for_requests_per_s": pace, "delay_ms": 58.2}


def _with_paced_floor(at_target: float, at_target_rps: float = 550.0) -> dict:
    """A ceiling of 1000 seq/s at 2 ms of CPU each (2 cores), infergate at 500 req/s and
    3 ms each, and the floor paced to the target's 550 req/s (``at_target`` % of a core
    there, 5.5 % for the load generator: 0.1 ms a request) and to infergate's 500 (0.6 ms)."""
    results = _results()
    results["ceiling"]["rows"][1]["cpu_ms_per_sequence"] = 2.0
    floor = _cell(32, 1, 16, 1500.0, 20.0, 30.0)
    floor["server_cpu_percent"] = {"total": 30.0}  # flat out: 0.2 ms each
    results["scenarios"]["floor"] = {
        "cells": [floor],
        "paced_cells": [
            _paced("target", 550.0, at_target_rps, at_target, 5.5),
            _paced("infergate", 500.0, 500.0, 30.0, 5.0),
        ],
    }
    return results


def test_cpu_budget_prices_the_floor_at_the_targets_rate_and_at_infergates():
    from infergate.bench.analysis import cpu_budget

    results = _with_paced_floor(at_target=27.5)  # 0.5 ms a request, 0.6 with the client
    [budget] = cpu_budget(results)
    assert budget["floor_cpu_ms_per_request"] == pytest.approx(0.2)
    assert budget["target_requests_per_s"] == pytest.approx(550.0)
    assert budget["floor_at_target_cpu_ms_per_request"] == pytest.approx(0.6)
    # At 550 req/s two cores have 3.64 ms per request: 2 for the model, 0.6 for the rest.
    assert budget["room_ms"] == pytest.approx(2000 / 550 - 2.6)
    # infergate: 3 ms per request at 500 req/s; the floor at that rate 0.6 of it.
    assert budget["floor_at_infergate_cpu_ms_per_request"] == pytest.approx(0.6)
    assert budget["own_work_ms"] == pytest.approx(0.4)
    # The bound reads the floor at the target's rate: 2 cores / 2.6 ms, 0.77 of the ceiling.
    assert budget["bound_share"] == pytest.approx(2000 / 2.6 / 1000)
    assert "| 16 | 2.00 | 0.20 | 550.00 | 0.60 | 1.04 | 3.00 | 0.60 | 0.40 | 0.77 | 0.50 |" in (
        markdown(results)
    )
    # Its own work fits the room, so the miss is not the CPU's: it says so.
    share = _single_text_share(results)
    assert verdict(share) == (
        "MISS 9% short, own work 0.40 ms/req, 1.04 left for it at the target's rate; the "
        "cores were not saturated (150 % of 200)"
    )


def test_a_paced_floor_far_off_its_rate_is_not_read():
    from infergate.bench.analysis import cpu_budget

    [budget] = cpu_budget(_with_paced_floor(at_target=27.5, at_target_rps=480.0))
    assert budget["floor_at_target_cpu_ms_per_request"] is None and budget["room_ms"] is None
    assert budget["own_work_ms"] == pytest.approx(0.4)  # the other pace still counts


def test_no_room_left_is_out_of_reach_only_beyond_the_margin():
    # 2 ms a request for the floor, 2.1 with the client: with the model's 2, 4.1 ms against
    # the 3.64 two cores have at 550 req/s, more than 10 % over.
    share = _single_text_share(_with_paced_floor(at_target=110.0))
    assert share["note"] == (
        "out of reach of this layout: the model, the floor and the load generator take "
        "4.10 ms/req of the 3.64 the cores have at the target's rate"
    )
    # 1.82 + 0.1: 3.92 ms against 3.64, within the margin of one run's estimates.
    share = _single_text_share(_with_paced_floor(at_target=100.0))
    assert share["note"] == (
        "no CPU left at the target's rate for the front-end's own work: the model, the "
        "floor and the load generator take 3.92 ms/req of 3.64"
    )


def test_a_share_met_or_with_failed_requests_keeps_its_own_note():
    results = _with_paced_floor(at_target=27.5)
    ours = cell_row(results, "infergate", 32, 1, 16)
    ours["errors"] = 3
    assert _single_text_share(results)["note"] == "3 failed requests in the cell"
    ours["errors"], ours["requests_per_s"], ours["sequences_per_s"] = 0, 600.0, 600.0
    share = _single_text_share(results)
    assert share["passed"] is True and verdict(share) == "PASS"


def test_no_budget_without_a_floor_or_the_ceiling_cpu():
    from infergate.bench.analysis import cpu_budget

    assert cpu_budget(_results()) == []
    assert "## CPU budget" not in markdown(_results())


def test_latency_budget_bounds_concurrency_one_and_explains_a_miss():
    from infergate.bench.analysis import latency_budget

    results = _results()
    infergate = results["scenarios"]["infergate"]
    infergate["cells"][0] = _cell(1, 1, 16, 200.0, 5.0, 7.0)  # required: 2 + 1.5 ms
    infergate["triton_alone"] = [{"tokens": 16, "calls": 900, "p50_ms": 3.6, "p95_ms": 4.0,
                                  "p99_ms": 5.0, "other_p50_ms": 4.4}]  # fmt: skip
    results["scenarios"]["floor"] = {"cells": [_cell(1, 1, 16, 3000.0, 0.5, 0.9)]}
    [budget] = latency_budget(results)
    assert budget["required_ms"] == 3.5 and budget["bound_ms"] == pytest.approx(4.1)
    assert budget["infergate_p50_ms"] == 5.0
    target = ("c=1 p50 <= ceiling batch-1 p50 + 1.5 ms", "c=1 texts=1 tokens=16")

    def note() -> str:
        return {(r["target"], r["cell"]): r for r in evaluate_targets(results)}[target]["note"]

    assert note() == "out of reach of this layout: Triton alone 3.60 + floor 0.50 = 4.10 ms"
    text = markdown(results)
    assert "| 16 | 3.50 | 3.60 | 4.40 | 0.50 | 4.10 | 5.00 |" in text
    assert "MISS 43% over, out of reach of this layout" in text
    # Failed requests are what the row must say, whatever the bound.
    infergate["cells"][0] = _cell(1, 1, 16, 200.0, 5.0, 7.0, errors=3)
    assert note() == "3 failed requests in the cell"
    # A bound within the margin of the requirement (3.7 <= 1.1 x 3.5) leaves the miss on
    # the platform: no note.
    infergate["cells"][0] = _cell(1, 1, 16, 200.0, 5.0, 7.0)
    infergate["triton_alone"][0]["p50_ms"] = 3.2
    assert note() == ""


def test_triton_alone_keeps_the_faster_of_two_runs_per_length():
    from infergate.bench.runner import faster_rows

    def row(tokens: int, p50: float, run: str) -> dict:
        return {"tokens": tokens, "calls": 100, "p50_ms": p50, "p99_ms": p50, "run": run}

    before = [row(16, 4.3, "before"), row(128, 12.0, "before")]
    after = [row(16, 3.1, "after"), row(128, 12.8, "after")]
    assert faster_rows(before, after) == [
        {**row(16, 3.1, "after"), "other_p50_ms": 4.3},
        {**row(128, 12.0, "before"), "other_p50_ms": 12.8},
    ]
    # One run failed (no rows): the other stands alone.
    assert faster_rows([], after) == after
    assert faster_rows([], []) == []


def test_no_latency_budget_without_triton_alone_or_the_floor():
    from infergate.bench.analysis import latency_budget

    results = _results()
    assert latency_budget(results) == []
    results["scenarios"]["infergate"]["triton_alone"] = [
        {"tokens": 16, "calls": 9, "p50_ms": 3.0, "p95_ms": 3.0, "p99_ms": 3.0}
    ]
    assert latency_budget(results) == []  # no floor
    assert "## Latency budget" not in markdown(results)
    # A floor disturbed by other load (a stack left running beside the benchmark)
    # read 15.5 ms and "explained" a 5.3 ms infergate: no estimate from it.
    noisy = {**_cell(1, 1, 16, 60.0, 15.5, 20.0), "noisy": True}
    results["scenarios"]["floor"] = {"cells": [noisy]}
    assert latency_budget(results) == []
    results["scenarios"]["floor"] = {"cells": [{**noisy, "noisy": False}]}
    assert len(latency_budget(results)) == 1


def test_plots_leave_the_floor_out_and_colour_variants_apart():
    from infergate.bench.plots import _plotted

    results = _results()
    results["scenarios"]["floor"] = {"cells": []}
    results["scenarios"]["infergate (a)"] = {"cells": []}
    results["scenarios"]["infergate (b)"] = {"cells": []}
    results["scenarios"]["lean"] = {"cells": []}
    plotted = dict(_plotted(results))
    assert "floor" not in plotted
    names = ("infergate", "infergate (a)", "infergate (b)", "lean", "naive", "inprocess")
    assert len({plotted[name] for name in names}) == len(names)


def test_a_stack_running_beside_the_benchmark_is_found(tmp_path, monkeypatch):
    from infergate.bench.cli import running_stack
    from infergate.stack.supervisor import STATE_FILE

    monkeypatch.setenv("INFERGATE_STATE_DIR", str(tmp_path))
    assert running_stack() is None
    (tmp_path / STATE_FILE).write_text(json.dumps({"pid": os.getpid()}))
    assert running_stack() == tmp_path
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    (tmp_path / STATE_FILE).write_text(json.dumps({"pid": int(gone.stdout)}))
    assert running_stack() is None  # a stack that died without `down`


def test_every_share_divides_by_the_fastest_ceiling_row_not_batch_32():
    """A batch-16 ceiling row faster than batch 32: shares and targets divide by it."""
    results = _results()
    results["ceiling"]["rows"].append(
        {"tokens": 16, "batch": 16, "sequences_per_s": 1250.0, "p50_ms": 12.0, "p95_ms": 13.0,
         "p99_ms": 14.0}
    )  # fmt: skip
    shares = {(s["scenario"], s["cell"]): s["share"] for s in ceiling_shares(results)}
    assert shares[("infergate", "c32-t1-n16")] == pytest.approx(500 / 1250)
    rows = {(r["target"], r["cell"]): r for r in evaluate_targets(results)}
    assert rows[("infergate vs ceiling (1 text)", "c=32 texts=1 tokens=16")][
        "value"
    ] == pytest.approx(0.4)


def test_infergate_is_compared_with_the_faster_of_the_naive_servers():
    results = _results()
    results["scenarios"]["naive-int8"] = {"cells": [_cell(32, 1, 16, 80.0, 400.0, 600.0)]}
    rows = {(r["target"], r["cell"]): r for r in evaluate_targets(results)}
    assert rows[("infergate vs naive", "c=32 texts=1 tokens=16")]["value"] == pytest.approx(
        500 / 80
    )

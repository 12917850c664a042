"""`infergate bench --smoke` end to end, in one run: the in-process ceiling, the naive
FastAPI/PyTorch server (fp32, and int8 by PyTorch's dynamic quantisation), the Triton
ensemble, the Ray Serve floor, the lean front-end on the whole stack, the short form of
the task cells (`--tasks`), the gRPC cell and the batch cell, and the stack before the
stand-in model, all real processes on free ports. One run: the model is prepared and the
ceiling measured once for every part, the lean stack started once (in the smoke the gRPC,
task and batch cells run on it), each test reading its results.

The `infergate` scenario itself and the in-process front-end are left out here only
because they take longer; `infergate bench --quick` runs them all. The first run on a
machine also builds the benchmark model (about a minute and a half) and registers the task
cell's model; later runs reuse them.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from infergate.bench.analysis import WITHOUT_MODEL, best_ceiling_row, cell_row
from infergate.bench.grpc_cell import WAYS
from infergate.bench.workload import PROBE_TEXTS, TARGET_CELLS

# The first test waits for the whole run (its module fixture). It measures, so on two
# workers it runs alone (quiet): beside the other worker's tests a run here took 514 s
# instead of 227, and the tests built on the floor skipped, its cell noisy.
pytestmark = [pytest.mark.e2e, pytest.mark.quiet, pytest.mark.timeout(1500)]
SCENARIOS = ("naive", "naive-int8", "ensemble", "floor")  # each a process of its own
STACK_SCENARIOS = ("lean", "stand-in")  # on the whole stack


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results folder of the one `bench --smoke` run every test reads."""
    out = tmp_path_factory.mktemp("bench") / "results"
    command = [sys.executable, "-m", "infergate.bench.cli", "bench", "--smoke", "--out", str(out)]
    command += ["--scenarios", "ceiling", *SCENARIOS, *STACK_SCENARIOS, "grpc", "batch", "--tasks"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1400, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    for name in ("results.json", "results.md", "throughput.png", "latency.png", "memory.png"):
        assert (out / name).stat().st_size > 0, name
    # A progress line per measured cell (the task cell has 4 texts a request), and the gRPC
    # cell's one per way in.
    expected = len(SCENARIOS) + len(STACK_SCENARIOS) + len(WAYS)
    assert done.stderr.count("c=32  texts=16") == expected
    # One stack: the task cells did not start one of their own.
    assert "[tasks] starting the stack" not in done.stderr
    return out


@pytest.fixture(scope="module")
def results(out: Path) -> dict:
    results = json.loads((out / "results.json").read_text())
    assert set(results["scenarios"]) == {*SCENARIOS, *STACK_SCENARIOS}
    return results


def test_ceiling_measured_on_the_served_file(results):
    rows = {(r["tokens"], r["batch"]): r for r in results["ceiling"]["rows"]}
    assert set(rows) == {(16, 1), (16, 16), (16, 32)}
    assert all(r["sequences_per_s"] > 0 and r["p50_ms"] > 0 for r in rows.values())
    assert results["ceiling"]["probe_labels"] == ["positive", "negative"]
    assert results["ceiling"]["memory"]["total"]["rss_mb"] > 50


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_cell_measured_without_errors(results, name):
    record = results["scenarios"][name]
    assert "error" not in record, record.get("log_tail")
    if name == "floor":  # answers without the model: one empty output per text
        assert record["probe"] == {
            "status": 200,
            "labels": [None] * len(PROBE_TEXTS),
            "agrees_with_ceiling": None,
        }
    else:
        assert record["probe"]["labels"] == ["positive", "negative"]
        assert record["probe"]["agrees_with_ceiling"] is True
    cells = {(c["concurrency"], c["texts"], c["tokens"]): c for c in record["cells"]}
    assert set(cells) == {(c.concurrency, c.texts, c.tokens) for c in TARGET_CELLS}
    for cell in cells.values():
        assert cell["errors"] == 0, cell["error_kinds"]
        assert cell["ok"] >= 2 * cell["concurrency"]  # the window waits for slow cells
        assert cell["requests_per_s"] > 0 and 0 < cell["p50_ms"] <= cell["p99_ms"]
        assert cell["sequences_per_s"] == pytest.approx(cell["requests_per_s"] * cell["texts"])
        assert cell["server_cpu_percent"]["total"] > 0
    memory = record["memory"]
    assert memory["total"]["rss_mb"] > 100 and memory["total"]["processes"] >= 2
    assert record["info"]["leftover_processes"] == 0


def test_memory_is_split_by_component(results):
    ensemble = results["scenarios"]["ensemble"]["memory"]
    assert {"tritonserver", "triton python stub"} <= set(ensemble)
    naive = results["scenarios"]["naive"]["memory"]
    assert naive["uvicorn worker"]["processes"] == results["scenarios"]["naive"]["info"]["workers"]


def test_ratios_computed_and_missing_targets_reported(results):
    shares = {(s["scenario"], s["cell"]) for s in results["ceiling_shares"]}
    assert shares == {
        (n, c.key)
        for n in (*SCENARIOS, *STACK_SCENARIOS)
        for c in TARGET_CELLS
        if c.concurrency == 32 and n not in WITHOUT_MODEL
    }
    assert all(math.isfinite(s["share"]) and s["share"] > 0 for s in results["ceiling_shares"])
    # infergate itself was not run: its targets are listed, marked as not measured.
    targets = results["targets"]
    assert len(targets) == 8
    assert all(t["passed"] is None and "infergate" in t["note"] for t in targets)


def quiet_floor(results: dict) -> dict:
    """The floor's single-text cell; skips the test when other work on the machine made it
    noisy, as the report then leaves the figures built on it out (and says so)."""
    floor = cell_row(results, "floor", 32, 1, 16)
    assert floor is not None
    if floor.get("noisy"):
        assert results["cpu_budget"] == []  # nothing is built on a noisy floor
        pytest.skip(f"other work took {floor['other_cpu_percent']:.0f}% of a core meanwhile")
    return floor


def test_the_floor_bounds_a_ray_serve_front_end(results):
    quiet_floor(results)
    [budget] = results["cpu_budget"]
    assert budget["tokens"] == 16 and budget["infergate_share"] is None
    # A request through Ray Serve costs CPU even when it does nothing, so the best share a
    # front-end on it could reach is the cores' CPU over the model's and the floor's cost
    # per request, against the ceiling. That is below 1 when the ceiling keeps every core
    # busy; a smoke's 0.6 s ceiling may not (one CI run: 1.06), so 1 is no bound here.
    # Against the ceiling's fastest row at 16 tokens, whatever its batch (batch 16 or 32,
    # by the run's noise), as every share of the ceiling is.
    ceiling = best_ceiling_row(results, 16)
    floor = budget["floor_at_target_cpu_ms_per_request"] or budget["floor_cpu_ms_per_request"]
    cpu_ms = budget["model_cpu_ms_per_sequence"] + floor
    expected = results["meta"]["cpus"] * 1e3 / cpu_ms / ceiling["sequences_per_s"]
    assert budget["floor_cpu_ms_per_request"] > 0 and floor > 0
    assert budget["bound_share"] == pytest.approx(expected)


def test_the_floor_is_paced_to_the_rate_the_single_text_target_asks(results):
    quiet_floor(results)
    # infergate did not run here, so there is no pace of its own to hold the floor to.
    [paced] = results["scenarios"]["floor"]["paced_cells"]
    assert paced["paced_for"] == "target"
    pace = paced["paced_for_requests_per_s"]
    # Paced from the ceiling's first run, its fastest row at 16 tokens (batch 16 or 32);
    # each row keeps the faster of its two runs.
    rows = [r for r in results["ceiling"]["rows"] if r["tokens"] == 16]
    runs = [v for r in rows for v in (r["sequences_per_s"], r.get("slower_run_sequences_per_s"))]
    assert any(pace == pytest.approx(0.55 * run) for run in runs if run)
    assert (paced["concurrency"], paced["texts"], paced["tokens"]) == (32, 1, 16)
    assert paced["errors"] == 0
    # Every answer waits out the delay (shortened by the wait for the answer itself when
    # the first measurement fell short), so the loop runs at about the pace; flat out the
    # floor runs several times faster. A smoke cell lasts 0.6 s: the window is loose.
    assert 0 <= paced["delay_ms"] <= 32e3 / pace
    assert paced["p50_ms"] >= paced["delay_ms"]
    assert 0.6 * pace <= paced["requests_per_s"] <= 1.2 * pace
    flat_out = next(c for c in results["scenarios"]["floor"]["cells"] if c["cell"] == "c32-t1-n16")
    assert flat_out["requests_per_s"] > 2 * paced["requests_per_s"]
    # The budget reads it when it ran within 10 % of the report's target rate.
    [budget] = results["cpu_budget"]
    near = abs(paced["requests_per_s"] / budget["target_requests_per_s"] - 1) <= 0.1
    assert (budget["room_ms"] is not None) == near
    assert budget["own_work_ms"] is None  # no infergate run


def test_results_folder_has_a_readable_report(results, tmp_path: Path):
    from infergate.bench.report import markdown

    text = markdown(results)
    assert "| naive | 32 | 16 | 16 |" in text and "| ensemble | 1 | 1 | 16 |" in text


def test_the_lean_front_end_answers_on_the_stack_and_leaves_nothing_behind(results):
    record = results["scenarios"]["lean"]
    assert "error" not in record, record.get("log_tail")
    assert record["probe"] == {
        "status": 200,
        "labels": ["positive", "negative"],
        "agrees_with_ceiling": True,
    }
    cells = {(c["concurrency"], c["texts"], c["tokens"]): c for c in record["cells"]}
    assert set(cells) == {(c.concurrency, c.texts, c.tokens) for c in TARGET_CELLS}
    assert all(c["errors"] == 0 and c["requests_per_s"] > 0 for c in cells.values())
    # It calls the stack's Triton: the model executed the 16-text cell's rows there.
    batching = cells[(32, 16, 16)]["triton"]
    assert sum(model["executions"] for model in batching.values()) > 0
    assert record["info"]["left_after_down"] == []
    # On the task cells' store (see test_a_task_cell_...), serving the ceiling's very file.
    assert record["info"]["served_onnx_is_prepared_file"] is True
    shares = {s["cell"]: s["share"] for s in results["ceiling_shares"] if s["scenario"] == "lean"}
    assert set(shares) == {"c32-t1-n16", "c32-t16-n16"} and min(shares.values()) > 0


def test_the_stand_in_model_is_registered_served_and_leaves_the_front_end_the_cost(results):
    """The stack before a model that costs Triton next to nothing, registered from its
    ONNX file as a user registers one (once per cache): it answers every cell, Triton's
    CPU per request is a fraction of the replica's, and it has no share of the ceiling."""
    record = results["scenarios"]["stand-in"]
    assert "error" not in record, record.get("log_tail")
    probe = record["probe"]
    assert probe["status"] == 200 and probe["agrees_with_ceiling"] is None
    assert len(probe["labels"]) == 2 and set(probe["labels"]) <= {"positive", "negative"}
    cells = {(c["concurrency"], c["texts"], c["tokens"]): c for c in record["cells"]}
    assert set(cells) == {(c.concurrency, c.texts, c.tokens) for c in TARGET_CELLS}
    assert all(c["errors"] == 0 and c["requests_per_s"] > 0 for c in cells.values())
    assert record["info"]["served_onnx_is_prepared_file"] is True  # the stand-in's graph
    assert record["info"]["left_after_down"] == []
    assert "stand-in" not in {s["scenario"] for s in results["ceiling_shares"]}
    [cost] = [
        r for r in results["cost"] if (r["scenario"], r["cell"]) == ("stand-in", "c32-t1-n16")
    ]
    assert cost["ms_per_request"]["triton"] < cost["ms_per_request"]["replica"], cost


def test_the_cost_of_a_request_is_split_by_part_and_priced_in_cores_per_gpu(results, out: Path):
    """Every c=32 cell's CPU per request and per sequence, by part of the stack, and the
    front-end cores a GPU at the run's rate (the H200 default) would need."""
    from infergate.bench.cost import H200_FP16_16_TOKENS_SEQUENCES_PER_S

    assert results["meta"]["gpu_sequences_per_s"] == H200_FP16_16_TOKENS_SEQUENCES_PER_S
    rows = {(r["scenario"], r["cell"]): r for r in results["cost"]}
    expected = {(n, c.key) for n in (*SCENARIOS, *STACK_SCENARIOS) for c in TARGET_CELLS
                if c.concurrency == 32}  # fmt: skip
    assert set(rows) == expected
    for (scenario, _), row in rows.items():
        assert row["total_ms_per_request"] > 0
        assert all(v >= 0 for v in row["ms_per_request"].values())
        if scenario in STACK_SCENARIOS:  # a stack: ingress, replica, Triton, Ray apart
            assert {"ingress", "replica", "triton", "ray"} <= set(row["ms_per_request"])
            assert row["ms_per_request"]["replica"] > 0 and row["ms_per_request"]["triton"] > 0
            assert row["replica_cores_per_gpu"] > 0
            assert row["front_end_cores_per_gpu"] > row["replica_cores_per_gpu"]
            per_sequence = row["us_per_sequence"]["replica"] * 1e-6
            assert row["replica_cores_per_gpu"] == pytest.approx(
                per_sequence * H200_FP16_16_TOKENS_SEQUENCES_PER_S, rel=0.01, abs=0.1
            )
        elif scenario == "floor":  # Ray Serve's ingress and a replica, no model
            assert row["replica_cores_per_gpu"] > 0 and "triton" not in row["ms_per_request"]
        else:  # a server of one piece: no front-end apart from the model
            assert row["front_end_cores_per_gpu"] is None
    assert "## What a request costs" in (out / "results.md").read_text()


def test_a_task_cell_runs_against_its_ceiling(results, out: Path):
    """`bench --smoke --tasks`: the short form of the task cells, feature-extraction on the
    whole stack against its own ceiling (the first run on a machine also registers the
    task's model)."""
    tasks = results["tasks"]
    assert "error" not in tasks["stack"], tasks["stack"].get("log_tail")
    assert tasks["stack"]["shared_with"] == "lean"  # the smoke's one stack
    assert tasks["stack"]["start_s"] == results["scenarios"]["lean"]["start_s"]
    assert tasks["stack"]["served_model_is_prepared_file"] == {"feature-extraction": True}
    assert tasks["stack"]["left_after_down"] == []
    record = tasks["cases"]["feature-extraction"]
    assert record["model"] == "embed" and not record["random_weights"]
    cell = record["served"]["infergate"]["cell"]
    assert (cell["concurrency"], cell["texts"], cell["tokens"]) == (32, 4, 16)
    assert cell["errors"] == 0 and cell["ok"] >= 2 * cell["concurrency"]
    ceiling = record["ceiling"]
    assert ceiling["task"] == "feature-extraction" and ceiling["runs"] == 2
    assert {row["batch"] for row in ceiling["rows"]} == {1, 16, 32}
    [row] = results["task_rows"]
    assert row["server"] == "infergate" and row["error"] is None
    assert math.isfinite(row["share"]) and row["share"] > 0
    best = max(r["sequences_per_s"] for r in ceiling["rows"])
    assert row["share"] == pytest.approx(cell["sequences_per_s"] / best)
    assert "## Tasks" in (out / "results.md").read_text()


def test_the_batch_cell_runs_a_job_beside_the_ceiling_and_the_online_path(results, out: Path):
    """`infergate batch` on the lean stack's registered model, the in-process ceiling and
    the online path, each over the same file's texts: every row answered by each, and
    the ratios of their rows/s (no threshold: the smoke's box is shared)."""
    cell = results["batch"]
    assert "error" not in cell, cell
    assert cell["stack"] == "lean" and cell["batch_size"] == 32
    rows = cell["rows"]
    job = cell["job"]
    assert cell["job_rows"] == rows  # the smoke's job file holds the texts once
    assert job["rows"] == rows and job["errors"] == 0 and job["parts"] == 4
    assert job["output_rows"] == job["output_distinct_ids"] == rows
    assert job["output_errors"] == 0
    # The parts' span fits in the job's time, and the actors' time on parts in the span
    # times the actors: end to end <= after start-up <= busy.
    assert 0 < job["rows_per_s"] <= job["work_rows_per_s"] * 1.001
    assert job["work_rows_per_s"] <= job["busy_rows_per_s"] * 1.001
    assert 0 < job["ray_start_s"] < job["startup_s"] < job["duration_s"]
    online = cell["online"]
    assert online["answered"] == rows and online["errors"] == 0
    assert online["requests"] == math.ceil(rows / 32) and online["rows_per_s"] > 0
    ceiling = cell["ceiling"]
    assert ceiling["rows"] == rows and ceiling["batch"] == 32 and ceiling["sequences_per_s"] > 0
    # The bench's INT8 graph runs each text alone as served; its padded batches apart.
    assert ceiling["rows_alone"] is True and ceiling["padded"]["sequences_per_s"] > 0
    ratios = cell["ratios"]
    assert all(math.isfinite(v) and v > 0 for v in ratios.values()), ratios
    assert ratios["job_over_ceiling"] == pytest.approx(
        job["rows_per_s"] / ceiling["sequences_per_s"]
    )
    assert ratios["busy_over_online"] == pytest.approx(
        job["busy_rows_per_s"] / online["rows_per_s"]
    )
    assert "## Batch" in (out / "results.md").read_text()


def test_the_grpc_cell_measures_the_front_end_each_way_in_on_the_same_texts(results, out: Path):
    """The platform's front-end over gRPC (V2 ModelInfer) beside HTTP (/predict and V2
    REST) on the lean stack, same texts, c=32: every row answered without errors, the
    answers equal, and gRPC's ratios to each HTTP way (no threshold: the box is shared)."""
    cell = results["grpc"]
    assert "error" not in cell, cell
    assert cell["stack"] == "lean"
    probe = cell["probe"]
    assert probe["agree"] is True and probe["tensors_equal_v2_rest"] is True
    assert probe["labels"] == {way.name: ["positive", "negative"] for way in WAYS}
    measured = {(row["cell"], row["way"]) for row in cell["rows"]}
    cells = [c.key for c in TARGET_CELLS if c.concurrency == 32]
    assert measured == {(c, way.name) for c in cells for way in WAYS}
    for row in cell["rows"]:
        assert row["errors"] == 0, (row["way"], row["error_kinds"])
        assert row["ok"] >= 2 * row["concurrency"] and row["requests_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["server_cpu_percent"]["serve replica"] > 0
    rows = {(r["cell"], r["way"]): r for r in results["grpc_rows"]}
    assert all(r["replica_ms"] > 0 and r["total_cpu_ms"] > 0 for r in rows.values())
    ratios = results["grpc_ratios"]
    assert {(r["cell"], r["over"]) for r in ratios} == {
        (c, way.name) for c in cells for way in WAYS if way.name != "grpc v2"
    }
    for ratio in ratios:
        grpc, http = rows[(ratio["cell"], "grpc v2")], rows[(ratio["cell"], ratio["over"])]
        assert ratio["requests_per_s"] == pytest.approx(
            grpc["requests_per_s"] / http["requests_per_s"]
        )
    # What the cell adds to a smoke run, the issue allows about 15 s: its six measurements
    # (each taken once in the smoke) and little else. On a busy box a measurement's window
    # waits for two answers per client, which can take longer than the cell's 0.6 s.
    assert all(row["attempts"] == 1 for row in cell["rows"])
    measured = sum(row["elapsed_s"] for row in cell["rows"])
    assert 0 < measured < cell["cell_s"] <= max(15.0, measured + 10.0), (measured, cell["cell_s"])
    assert "## gRPC beside HTTP" in (out / "results.md").read_text()

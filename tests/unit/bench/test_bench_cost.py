"""The cost table's derivation (infergate.bench.cost): CPU per request and per sequence by
part of the stack, and the front-end cores a GPU needs."""

from __future__ import annotations

import pytest

from infergate.bench.cost import (
    H200_FP16_16_TOKENS_SEQUENCES_PER_S,
    cell_cost,
    cost_rows,
    gpu_rate,
    part_of,
)


def stack_cell(texts: int = 1, rps: float = 800.0) -> dict:
    # Percent of one core over the cell, as measure.py records it.
    return {
        "cell": f"c32-t{texts}-n16",
        "concurrency": 32,
        "texts": texts,
        "requests_per_s": rps,
        "server_cpu_percent": {
            "total": 200.0,
            "serve replica": 48.0,
            "haproxy ingress": 5.6,
            "serve proxy": 0.8,
            "tritonserver": 30.0,
            "triton python stub": 62.8,
            "supervisor": 4.0,
            "mlflow": 1.0,
            "serve controller": 2.0,
            "ray system": 3.0,
            "ray agents and actors": 1.6,
        },
    }


def test_components_fall_into_the_parts_of_the_stack():
    assert part_of("haproxy ingress") == part_of("serve proxy") == "ingress"
    assert part_of("triton python stub") == part_of("tritonserver") == "triton"
    assert part_of("serve controller") == "ray"
    assert part_of("supervisor") == "control plane"
    assert part_of("uvicorn worker") == "server"


def test_cpu_per_request_and_sequence_by_part():
    cost = cell_cost(stack_cell(), gpu_sequences_per_s=1000.0)
    ms = cost["ms_per_request"]
    # 48 % of a core over 800 req/s is 0.6 ms per request.
    assert ms["replica"] == pytest.approx(0.6)
    assert ms["ingress"] == pytest.approx((5.6 + 0.8) / 100 / 800 * 1e3)
    assert ms["triton"] == pytest.approx(92.8 / 100 / 800 * 1e3)
    assert ms["control plane"] == pytest.approx(5.0 / 100 / 800 * 1e3)
    assert ms["ray"] == pytest.approx(6.6 / 100 / 800 * 1e3)
    assert cost["total_ms_per_request"] == pytest.approx(sum(ms.values()), abs=1e-3)
    # One text a request: per sequence is per request, in microseconds.
    assert cost["us_per_sequence"]["replica"] == pytest.approx(600.0)
    assert cost["front_end_us_per_sequence"] == pytest.approx(600.0 + 80.0)
    # 0.6 ms a sequence keeps 0.6 cores busy per 1000 sequences/s.
    assert cost["replica_cores_per_gpu"] == pytest.approx(0.6, abs=0.05)
    assert cost["front_end_cores_per_gpu"] == pytest.approx(0.7, abs=0.05)


def test_texts_per_request_divide_the_sequence_figures():
    cost = cell_cost(stack_cell(texts=16, rps=100.0))
    # 48 % over 100 req/s: 4.8 ms a request, 300 us for each of its 16 texts.
    assert cost["ms_per_request"]["replica"] == pytest.approx(4.8)
    assert cost["us_per_sequence"]["replica"] == pytest.approx(300.0)
    rate = H200_FP16_16_TOKENS_SEQUENCES_PER_S
    assert cost["replica_cores_per_gpu"] == pytest.approx(300e-6 * rate, abs=0.1)


def test_a_server_without_a_front_end_has_no_cores_per_gpu():
    row = {"cell": "c32-t1-n16", "concurrency": 32, "texts": 1, "requests_per_s": 100.0,
           "server_cpu_percent": {"total": 190.0, "uvicorn worker": 190.0}}  # fmt: skip
    cost = cell_cost(row)
    assert cost["ms_per_request"] == {"server": pytest.approx(19.0)}
    assert cost["replica_cores_per_gpu"] is None and cost["front_end_cores_per_gpu"] is None


def test_cells_that_answered_nothing_or_other_concurrencies_are_left_out():
    idle = {**stack_cell(), "requests_per_s": 0.0}
    c1 = {**stack_cell(), "concurrency": 1}
    results = {"scenarios": {"infergate": {"cells": [stack_cell(), idle, c1]}, "x": {}}}
    rows = cost_rows(results, 1000.0)
    assert [(r["scenario"], r["cell"]) for r in rows] == [("infergate", "c32-t1-n16")]
    assert cell_cost(idle) is None


def test_the_gpu_rate_is_the_runs_or_the_h200_default():
    assert gpu_rate({"meta": {"gpu_sequences_per_s": 90_000}}) == 90_000
    assert gpu_rate({"meta": {}}) == H200_FP16_16_TOKENS_SEQUENCES_PER_S == 253_000
    with pytest.raises(ValueError, match="expected > 0"):
        cell_cost(stack_cell(), gpu_sequences_per_s=0)

"""The gRPC cell's pure parts: the requests each way carries, the cells it measures, and
the report's rows and ratios (``infergate.bench.grpc_cell``, ``grpc_table``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2

from infergate.bench.grpc_cell import WAYS, cells_of, v2_body, v2_outputs
from infergate.bench.grpc_table import GRPC, grpc_ratios, grpc_section, way_rows
from infergate.bench.workload import PROFILES, Cell
from infergate.protocols.v2_binary import binary_elements


def test_each_way_carries_the_same_texts():
    stack = SimpleNamespace(port=8000, env={"INFERGATE_FRONTEND__GRPC_PORT": "8081"})
    requests = [["I love this film", "Ünïcode"], ["This is terrible"]]
    targets = {way.name: way.target(stack, requests) for way in WAYS}  # type: ignore[arg-type]
    assert set(targets) == {"http predict", "http v2", GRPC}
    predict = [orjson.loads(body)["inputs"] for body in targets["http predict"].bodies]
    rest = [orjson.loads(body)["inputs"][0]["data"] for body in targets["http v2"].bodies]
    grpc_texts = []
    for raw in targets[GRPC].bodies:
        message = service_pb2.ModelInferRequest.FromString(raw)
        texts = binary_elements(message.raw_input_contents[0], 16, "'text'")
        assert message.model_name == "sentiment" and message.inputs[0].name == "text"
        assert list(message.inputs[0].shape) == [len(texts)]
        grpc_texts.append(texts)
    assert predict == rest == grpc_texts == requests
    assert targets[GRPC].port == 8081 and targets["http v2"].path == "/v2/models/sentiment/infer"


def test_a_v2_rest_answer_reads_as_grpc_s_arrays():
    answer = orjson.dumps({"model_name": "sentiment", "outputs": [
        {"name": "probabilities", "datatype": "FP32", "shape": [2, 2],
         "data": [0.25, 0.75, 0.5, 0.5]},
        {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["positive", "négatif"]},
    ]})  # fmt: skip
    outputs = v2_outputs(answer)
    np.testing.assert_array_equal(
        outputs["probabilities"], np.array([[0.25, 0.75], [0.5, 0.5]], np.float32)
    )
    assert outputs["probabilities"].dtype == np.float32
    assert list(outputs["label"]) == [b"positive", "négatif".encode()]
    assert orjson.loads(v2_body(["a"])) == {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]
    }


def test_the_cells_are_the_single_and_16_text_ones_at_concurrency_32():
    for profile in PROFILES.values():
        assert cells_of(profile) == [Cell(32, 1, 16), Cell(32, 16, 16)], profile.name


def row(way: str, cell: str, texts: int, rps: float, p50: float, replica: float, errors=0):
    """A measured row as measure_cell gives it, ``replica`` percent of a core."""
    return {
        "way": way, "cell": cell, "texts": texts, "concurrency": 32,
        "requests_per_s": rps, "sequences_per_s": rps * texts, "p50_ms": p50,
        "p99_ms": 2 * p50, "errors": errors, "client_cpu_percent": 40.0,
        "server_cpu_percent": {"total": replica + 50, "serve replica": replica,
                               "haproxy ingress": 10.0, "tritonserver": 40.0},
    }  # fmt: skip


RECORD = {
    "stack": "lean",
    "ways": {w.name: {"endpoint": w.endpoint, "setting": w.setting} for w in WAYS},
    "probe": {"agree": True, "labels": {}},
    "load_average_at_start": [1.5, 1, 1],
    "load_average_at_end": [2.0, 1, 1],
    "cell_s": 9.4,
    "rows": [
        row("http predict", "c32-t1-n16", 1, 400.0, 60.0, 80.0),
        row("http v2", "c32-t1-n16", 1, 380.0, 64.0, 84.0),
        row(GRPC, "c32-t1-n16", 1, 500.0, 50.0, 70.0),
        row("http predict", "c32-t16-n16", 16, 50.0, 600.0, 30.0),
        row("http v2", "c32-t16-n16", 16, 48.0, 620.0, 30.0, errors=2),
        row(GRPC, "c32-t16-n16", 16, 55.0, 580.0, 28.0),
    ],
}


def test_rows_carry_the_cpu_per_request_by_part():
    rows = {(r["cell"], r["way"]): r for r in way_rows(RECORD)}
    assert len(rows) == 6
    single = rows[("c32-t1-n16", GRPC)]
    assert single["replica_ms"] == pytest.approx(1e3 * 0.70 / 500)  # 70 % of a core / 500 req/s
    assert single["ingress_ms"] == pytest.approx(1e3 * 0.10 / 500)
    assert single["triton_ms"] == pytest.approx(1e3 * 0.40 / 500)
    assert single["total_cpu_ms"] == pytest.approx(1e3 * 1.20 / 500, abs=1e-3)
    assert rows[("c32-t16-n16", "http v2")]["errors"] == 2


def test_ratios_are_grpc_over_each_http_way_of_the_same_cell():
    ratios = {(r["cell"], r["over"]): r for r in grpc_ratios(RECORD)}
    assert set(ratios) == {(c, w) for c in ("c32-t1-n16", "c32-t16-n16")
                           for w in ("http predict", "http v2")}  # fmt: skip
    over_predict = ratios[("c32-t1-n16", "http predict")]
    assert over_predict["requests_per_s"] == pytest.approx(500 / 400)
    assert over_predict["p50_ms"] == pytest.approx(50 / 60)
    assert over_predict["replica_ms"] == pytest.approx((0.70 / 500) / (0.80 / 400))
    # A side with errors gives no ratio rather than a flattering one.
    assert all(v is None for k, v in ratios[("c32-t16-n16", "http v2")].items()
               if k not in ("cell", "over"))  # fmt: skip
    assert ratios[("c32-t16-n16", "http predict")]["requests_per_s"] == pytest.approx(55 / 50)


def test_the_report_section_shows_every_way_and_the_ratios():
    text = "\n".join(grpc_section({"grpc": RECORD}))
    assert "## gRPC beside HTTP" in text and "grpc v2: ModelInfer, a channel (its own" in text
    assert "| c32-t1-n16 | grpc v2 | 500.0 | 500.0 | 50.00 | 100.00 | 0 |" in text
    assert "| c32-t1-n16 | http predict | 1.25 | 0.83 |" in text
    assert "| c32-t16-n16 | http v2 | - | - |" in text
    assert "agree: yes" in text and "took 9 s" in text
    failed = grpc_section({"grpc": {"error": "RuntimeError: no stack"}})
    assert failed[-1] == "Failed: RuntimeError: no stack"
    assert grpc_section({}) == []

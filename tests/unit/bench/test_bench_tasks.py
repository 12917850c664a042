"""The task cells' pure parts: the task table, the command line's choice of tasks and
peers, the rows read from a results document and the report's task table."""

from __future__ import annotations

import argparse
import json
import math

import orjson
import pytest

from infergate.bench.analysis import task_rows
from infergate.bench.cli import add_commands, bench_options, task_failures, task_selection
from infergate.bench.options import ALL_SCENARIOS, PEER_NAMES
from infergate.bench.peers import PeerRoute
from infergate.bench.report import markdown, write_report
from infergate.bench.task_models import TASK_CASES, TASK_NAMES, task_case
from infergate.tasks import TASKS


def cell(sps: float, texts: int = 4) -> dict:
    return {
        "cell": f"c32-t{texts}-n16", "concurrency": 32, "texts": texts, "tokens": 16,
        "requests_per_s": sps / texts, "sequences_per_s": sps, "p50_ms": 40.0,
        "p99_ms": 90.0, "errors": 0, "other_cpu_percent": 12.0,
    }  # fmt: skip


def ceiling(*rows: tuple[int, float]) -> dict:
    return {
        "rows": [
            {"tokens": 16, "batch": b, "sequences_per_s": s, "layout": "1 session x 2 threads"}
            for b, s in rows
        ]
    }


def results_with_tasks() -> dict:
    return {
        "meta": {"profile": "quick", "cpus": 2},
        "ceiling": None,
        "scenarios": {},
        "tasks": {
            "cell": {"concurrency": 32, "texts": 4, "tokens": 16},
            "cases": {
                "feature-extraction": {
                    "model": "embed", "precision": "int8", "weights": "all-MiniLM-L6-v2",
                    "ceiling": ceiling((1, 500.0), (16, 1800.0), (32, 1600.0)),
                    "served": {
                        "infergate": {"cell": cell(900.0)},
                        "fastembed": {
                            "cell": cell(450.0), "setting": "2 worker(s) x 1", "precision": "fp32",
                            "cosine_to_infergate": 0.99412,
                            "settings": [
                                {"setting": "2 worker(s) x 1", "cell": cell(450.0)},
                                {"setting": "1 worker(s) x 2", "error": "StackError: died\nlog"},
                            ],
                        },
                        "infinity": {"settings": [], "error": "FileNotFoundError: missing"},
                    },
                },
                "token-classification": {
                    "model": "ner", "precision": "int8", "weights": "random weights",
                    "random_weights": True,
                    "ceiling": {"error": "RuntimeError: the ceiling failed"},
                    "served": {"infergate": {"cell": cell(700.0)}},
                },
            },
        },
    }  # fmt: skip


# -- the table -------------------------------------------------------------------------------


def test_every_served_task_has_one_case_with_its_own_model():
    assert set(TASK_NAMES) == set(TASKS)  # a new task gets a cell, or this fails
    assert len({case.model for case in TASK_CASES}) == len(TASK_CASES)
    assert task_case("text-ranking").route == "rerank"
    assert task_case("translation").model == "translate"
    with pytest.raises(ValueError, match="no task cell for 'summarization'"):
        task_case("summarization")


def test_requests_are_the_task_routes_shapes():
    rerank, embed = task_case("text-ranking"), task_case("feature-extraction")
    assert rerank.path == "/v1/models/rerank/rerank"
    assert orjson.loads(rerank.body(["a", "b"])) == {"query": rerank.query, "texts": ["a", "b"]}
    assert rerank.answers(b'{"results": [{"index": 1}, {"index": 0}]}') == 2
    assert embed.path == "/v1/models/embed/predict"
    assert orjson.loads(embed.body(["a"])) == {"inputs": ["a"]}
    assert embed.answers(b'{"outputs": [[0.1], [0.2], [0.3]]}') == 3
    assert embed.served_file == "model.onnx" and embed.parameters is None
    openai = PeerRoute("/embeddings", openai=True)
    assert orjson.loads(openai.body(["a"])) == {"model": "embed", "input": ["a"]}
    assert openai.answers(b'{"data": [{"embedding": []}]}') == 1


def test_only_cases_without_real_weights_are_random_and_say_so():
    for case in TASK_CASES:
        assert case.random_weights == ("random" in case.weights), case.task
    assert {c.task for c in TASK_CASES if c.random_weights} == {
        "text-ranking",
        "token-classification",
        "translation",
    }


def test_translation_requests_ask_every_text_for_the_same_number_of_tokens():
    case = task_case("translation")
    assert case.path == "/v1/models/translate/predict"
    assert case.ceiling_module == "infergate.bench.ct2_ceiling"
    assert case.served_file == "ctranslate2/model.bin"  # what Triton serves, not an ONNX file
    body = orjson.loads(case.body(["a", "b"]))
    assert body == {"inputs": ["a", "b"], "parameters": {"max_decoding_length": 32}}
    # The front-end accepts what the case sends.
    from infergate.tasks import get as get_task

    get_task("translation").check_parameters(body["parameters"], case.model)
    answer = b'{"outputs": [{"translation_text": "x"}, {"translation_text": "y"}]}'
    assert case.answers(answer) == 2


def test_the_translation_ceiling_decodes_as_triton_caps_the_requests():
    from infergate.bench.ct2_ceiling import decoding_of

    assert decoding_of({"max_decoding_length": 32}, {"max_decoding_length": 511}) == {
        "beam_size": 1,
        "max_decoding_length": 32,
    }
    capped = decoding_of({"max_decoding_length": 100, "beam_size": 2}, {"max_decoding_length": 63})
    assert capped == {"beam_size": 2, "max_decoding_length": 63}
    assert decoding_of({}, {})["max_decoding_length"] == 128  # the task's default


# -- the command line ------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_tasks_alone_means_all_of_them_with_the_peers_and_smoke_a_short_form():
    assert task_selection(parse()) == ((), ())
    assert task_selection(parse("--tasks")) == (TASK_NAMES, PEER_NAMES)
    assert task_selection(parse("--smoke", "--tasks")) == (("feature-extraction",), ())
    assert task_selection(parse("--tasks", "text-ranking")) == (("text-ranking",), ())
    picked = parse("--tasks", "feature-extraction", "--peers", "fastembed")
    assert task_selection(picked) == (("feature-extraction",), ("fastembed",))
    assert task_selection(parse("--tasks", "--peers")) == (TASK_NAMES, ())
    assert task_selection(parse("--tasks", "translation")) == (("translation",), ())
    with pytest.raises(SystemExit):
        parse("--tasks", "summarization")


def test_tasks_without_scenarios_measure_the_tasks_alone_and_with_them_both():
    # The run measures the ceiling and a scenario only when they are in `scenarios`.
    assert bench_options(parse("--smoke", "--tasks")).scenarios == ()
    assert bench_options(parse("--smoke")).scenarios == ALL_SCENARIOS
    both = bench_options(parse("--smoke", "--scenarios", "ceiling", "lean", "--tasks"))
    assert both.scenarios == ("ceiling", "lean") and both.tasks == ("feature-extraction",)
    assert both.profile.name == "smoke"


def test_failures_count_the_platform_and_ceilings_not_a_peer_that_cannot_run():
    tasks = results_with_tasks()["tasks"]
    assert task_failures(tasks) == ["tasks: token-classification ceiling"]
    tasks["cases"]["feature-extraction"]["served"]["infergate"] = {"error": "RuntimeError: 503"}
    tasks["stack"] = {"error": "StackError: up failed"}
    assert task_failures(tasks) == [
        "tasks: the stack",
        "tasks: feature-extraction",
        "tasks: token-classification ceiling",
    ]


# -- rows and the report ---------------------------------------------------------------------


def test_rows_divide_by_the_task_ceilings_fastest_row():
    rows = {(r["task"], r["server"]): r for r in task_rows(results_with_tasks())}
    assert set(rows) == {
        ("feature-extraction", "infergate"),
        ("feature-extraction", "fastembed"),
        ("feature-extraction", "infinity"),
        ("token-classification", "infergate"),
    }
    ours = rows["feature-extraction", "infergate"]
    assert ours["ceiling_sequences_per_s"] == 1800.0 and ours["ceiling_batch"] == 16
    assert ours["share"] == pytest.approx(0.5)
    assert rows["feature-extraction", "fastembed"]["share"] == pytest.approx(0.25)
    missing = rows["feature-extraction", "infinity"]
    assert missing["share"] is None and missing["error"] == "FileNotFoundError: missing"
    no_ceiling = rows["token-classification", "infergate"]
    assert no_ceiling["share"] is None and "ceiling failed" in no_ceiling["error"]
    assert task_rows({"scenarios": {}}) == []


def test_report_has_a_task_table_and_names_the_random_weights(tmp_path):
    text = markdown(results_with_tasks())
    assert "## Tasks" in text and "## Targets" not in text  # no scenario ran
    lines = {line.split(" | ")[0] + " | " + line.split(" | ")[2]: line
             for line in text.splitlines() if line.startswith("| ") and " | " in line}  # fmt: skip
    ours = lines["| feature-extraction | infergate"]
    assert "| 900.0 | 225.0 |" in ours and "| 0 | 12 | 1,800.0 (16, 1 session x 2 threads)" in ours
    assert ours.endswith("| 0.50 |")
    theirs = lines["| feature-extraction | fastembed (2 worker(s) x 1)"]
    assert theirs.endswith("| 0.25 |") and "| embed (fp32) |" in theirs and "(int8)" in ours
    assert "failed: FileNotFoundError: missing" in lines["| feature-extraction | infinity"]
    assert "- token-classification: ner, random weights" in text
    assert "infinity could not run: FileNotFoundError: missing" in text
    assert "fastembed's vectors against infergate's, same texts: least cosine 0.9941" in text
    assert "fastembed (1 worker(s) x 2) failed: StackError: died;" in text

    files = write_report(results_with_tasks(), tmp_path)
    document = json.loads(files["json"].read_text())
    shares = [r["share"] for r in document["task_rows"] if r["share"] is not None]
    assert len(shares) == 2 and all(math.isfinite(s) and s > 0 for s in shares)


def test_servers_vectors_are_compared_by_their_least_cosine():
    from infergate.bench.task_cells import embeddings_of, least_cosine

    ours = embeddings_of(b'{"outputs": [[1.0, 0.0], [0.0, 2.0]]}')
    theirs = embeddings_of(b'{"data": [{"embedding": [2.0, 0.0]}, {"embedding": [1.0, 1.0]}]}')
    assert ours == [[1.0, 0.0], [0.0, 2.0]] and theirs == [[2.0, 0.0], [1.0, 1.0]]
    assert least_cosine(ours, theirs) == pytest.approx(math.sqrt(0.5))
    assert embeddings_of(b'{"outputs": [{"label": "positive", "score": 0.9}]}') is None


def test_the_bench_stack_moves_every_port_of_the_stack():
    # A port left at its default collides with a stack already running on the machine.
    from pydantic import BaseModel

    from infergate.bench.stack_scenarios import STACK_PORTS
    from infergate.config import StackConfig

    ports = set()
    for section, field in StackConfig.model_fields.items():
        settings = field.default
        if isinstance(settings, BaseModel):
            ports |= {
                f"{section.upper()}__{name.upper()}"
                for name in type(settings).model_fields
                if name.endswith("port")
            }
    assert "SERVE__FALLBACK_PROXY_PORT" in ports
    assert set(STACK_PORTS) == ports


def prepared_sentiment(root, sha: str = "a" * 64):
    """A stand-in for the scenarios' cached model: its store and served files on disk."""
    from infergate.bench.prepare import PreparedModel

    (root / "store" / "mlruns").mkdir(parents=True)
    (root / "store" / "mlflow.db").write_text("the scenarios' registry")
    served = root / "served"
    (served / "tokenizer").mkdir(parents=True)
    (served / "model.onnx").write_text(f"onnx {sha}")
    (served / "infergate.json").write_text('{"precision": "int8"}')
    return PreparedModel(
        hf_dir=root / "sentiment-hf", store_dir=root / "store", onnx_path=served / "model.onnx",
        tokenizer_dir=served / "tokenizer", spec={}, version="1", onnx_sha256=sha,
    )  # fmt: skip


def test_the_task_store_starts_as_the_scenarios_store_and_its_sentiment_is_theirs(tmp_path):
    from infergate.bench.task_models import prepare_tasks

    prepared = prepared_sentiment(tmp_path / "cache")
    case = task_case("text-classification")
    # Nothing to register: no MLflow is started (it would fail here).
    tasks = prepare_tasks([case], prepared, tmp_path / "cache", say=print)
    root = tmp_path / "cache" / "tasks"
    assert tasks.store_dir == root / "store"
    assert (root / "store" / "mlflow.db").read_text() == "the scenarios' registry"
    [model] = tasks.models.values()
    assert (model.version, model.model_sha256) == ("1", "a" * 64)
    assert model.model_path.read_text() == prepared.onnx_path.read_text()
    # A store seeded from another sentiment model is seeded again, its other models gone.
    (root / "served" / "embed").mkdir()
    other = prepared_sentiment(tmp_path / "other", sha="b" * 64)
    again = prepare_tasks([case], other, tmp_path / "cache", say=print)
    assert again.models["text-classification"].model_sha256 == "b" * 64
    assert not (root / "served" / "embed").exists()

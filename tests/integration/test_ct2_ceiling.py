"""The translation ceiling on a tiny random Marian converted as registration converts it:
it prints the document of the ONNX ceiling's shape, which the task cells merge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infergate.bench import ct2_ceiling
from infergate.bench.measure import merge_ceiling_runs
from infergate.registration import ct2_export
from infergate.registration.reference_texts import DEFAULT_REFERENCE_TEXTS, read_texts
from tiny_models import tiny_marian


def test_the_ceiling_prints_a_row_per_batch_size_decoded_to_the_asked_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = read_texts(DEFAULT_REFERENCE_TEXTS)[:8]
    built = ct2_export.build(
        tiny_marian(tmp_path / "marian"), "int8", tmp_path / "served", texts=texts,
        progress=False,
    )  # fmt: skip
    spec = tmp_path / "served" / "infergate.json"
    spec.write_text(json.dumps({"max_length": built.max_length, "precision": "int8",
                                "max_decoding_length": built.max_decoding_length}))  # fmt: skip
    code = ct2_ceiling.main([
        f"--model={built.ct2_dir / 'model.bin'}", f"--tokenizer={built.tokenizer_dir}",
        f"--spec={spec}", "--lengths=8", "--duration=0.05", "--task=translation",
        '--parameters={"max_decoding_length": 6}',
    ])  # fmt: skip
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["task"] == "translation" and document["probe_labels"] is None
    assert document["decoding"] == {"beam_size": 1, "max_decoding_length": 6}
    assert document["compute_type"] == "int8"
    assert set(document["mean_tokens"]) == {"8"}
    rows = document["rows"]
    assert [(r["tokens"], r["batch"]) for r in rows] == [(8, b) for b in ct2_ceiling.BATCH_SIZES]
    for row in rows:
        assert row["sequences_per_s"] > 0 and row["p50_ms"] <= row["p99_ms"]
        assert row["layout"] in row["layouts"] and row["runs"] >= ct2_ceiling.MIN_RUNS
        assert 0 < row["output_tokens_mean"] <= 6
    assert "tokenize_us_per_sequence" in rows[-1]
    assert all(0 < n <= 6 for n in document["probe_output_tokens"])
    merged = merge_ceiling_runs(document, document)  # what the task cells do with two runs
    assert [r["sequences_per_s"] for r in merged["rows"]] == [r["sequences_per_s"] for r in rows]

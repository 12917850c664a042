"""The stand-in model's folder: what `infergate register` takes from an ONNX-only model,
with the benchmark model's tokenizer and labels and a graph that computes next to nothing.
Its registration and serving run in the bench smoke (tests/e2e/test_bench.py)."""

import json

import numpy as np
import onnxruntime as ort

from infergate.bench.prepare import build_stand_in_folder


def test_the_folder_is_an_onnx_only_model_with_the_benchmark_models_tokenizer_and_labels(
    tmp_path,
):
    hf = tmp_path / "hf"
    hf.mkdir()
    config = {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "id2label": {"0": "negative", "1": "positive"},
        "max_position_embeddings": 512,
    }
    (hf / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).write_text(json.dumps({"file": name}))
    (hf / "model.safetensors").write_bytes(b"weights")  # not taken: the graph is the model

    out = tmp_path / "stand-in"
    build_stand_in_folder(hf, out, "logits")

    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.onnx", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_text() == (hf / name).read_text()
    # Its labels and length limit kept; no architecture naming fusions for a BERT graph.
    assert json.loads((out / "config.json").read_text()) == {
        k: v for k, v in config.items() if k != "architectures"
    }


def test_the_graph_takes_the_served_inputs_and_answers_a_row_per_text(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).write_text("{}")
    build_stand_in_folder(hf, tmp_path / "out", "logits")

    session = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    ids = np.array([[101, 2204, 102, 0], [101, 2919, 3185, 102]], dtype=np.int64)
    mask = (ids != 0).astype(np.int64)
    (logits,) = session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
    assert logits.shape == (2, 2) and logits.dtype == np.float32
    # Rows differ with their texts, and padding does not count.
    assert not np.allclose(logits[0], logits[1])
    padded = np.pad(ids, ((0, 0), (0, 3)))
    padded_mask = (padded != 0).astype(np.int64)
    (again,) = session.run(["logits"], {"input_ids": padded, "attention_mask": padded_mask})
    np.testing.assert_allclose(again, logits, rtol=1e-6)

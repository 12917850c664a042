"""A Triton the platform did not start, on another "host": a network namespace with its
own address, running `infergate triton` with an empty repository of its own, as an
operator would start it there. The control plane (`infergate up` with
triton.external_host) never writes to that host's disk: every version travels with its
load request. The host cannot read the control plane's disk either: its Triton runs in a
mount namespace of its own, where an empty filesystem lies over the control plane's
state folder (registry, artifacts, model files). Checked with the user's own clients
(tritonclient, httpx, MLflow's)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlflow
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton_http
from conftest import Load, Stack, clone_version, running_stack, stack_env, wait_for
from triton_hosts import TritonHost, running_triton_host

from infergate.registry import Registry
from infergate.serving.postprocess import softmax
from infergate.serving.tokenization import TextTokenizer
from network_hosts import unavailable
from tiny_models import tiny_bert

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.machine("netns", unavailable()),
]
MODEL = "remote"
TEXTS = ["i love this film", "the service was slow and the food bad", "quiet"]


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("external-stack")


@pytest.fixture(scope="module")
def triton_host(stack_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonHost]:
    state_dir = tmp_path_factory.mktemp("triton-host")
    env = stack_env(state_dir)  # free ports; Triton's are used on the host's own address
    name = f"igt{os.getpid() % 10000}"
    with running_triton_host(name, env, state_dir, hidden=stack_dir) as triton:
        yield triton


@pytest.fixture(scope="module")
def stack(triton_host: TritonHost, stack_dir: Path) -> Iterator[Stack]:
    """The platform on this machine, driving the Triton of the network host."""
    state_dir = stack_dir
    env = stack_env(state_dir)
    for port in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT"):
        env[f"INFERGATE_TRITON__{port}"] = triton_host.env[f"INFERGATE_TRITON__{port}"]
    env["INFERGATE_TRITON__EXTERNAL_HOST"] = triton_host.host.address
    env["INFERGATE_TRITON__BACKEND"] = "auto"  # the wheel's Triton: the Python backend
    env["INFERGATE_PROMETHEUS__ENABLED"] = "false"
    with running_stack(state_dir, env) as running:
        folder = tiny_bert(state_dir / "source", "text-classification")
        running.register(folder, MODEL, "text-classification", "--alias", "champion")
        yield running


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        wait_for(lambda: _predict(client).status_code == 200, 90, f"{MODEL} served")
        yield client


def _predict(http: httpx.Client, **headers: str) -> httpx.Response:
    return http.post(f"/v1/models/{MODEL}/predict", json={"inputs": TEXTS}, headers=headers)


def in_process_scores(stack: Stack, version: str) -> np.ndarray:
    """The registered files of ``version``, run here with ONNX Runtime, each text alone: a
    text's answer does not depend on the texts batched with it (an int8-dynamic graph's
    would, in one run over all of them; the served model runs such texts alone)."""
    source = Registry(stack.mlflow).version_source(MODEL, version)
    files = Path(
        mlflow.artifacts.download_artifacts(
            source, dst_path=str(stack.state_dir / f"v{version}"), tracking_uri=stack.mlflow
        )
    )
    batch = TextTokenizer.from_dir(files / "tokenizer", 128)(TEXTS)
    session = ort.InferenceSession(str(files / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = []
    for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True):
        own = slice(0, int(mask.sum()))  # right-padded: the text's own tokens
        feeds = {"input_ids": ids[None, own], "attention_mask": mask[None, own]}
        logits.append(session.run(["logits"], feeds)[0][0])
    return softmax(np.stack(logits))


def test_a_triton_that_never_saw_our_disk_serves_the_registered_model(triton_host, stack, http):
    response = _predict(http)
    assert response.status_code == 200 and response.headers["x-model-version"] == "1"
    served = np.array(
        [[o["scores"][c] for c in ("sad", "happy")] for o in response.json()["outputs"]]
    )
    np.testing.assert_allclose(served, in_process_scores(stack, "1"), atol=1e-5)
    # The operator's view of that Triton: the version is loaded, on the Python backend
    # ("auto" asked the server), and its own repository is still empty.
    client = triton_http.InferenceServerClient(triton_host.http_url)
    assert client.is_model_ready(f"{MODEL}__v1")
    assert client.get_model_config(f"{MODEL}__v1")["backend"] == "python"
    assert list(triton_host.repository.iterdir()) == []
    assert not (stack.state_dir / "triton-repository").exists()
    # And what that Triton sees where the control plane keeps its registry and model
    # files: nothing (its process's own view of the filesystem, through /proc).
    assert triton_host.process is not None
    assert (stack.state_dir / "source" / "config.json").exists()
    assert os.listdir(f"/proc/{triton_host.process.pid}/root{stack.state_dir}") == []


def test_a_triton_that_restarted_empty_gets_its_versions_again_under_load(triton_host, stack, http):
    with Load(lambda: _predict(http)) as load:
        time.sleep(1.0)
        killed = time.monotonic()
        triton_host.kill()
        time.sleep(2.0)  # down for a while: requests meanwhile must fail cleanly
        triton_host.start()
        restarted = time.monotonic()
        wait_for(
            lambda: any(s == 200 and t > restarted for t, _, s, _ in load.answers),
            30, "answers again after the Triton host restarted",
        )  # fmt: skip
        time.sleep(1.0)
    after_kill = [a for a in load.answers if a[0] >= killed]
    statuses = {s for _, _, s, _ in after_kill}
    assert statuses <= {200, 503} and 503 in statuses, statuses  # no 500, no dropped request
    assert all(is_json for *_, is_json in after_kill)
    slowest = max(duration for _, duration, _, _ in after_kill)
    first_error = min(t for t, _, s, _ in after_kill if s != 200) - killed
    recovered = min(t for t, _, s, _ in after_kill if s == 200 and t > restarted) - restarted
    print(
        f"\nTriton host killed under load: {len(after_kill)} requests, statuses "
        f"{sorted(statuses)}, first error {first_error:.2f} s after the kill, answers again "
        f"{recovered:.2f} s after Triton was back, slowest request {slowest:.2f} s"
    )
    assert slowest < 10.0 and recovered < 10.0
    assert triton_host.repository.exists() and list(triton_host.repository.iterdir()) == []


def test_a_canary_rolls_out_and_is_promoted_on_the_external_triton(
    triton_host, stack, http, tmp_path
):
    version = clone_version(Registry(stack.mlflow), MODEL, "1", tmp_path)
    started = stack.cli(
        "canary", "start", MODEL, "--version", version, "--weight", "50", "--manual",
        "--admin-url", stack.admin,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    client = triton_http.InferenceServerClient(triton_host.http_url)
    assert client.is_model_ready(f"{MODEL}__v{version}")
    pinned = wait_for(
        lambda: (r := _predict(http, **{"x-model-version": version})).status_code == 200 and r,
        30, "the canary answering pinned requests",
    )  # fmt: skip
    assert pinned.headers["x-model-version"] == version
    promoted = stack.cli("canary", "promote", MODEL, "--admin-url", stack.admin)
    assert promoted.returncode == 0, promoted.stderr
    wait_for(lambda: not client.is_model_ready(f"{MODEL}__v1"), 30, "version 1 unloaded")
    assert _predict(http).headers["x-model-version"] == version

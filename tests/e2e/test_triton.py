"""The Triton side against the real tritonserver from the nvidia-pytriton wheel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from conftest import wait_for
from onnx import TensorProto, helper, numpy_helper

from infergate.bench.stack_scenarios import sequential_calls
from infergate.config import TritonSettings
from infergate.errors import BackendTimeout, BackendUnavailable, InfergateError, RegistrationError
from infergate.triton.client import TritonBackend, TritonControl
from infergate.triton.repository import WARMUP_COUNT, remove_model, write_model
from infergate.versions import triton_model_name

if TYPE_CHECKING:  # conftest is not importable as a module; only its fixtures are used
    from collections.abc import Iterator

    from conftest import RunningTriton

pytestmark = pytest.mark.e2e

VOCAB = 100
HIDDEN = 16
LABELS = 3
# Long enough that concurrent requests are sure to share a batch.
BATCHING_DELAY_US = 20_000


def tiny_onnx(path: Path, output_name: str, seed: int = 0) -> Path:
    """A model that satisfies the contract: embedding, a per-token dense layer, mean
    pooling over the attention mask, and for ``logits`` a classification head. Padding with
    mask 0 leaves its output unchanged; ignoring the mask would not."""
    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    initializers = [
        weight("embedding", VOCAB, HIDDEN),
        weight("dense", HIDDEN, HIDDEN),
        numpy_helper.from_array(np.array([2], np.int64), "last_axis"),
        numpy_helper.from_array(np.array([1], np.int64), "sequence_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["tokens"]),
        helper.make_node("MatMul", ["tokens", "dense"], ["dense_out"]),
        helper.make_node("Tanh", ["dense_out"], ["hidden"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "last_axis"], ["mask3"]),
        helper.make_node("Mul", ["hidden", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "sequence_axis"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "sequence_axis"], ["count"], keepdims=0),
    ]
    if output_name == "embeddings":
        nodes.append(helper.make_node("Div", ["summed", "count"], ["embeddings"]))
        dim = HIDDEN
    else:
        initializers.append(weight("head", HIDDEN, LABELS))
        nodes.append(helper.make_node("Div", ["summed", "count"], ["pooled"]))
        nodes.append(helper.make_node("MatMul", ["pooled", "head"], ["logits"]))
        dim = LABELS
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
            for name in ("input_ids", "attention_mask")
        ],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", dim])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # onnx 1.23 writes IR version 14, which ONNX Runtime 1.31 refuses ("max supported 13").
    model.ir_version = 10
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("onnx")
    garbage = folder / "garbage.onnx"
    garbage.write_bytes(b"this is not a protobuf" * 64)
    return {
        "embeddings": tiny_onnx(folder / "embeddings.onnx", "embeddings"),
        "logits": tiny_onnx(folder / "logits.onnx", "logits", seed=1),
        "garbage": garbage,
    }


@pytest.fixture(scope="module")
def control(triton_server: RunningTriton) -> TritonControl:
    return TritonControl(triton_server.settings.grpc_url)


def serve(
    triton: RunningTriton,
    control: TritonControl,
    name: str,
    onnx_path: Path,
    output_name: str,
    **settings: int,
) -> str:
    """Write and load one model; returns its Triton name."""
    model = triton_model_name(name, "1")
    write_model(
        triton.repository,
        model,
        onnx_path,
        output_name=output_name,
        output_dim=HIDDEN if output_name == "embeddings" else LABELS,
        settings=triton.settings.model_copy(update=settings),
    )
    control.load(model, timeout_s=60)
    return model


def random_request(rng: np.random.Generator, rows: int, length: int) -> tuple[np.ndarray, ...]:
    ids = rng.integers(1, VOCAB, size=(rows, length), dtype=np.int64)
    mask = np.ones_like(ids)
    # Requests already padded by the tokenizer: some rows end in padding of their own.
    if rows > 1 and length > 2:
        mask[0, -2:] = 0
        ids[0, -2:] = 0
    return ids, mask


def execution_count(triton: RunningTriton, model: str) -> tuple[int, int]:
    """(model executions, requests) so far, from Triton's statistics API."""
    client = grpcclient.InferenceServerClient(triton.settings.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return int(stats.get("execution_count", 0)), int(stats["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("output_name", ["embeddings", "logits"])
def test_concurrent_ragged_requests_are_batched_and_match_onnxruntime(
    triton_server: RunningTriton,
    control: TritonControl,
    onnx_files: dict[str, Path],
    output_name: str,
) -> None:
    model = serve(
        triton_server,
        control,
        f"ragged-{output_name}",
        onnx_files[output_name],
        output_name,
        max_queue_delay_us=BATCHING_DELAY_US,
    )
    rng = np.random.default_rng(7)
    lengths = list(range(1, 15))
    random.Random(7).shuffle(lengths)
    requests = [random_request(rng, rows=1 + i % 3, length=n) for i, n in enumerate(lengths)]
    session = ort.InferenceSession(onnx_files[output_name], providers=["CPUExecutionProvider"])

    async def infer_all() -> list[np.ndarray]:
        backend = TritonBackend(triton_server.settings.grpc_url, timeout_s=10)
        try:
            calls = [backend.infer(model, ids, mask, output_name) for ids, mask in requests]
            return await asyncio.gather(*calls)
        finally:
            await backend.close()

    results = asyncio.run(infer_all())

    for (ids, mask), result in zip(requests, results, strict=True):
        alone = session.run([output_name], {"input_ids": ids, "attention_mask": mask})[0]
        assert result.dtype == np.float32
        np.testing.assert_allclose(result, alone, atol=1e-4, rtol=0)
    executions, served = execution_count(triton_server, model)
    # Triton's own warm-up requests, run at load, count too.
    assert served == len(requests) + WARMUP_COUNT
    # Fewer executions than requests: some batch held requests of different lengths.
    assert executions - WARMUP_COUNT < len(requests)


def test_malformed_request_fails_alone(
    triton_server: RunningTriton, control: TritonControl, onnx_files: dict[str, Path]
) -> None:
    model = serve(
        triton_server,
        control,
        "malformed",
        onnx_files["embeddings"],
        "embeddings",
        max_queue_delay_us=BATCHING_DELAY_US,
    )
    good = np.array([[5, 6, 7]]), np.array([[1, 1, 1]])
    mismatched = np.array([[5, 6, 7]]), np.array([[1, 1]])
    out_of_vocab = np.array([[5, VOCAB + 1]]), np.array([[1, 1]])
    requests = [good, mismatched, good, out_of_vocab, good]

    async def infer_all() -> list[np.ndarray | BaseException]:
        backend = TritonBackend(triton_server.settings.grpc_url, timeout_s=10)
        try:
            calls = [backend.infer(model, ids, mask, "embeddings") for ids, mask in requests]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await backend.close()

    results = asyncio.run(infer_all())

    expected = results[0]
    assert isinstance(expected, np.ndarray)
    for index in (2, 4):
        np.testing.assert_array_equal(results[index], expected)
    for index, detail in ((1, "attention_mask has shape [1, 2]"), (3, "out of data bounds")):
        error = results[index]
        assert type(error) is InfergateError  # a 500, not "backend unavailable"
        # Internals (and the Triton model's name) stay out of the message, in the cause.
        assert str(error) == "The inference backend failed to run this model."
        assert detail in str(error.__cause__)
    assert execution_count(triton_server, model)[0] < len(requests)


def test_unknown_or_unloaded_model_is_unavailable(
    triton_server: RunningTriton, control: TritonControl, onnx_files: dict[str, Path]
) -> None:
    model = serve(triton_server, control, "to-unload", onnx_files["embeddings"], "embeddings")
    ids, mask = np.array([[1, 2]]), np.array([[1, 1]])

    async def check() -> None:
        backend = TritonBackend(triton_server.settings.grpc_url, timeout_s=10)
        try:
            assert await backend.server_ready()
            assert await backend.is_model_ready(model)
            await backend.infer(model, ids, mask, "embeddings")
            control.unload(model)
            assert not await backend.is_model_ready(model)
            for name in (model, "never-written__v1"):
                with pytest.raises(BackendUnavailable, match="cannot serve") as caught:
                    await backend.infer(name, ids, mask, "embeddings")
                assert "StatusCode.NOT_FOUND" in str(caught.value.__cause__.status())
        finally:
            await backend.close()

    asyncio.run(check())
    assert not control.is_ready(model)
    assert control.loaded_models()[model] == "UNAVAILABLE"
    remove_model(triton_server.repository, model)
    assert not (triton_server.repository / model).exists()
    assert model not in control.loaded_models()


@contextmanager
def frozen(triton: RunningTriton) -> Iterator[None]:
    """Triton stopped (SIGSTOP) until the block ends, so no answer can beat any deadline.

    A tiny deadline alone is no proof of lateness: gRPC rounds a call's deadline up to
    the next whole millisecond (``Timestamp::FromTimespecRoundUp`` in
    ``grpc_channel_create_call``), and a local Triton answers this model in about 1 ms, so
    a deadline of a microsecond can be met.
    """
    pid = triton.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # The stop reaches each of Triton's threads on its own: until all are stopped, one
        # could still answer (a clean-clone run saw a call answered inside this block).
        wait_for(lambda: all_threads_stopped(pid), 10, "every Triton thread stopped")
        yield
    finally:
        os.kill(triton.process.pid, signal.SIGCONT)


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is in state T (stopped), from ``/proc``."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):  # a thread that just ended
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state == "T" for state in states)


def test_an_unreachable_server_is_unavailable_and_a_late_answer_a_timeout(
    triton_server: RunningTriton, control: TritonControl, onnx_files: dict[str, Path]
) -> None:
    model = serve(triton_server, control, "deadline", onnx_files["embeddings"], "embeddings")
    ids, mask = np.array([[1, 2]]), np.array([[1, 1]])

    async def check() -> None:
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            closed_port = sock.getsockname()[1]
        nowhere = TritonBackend(f"127.0.0.1:{closed_port}", timeout_s=2)
        stalled = TritonBackend(triton_server.settings.grpc_url, timeout_s=1)
        try:
            assert not await nowhere.server_ready()
            assert not await nowhere.is_model_ready(model)
            with pytest.raises(BackendUnavailable) as unreachable:
                await nowhere.infer(model, ids, mask, "embeddings")
            assert unreachable.value.status == 503 and model not in str(unreachable.value)
            assert (await stalled.infer(model, ids, mask, "embeddings")).shape == (1, HIDDEN)
            # A deadline that did not apply would wait for the frozen server forever.
            with frozen(triton_server), pytest.raises(BackendTimeout) as late:
                await asyncio.wait_for(stalled.infer(model, ids, mask, "embeddings"), 30)
            assert late.value.status == 504 and "did not answer within 1 s" in str(late.value)
        finally:
            await nowhere.close()
            await stalled.close()

    asyncio.run(check())


def test_corrupt_onnx_fails_to_load_and_server_keeps_serving(
    triton_server: RunningTriton, control: TritonControl, onnx_files: dict[str, Path]
) -> None:
    good = serve(triton_server, control, "survivor", onnx_files["embeddings"], "embeddings")
    with pytest.raises(RegistrationError, match="Protobuf parsing failed") as caught:
        serve(triton_server, control, "corrupt", onnx_files["garbage"], "embeddings")
    assert "\nAt:" not in str(caught.value)  # the Python stack stays in the log
    corrupt = triton_model_name("corrupt", "1")
    assert control.loaded_models()[corrupt] == "UNAVAILABLE"
    assert not control.is_ready(corrupt)
    assert control.server_ready()  # --strict-readiness=false: one bad model is not an outage
    assert triton_server.process.poll() is None

    async def still_serves() -> np.ndarray:
        backend = TritonBackend(triton_server.settings.grpc_url, timeout_s=10)
        try:
            return await backend.infer(good, np.array([[3, 4]]), np.array([[1, 1]]), "embeddings")
        finally:
            await backend.close()

    assert asyncio.run(still_serves()).shape == (1, HIDDEN)


def test_metrics_port_reports_successes(
    triton_server: RunningTriton, control: TritonControl, onnx_files: dict[str, Path]
) -> None:
    model = serve(triton_server, control, "metered", onnx_files["logits"], "logits")

    async def one() -> None:
        backend = TritonBackend(triton_server.settings.grpc_url, timeout_s=10)
        try:
            await backend.infer(model, np.array([[1, 2, 3]]), np.array([[1, 1, 1]]), "logits")
        finally:
            await backend.close()

    asyncio.run(one())
    with urllib.request.urlopen(triton_server.metrics_url, timeout=10) as response:
        body = response.read().decode()
    successes = 1 + WARMUP_COUNT  # one request of ours and Triton's warm-up requests
    assert f'nv_inference_request_success{{model="{model}",version="1"}} {successes}' in body


@pytest.mark.quiet
def test_one_request_latency(
    triton_server: RunningTriton,
    control: TritonControl,
    onnx_files: dict[str, Path],
    record_property: pytest.RecordProperty,
) -> None:
    """The hop's cost: one 16-token request at concurrency 1, default batching delay. Only a
    loose regression bound; the figure itself goes to the report (``record_property``)."""
    delay_us = TritonSettings().max_queue_delay_us
    model = serve(
        triton_server,
        control,
        "latency",
        onnx_files["embeddings"],
        "embeddings",
        max_queue_delay_us=delay_us,
    )
    ids = np.arange(1, 17, dtype=np.int64)[None, :]
    backend = TritonBackend(triton_server.settings.grpc_url, timeout_s=10)
    # The benchmark's measurement of Triton alone; the warm-up fills the channel and ORT arenas.
    figures = asyncio.run(
        sequential_calls(backend, model, "embeddings", [(ids, np.ones_like(ids))], 0.5, 1.5)
    )
    p50_ms = figures["p50_ms"]
    record_property("triton_hop_p50_ms", round(p50_ms, 3))
    print(f"Triton hop, 16 tokens, c=1, batching delay {delay_us} us: p50 {p50_ms:.2f} ms")
    assert figures["calls"] >= 10 and 0 < p50_ms <= figures["p95_ms"] <= figures["p99_ms"]
    assert p50_ms < 50

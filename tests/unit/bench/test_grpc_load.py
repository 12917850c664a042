"""The bench's gRPC load target (``infergate.bench.grpc_load``) against a grpc.aio server
started in the test on a free loopback port: its requests reach ModelInfer as
tritonclient's would, calls are counted and refusals counted by status, and workers share
channels as asked."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import InferInput, service_pb2

from infergate.bench.grpc_load import (
    MODEL_INFER,
    GrpcTarget,
    call_once,
    infer_outputs,
    infer_request,
)
from infergate.bench.loadgen import LoadResult, run_load, run_sync
from infergate.protocols.v2_binary import to_binary

LABELS = np.array([b"positive", b"negative"], dtype=object)


def answer(request: service_pb2.ModelInferRequest) -> service_pb2.ModelInferResponse:
    """A ModelInfer answer: one label per text, the labels alternating."""
    texts = request.inputs[0].shape[0]
    response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
    output = response.outputs.add()
    output.name, output.datatype = "label", "BYTES"
    output.shape.append(texts)
    labels = [LABELS[i % 2].decode() for i in range(texts)]
    response.raw_output_contents.append(to_binary("BYTES", labels))
    return response


def serve(refuse_every: int = 0) -> Callable[[Any], Awaitable[Any]]:
    """Run ``body(port, seen)`` with a ModelInfer server up; ``seen`` counts the calls and
    the peers they came from. Every ``refuse_every``-th call is refused UNAVAILABLE."""
    seen: Counter[str] = Counter()

    async def model_infer(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen["calls"] += 1
        seen[context.peer()] += 0  # the connection it came on
        application = dict(context.invocation_metadata()).get("application")
        seen[f"application={application}"] += 1
        if refuse_every and seen["calls"] % refuse_every == 0:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Triton is away")
        request = service_pb2.ModelInferRequest.FromString(raw)
        return bytes(answer(request).SerializeToString())

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer)},
    )

    async def with_server(body: Callable[[int, Counter[str]], Awaitable[Any]]) -> Any:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            return await body(port, seen)
        finally:
            await server.stop(None)

    return with_server


def test_a_request_is_what_tritonclient_sends_and_its_answer_reads_back():
    raw = infer_request("sentiment", "text", ["I love this film", "Ünïcode"])
    request = service_pb2.ModelInferRequest.FromString(raw)
    expected = InferInput("text", [2], "BYTES")
    expected.set_data_from_numpy(np.array(["I love this film", "Ünïcode"], dtype=object))
    assert request.model_name == "sentiment" and request.model_version == ""
    assert request.inputs[0] == expected._get_tensor()
    assert request.raw_input_contents == [expected._get_content()]
    assert not request.outputs  # every output, as tritonclient asks by default

    async def probe(port: int, seen: Counter[str]) -> bytes:
        return await call_once(GrpcTarget("127.0.0.1", port, (raw,)), raw)

    outputs = infer_outputs(run_sync(lambda: serve()(probe)))
    assert list(outputs) == ["label"]
    np.testing.assert_array_equal(outputs["label"], LABELS)


@pytest.mark.parametrize(("per_channel", "connections"), [(1, 4), (2, 2), (4, 1)])
def test_load_counts_answers_and_shares_channels_as_asked(per_channel, connections):
    bodies = tuple(infer_request("m", "text", [f"text {i}"]) for i in range(3))

    async def load(port: int, seen: Counter[str]) -> tuple[LoadResult, Counter[str]]:
        named = (("application", "a"),)
        target = GrpcTarget("127.0.0.1", port, bodies, per_channel, metadata=named)
        result = await run_load(target, concurrency=4, duration_s=0.3, warmup_s=0.1)
        return result, seen

    result, seen = run_sync(lambda: serve()(load))
    summary = result.summary()
    assert summary["ok"] >= 8 and summary["errors"] == 0 and result.warmup_requests > 0
    assert summary["requests"] + result.warmup_requests <= seen["calls"]
    peers = [peer for peer in seen if peer != "calls" and not peer.startswith("application=")]
    assert len(peers) == connections, peers
    assert seen["application=a"] == seen["calls"]  # every call names it


def test_refusals_are_counted_by_status():
    bodies = (infer_request("m", "text", ["a"]),)

    async def load(port: int, seen: Counter[str]) -> LoadResult:
        target = GrpcTarget("127.0.0.1", port, bodies, clients_per_channel=2)
        return await run_load(target, concurrency=2, duration_s=0.3, warmup_s=0.0)

    result = run_sync(lambda: serve(refuse_every=3)(load))
    kind = "gRPC UNAVAILABLE: Triton is away"  # the status and its message's start
    assert set(result.errors) == {kind}
    assert result.ok > 0 and result.errors[kind] > 0


def test_a_dead_port_is_an_error_not_a_hang():
    async def load() -> LoadResult:
        target = GrpcTarget("127.0.0.1", 1, (infer_request("m", "text", ["a"]),))
        return await run_load(target, concurrency=1, duration_s=0.2, timeout_s=0.5)

    result = run_sync(load)
    assert result.ok == 0 and result.errors
    assert all(kind == "timeout" or kind.startswith("gRPC UNAVAILABLE") for kind in result.errors)


def test_a_target_refuses_what_it_cannot_send():
    with pytest.raises(ValueError, match="loopback"):
        GrpcTarget("10.0.0.1", 1, (b"",))
    with pytest.raises(ValueError, match="at least one"):
        GrpcTarget("127.0.0.1", 1, ())
    with pytest.raises(ValueError, match="clients_per_channel"):
        GrpcTarget("127.0.0.1", 1, (b"",), clients_per_channel=0)
    assert GrpcTarget("::1", 8081, (b"",)).address == "[::1]:8081"
    assert asyncio.iscoroutinefunction(call_once) and MODEL_INFER.endswith("/ModelInfer")

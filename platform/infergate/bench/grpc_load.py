"""gRPC for the bench's load generator (``infergate.bench.loadgen``): the Open Inference
Protocol's ``ModelInfer`` called with ``grpc.aio``, as ``tritonclient.grpc`` calls it.

A request is one ``ModelInferRequest`` serialized once, its texts in
``raw_input_contents`` (tritonclient's layout); a call sends those bytes and waits for
the answer's bytes, without parsing either (the generator shares the CPU with the server
it measures). Workers share channels, ``clients_per_channel`` to one, each channel its
own TCP connection (grpc would otherwise share one subchannel between channels to the
same address): HTTP/2 carries a channel's calls side by side, so the setting trades the
client's CPU per connection against streams waiting on one connection.

Protocol: https://github.com/kserve/open-inference-protocol/blob/main/specification/protocol/inference_grpc.md
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from infergate.bench.loadgen import LoadClient, Outcome, check_loopback
from infergate.protocols.v2_binary import to_binary

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
# One TCP connection per channel, and no limit on a call's answer below the server's.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", -1))
DETAILS_CHARS = 60


def infer_request(model: str, input_name: str, texts: Sequence[str]) -> bytes:
    """A serialized ``ModelInferRequest`` with ``texts`` as one BYTES input, the way
    ``tritonclient.grpc`` sends it (in ``raw_input_contents``); every output asked for."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = input_name, "BYTES"
    tensor.shape.append(len(texts))
    request.raw_input_contents.append(to_binary("BYTES", texts))
    return bytes(request.SerializeToString())


def infer_outputs(answer: bytes) -> dict[str, np.ndarray]:
    """Every output tensor of a serialized ``ModelInferResponse``, read by tritonclient."""
    from tritonclient.grpc import InferResult, service_pb2

    response = service_pb2.ModelInferResponse.FromString(answer)
    result = InferResult(response)
    return {output.name: result.as_numpy(output.name) for output in response.outputs}


@dataclass(frozen=True)
class GrpcTarget:
    """Where to send unary calls of ``method`` and the serialized requests to cycle through."""

    host: str
    port: int
    bodies: tuple[bytes, ...]
    clients_per_channel: int = 1
    method: str = MODEL_INFER
    # Sent with every call: Ray Serve's ingress picks the application by ``application``
    # when more than one is deployed.
    metadata: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        check_loopback(self.host)
        if not self.bodies:
            raise ValueError("a target needs at least one request message")
        if self.clients_per_channel < 1:
            raise ValueError(f"clients_per_channel is {self.clients_per_channel}; expected >= 1")
        if not self.method.startswith("/"):
            raise ValueError(f"method {self.method!r} must be '/package.Service/Method'")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"

    def prepared(self) -> list[bytes]:
        return list(self.bodies)

    def clients(self, count: int) -> list[LoadClient]:
        """``count`` clients, the first ``clients_per_channel`` on one channel, the next on
        another, and so on; the first client of each channel closes it."""
        per = self.clients_per_channel
        channels = [
            grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            for _ in range(math.ceil(count / per))
        ]
        return [
            GrpcCall(channels[i // per], self.method, self.metadata, owns_channel=i % per == 0)
            for i in range(count)
        ]


class GrpcCall:
    """One worker's calls on a (shared) channel; bytes in, bytes out."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        method: str,
        metadata: tuple[tuple[str, str], ...],
        owns_channel: bool,
    ) -> None:
        self.channel = channel
        self.metadata = metadata
        self.owns_channel = owns_channel
        self.stub: Any = channel.unary_unary(method)  # no serializers: bytes as they are

    async def call(self, request: bytes, timeout_s: float) -> Outcome:
        try:
            await self.stub(request, timeout=timeout_s, metadata=self.metadata)
        except grpc.aio.AioRpcError as error:
            code = error.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return "timeout", False
            # The status and the start of its message (who refused: the front-end, or the
            # ingress in front of it), as a bounded set of kinds.
            details = (error.details() or "").strip()[:DETAILS_CHARS]
            kind = f"gRPC {code.name}" + (f": {details}" if details else "")
            return kind, code == grpc.StatusCode.UNAVAILABLE
        return None, False

    async def close(self) -> None:
        if self.owns_channel:
            await self.channel.close()


async def call_once(target: GrpcTarget, request: bytes, timeout_s: float = 30.0) -> bytes:
    """One call on a channel of its own, its answer's bytes (a refusal raises
    ``grpc.aio.AioRpcError``): for probes."""
    async with grpc.aio.insecure_channel(target.address, options=CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(target.method)
        answer: bytes = await call(request, timeout=timeout_s, metadata=target.metadata)
        return answer

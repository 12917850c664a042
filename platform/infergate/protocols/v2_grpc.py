"""The Open Inference Protocol (KServe V2) over gRPC: ``inference.GRPCInferenceService``,
as ``tritonclient.grpc`` calls it.

Pure, like the REST side: a request message in (read by its fields, so any generated
module's messages do), the response message's fields and a gRPC status out. The Ray
Serve deployment (``infergate.serve_app``) only turns these into messages of
``tritonclient.grpc.service_pb2`` and sets the status on the call.

An infer request goes the REST endpoint's way: it is adapted to the JSON the REST
request would carry, its tensors as the binary tensor data extension carries them (a
gRPC message's ``raw_input_contents`` are those very bytes), then checked by
``infergate.protocols.v2_request`` and answered through the same inference path, with
the same tensors (``infergate.protocols.kserve_v2``), so the answers, the messages of
refusals, the metrics, the canary split and the API keys are those of REST. Errors keep
their message; the status is the typed error's ``grpc_code``.

Protocol: https://github.com/kserve/open-inference-protocol/blob/main/specification/protocol/inference_grpc.md
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from infergate.errors import BackendUnavailable, InfergateError, InvalidInput, ModelNotFound
from infergate.protocols import kserve_v2
from infergate.protocols.v2_binary import LENGTH, to_binary
from infergate.protocols.v2_request import (
    InferContext,
    V2InferRequest,
    predict_request,
)
from infergate.protocols.wire import Answer, Limits, PredictRequest, check_size, timing_headers
from infergate.serving.access import OPEN, Caller

if TYPE_CHECKING:
    from infergate.protocols.frontend import Frontend

log = logging.getLogger(__name__)
OK = "OK"
PUBLIC = frozenset({"ServerLive", "ServerReady", "ServerMetadata"})  # as on REST


@dataclass(frozen=True)
class RpcAnswer:
    """The response message's fields, the call's status (a ``grpc.StatusCode`` name) and
    details, and trailing metadata (the version that answered and each stage's
    milliseconds, as the REST response's headers)."""

    fields: dict[str, Any]
    code: str = OK
    details: str = ""
    trailers: tuple[tuple[str, str], ...] = ()


def refusal(error: InfergateError) -> RpcAnswer:
    """The error's status and message (the REST body's ``error``)."""
    return RpcAnswer({}, error.grpc_code, error.message)


async def answer(
    frontend: Frontend | None, rpc: str, request: Any, metadata: Mapping[str, str]
) -> RpcAnswer:
    """Answer ``rpc`` (one of ``RPCS``) with ``frontend``, the replica's current one (None:
    still starting); ``metadata`` is the call's, keys lower-case."""
    if frontend is None:
        if rpc == "ServerLive":
            return RpcAnswer({"live": True})
        if rpc == "ServerReady":
            return RpcAnswer({"ready": False})
        return refusal(BackendUnavailable("the front-end is still starting"))
    # A table switch waits for the requests inside the front-end it replaces.
    frontend.in_flight += 1
    try:
        caller = OPEN if rpc in PUBLIC else frontend.access.authenticate(metadata)
        return await HANDLERS[rpc](frontend, caller, request, metadata)
    except InfergateError as error:
        if error.status >= 500:
            log.warning("gRPC %s failed: %s", rpc, error)
        return refusal(error)
    except Exception:
        log.exception("unhandled error on gRPC %s", rpc)
        return refusal(InfergateError("internal error"))
    finally:
        frontend.in_flight -= 1


# -- health and metadata ----------------------------------------------------------------


async def _server_live(frontend: Frontend, caller: Caller, request: Any, md: Any) -> RpcAnswer:
    return RpcAnswer({"live": True})


async def _server_ready(frontend: Frontend, caller: Caller, request: Any, md: Any) -> RpcAnswer:
    try:
        await frontend.path.ready()
    except BackendUnavailable:
        return RpcAnswer({"ready": False})
    return RpcAnswer({"ready": True})


async def _model_ready(frontend: Frontend, caller: Caller, request: Any, md: Any) -> RpcAnswer:
    """Ready false where REST answers 404 or 503 (which ``tritonclient.http`` reads as not
    ready); a key's refusal stays an error."""
    try:
        model = frontend.path.model_for(caller, request.name)
        await frontend.path.model_ready(model, request.version or None)
    except (ModelNotFound, BackendUnavailable):
        return RpcAnswer({"ready": False})
    return RpcAnswer({"ready": True})


async def _server_metadata(frontend: Frontend, caller: Caller, request: Any, md: Any) -> RpcAnswer:
    # The binary tensor data extension is REST's; gRPC messages carry bytes anyway.
    return RpcAnswer({**kserve_v2.server_metadata(), "extensions": []})


async def _model_metadata(frontend: Frontend, caller: Caller, request: Any, md: Any) -> RpcAnswer:
    """REST's metadata but for the tensors' ``parameters`` (the classifier's labels), which
    the gRPC message has no field for: the ``label`` output names each row's."""
    model = frontend.path.model_for(caller, request.name)
    version = request.version or None
    runtimes = (model.pick(pinned=version),) if version is not None else model.versions
    metadata = kserve_v2.model_metadata(model.name, model.task, runtimes)
    for side in ("inputs", "outputs"):
        metadata[side] = [
            {key: tensor[key] for key in ("name", "datatype", "shape")} for tensor in metadata[side]
        ]
    return RpcAnswer(metadata)


# -- inference --------------------------------------------------------------------------


async def _model_infer(
    frontend: Frontend, caller: Caller, request: Any, metadata: Mapping[str, str]
) -> RpcAnswer:
    """One infer call, through the REST endpoint's checks and the inference path."""
    path = frontend.path
    with path.call(caller, request.model_name) as call:
        model = path.model_for(caller, request.model_name)  # refused before reading more
        check_size(request.ByteSize(), frontend.limits)
        kserve_v2.refuse_unless_served(model.task)
        parsed = parse_infer(request, frontend.limits, kserve_v2.OUTPUTS[model.task])
        prediction = await path.infer(
            call, model, parsed.texts, parsed.parameters,
            routing_key=metadata.get("x-routing-key"),
            pinned=request.model_version or metadata.get("x-model-version"),
        )  # fmt: skip
        runtime = call.runtime
        assert runtime is not None
        fields = infer_response(Answer(model, runtime, prediction, parsed))
        trailers = timing_headers(prediction, call.elapsed_s(), runtime)
        return RpcAnswer(fields, trailers=tuple(trailers.items()))


def parse_infer(request: Any, limits: Limits, outputs: tuple[str, ...]) -> PredictRequest:
    """The texts and parameters of a ``ModelInferRequest``, checked as its REST form."""
    payload, binary = infer_payload(request)
    checked = V2InferRequest.from_payload(payload, InferContext(limits, outputs, binary))
    return predict_request(checked)


def infer_payload(request: Any) -> tuple[dict[str, Any], bytes]:
    """A ``ModelInferRequest`` as the REST request's JSON and the binary tensors after it:
    each input's bytes (``raw_input_contents``, or ``contents.bytes_contents`` as the
    binary extension lays them out) with its ``binary_data_size``."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"the request has {len(raw)} raw_input_contents for {len(request.inputs)} "
            "input(s); send one per input, or put every input's data in its contents"
        )
    inputs, chunks = [], []
    for index, tensor in enumerate(request.inputs):
        data = raw[index] if raw else _bytes_contents(tensor.contents.bytes_contents)
        parameters = {key: parameter_value(value) for key, value in tensor.parameters.items()}
        inputs.append({
            "name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype,
            "parameters": {**parameters, "binary_data_size": len(data)},
        })  # fmt: skip
        chunks.append(data)
    payload: dict[str, Any] = {"inputs": inputs}
    if request.id:
        payload["id"] = request.id
    if request.outputs:
        payload["outputs"] = [
            {"name": output.name, "parameters": _parameters(output.parameters)}
            for output in request.outputs
        ]
    if request.parameters:
        payload["parameters"] = _parameters(request.parameters)
    return payload, b"".join(chunks)


def _bytes_contents(elements: Any) -> bytes:
    return b"".join(LENGTH.pack(len(element)) + element for element in elements)


def _parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in parameters.items()}


def parameter_value(parameter: Any) -> Any:
    """The value an ``InferParameter`` holds (whichever of its kinds is set)."""
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def infer_response(answer: Answer) -> dict[str, Any]:
    """A ``ModelInferResponse``'s fields: the requested outputs, their values in
    ``raw_output_contents`` (as ``tritonclient.grpc`` reads them)."""
    tensors = kserve_v2.output_tensors(answer)
    described, contents = [], []
    for output in answer.request.extra["outputs"]:
        datatype, values = tensors[output.name]
        described.append(
            {"name": output.name, "datatype": datatype, "shape": list(np.shape(values))}
        )
        contents.append(to_binary(datatype, values))
    fields: dict[str, Any] = {
        "model_name": answer.model.name,
        "model_version": answer.runtime.served.version,
        "outputs": described,
        "raw_output_contents": contents,
    }
    if answer.request.extra.get("id") is not None:
        fields["id"] = answer.request.extra["id"]
    return fields


Handler = Callable[["Frontend", Caller, Any, Mapping[str, str]], Awaitable[RpcAnswer]]
HANDLERS: dict[str, Handler] = {
    "ServerLive": _server_live,
    "ServerReady": _server_ready,
    "ModelReady": _model_ready,
    "ServerMetadata": _server_metadata,
    "ModelMetadata": _model_metadata,
    "ModelInfer": _model_infer,
}
# The RPCs answered; the service's others (streaming, the repository, statistics, shared
# memory, tracing) get Ray Serve's answer for a method the deployment lacks.
RPCS = tuple(HANDLERS)

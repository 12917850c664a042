"""The Open Inference Protocol (KServe V2) over REST, with the binary tensor data
extension that ``tritonclient.http`` uses by default.

Pure: bodies in, bodies out; ``infergate.protocols.frontend`` routes ``/v2/...`` here and serves
the inference through the same path as ``/v1/models/{name}/predict``. Every model takes
one input and gives its task's outputs:

- input ``text``, BYTES, shape [-1] (or [-1, 1]): one UTF-8 text a row;
- text-classification: ``probabilities``, FP32 [-1, n_labels], the softmax, its columns
  in the order of the output metadata's ``labels`` parameter; ``label``, BYTES [-1], the
  most probable label of each row;
- feature-extraction: ``embedding``, FP32 [-1, dim], unit length unless the request's
  parameter ``normalize`` is false.

The other tasks' answers (ranked texts, sparse vectors, entities) are no fixed-shape
tensors of one text input; their models are refused here with a message naming their
own endpoint.

Protocol: https://github.com/kserve/open-inference-protocol/blob/main/specification/protocol/inference_rest.md
The request, declared once: ``infergate.protocols.v2_request``; the binary tensor data
extension: ``infergate.protocols.v2_binary``; the same protocol over gRPC, which takes its
metadata, refusals and output tensors from here: ``infergate.protocols.v2_grpc``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from starlette.responses import Response

from infergate import __version__, tasks
from infergate.errors import InvalidInput, UnsupportedMediaType
from infergate.protocols.v2_binary import HEADER_LENGTH, to_binary
from infergate.protocols.v2_request import INPUT, parse_infer
from infergate.protocols.wire import Answer, Limits, Parse, PredictRequest, check_content_type

if TYPE_CHECKING:
    from infergate.serving.runtime import ModelRuntime

SERVER_NAME = "infergate"
EXTENSIONS = ("binary_tensor_data",)
# The front-end tokenizes and post-processes around an ONNX graph Triton runs: the
# model's inputs and outputs are the pipeline's, not the graph's.
PLATFORM = "infergate"
# The output tensors of each task served here (infergate.tasks), text-classification
# first, as the refusal of the other tasks has always named them.
OUTPUTS = {
    task.name: task.v2_outputs
    for task in sorted(tasks.TASKS.values(), key=lambda task: task.name, reverse=True)
    if task.v2_outputs
}
OCTET_STREAM = "application/octet-stream"


# -- metadata --------------------------------------------------------------------------


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}


def model_metadata(name: str, task: str, runtimes: Sequence[ModelRuntime]) -> dict[str, Any]:
    """The metadata of a model served by ``runtimes`` (all its versions, or the one a
    path names). Where versions disagree on a size (a canary with other labels), that
    dimension is -1 and the labels are left out."""
    served = tasks.get(task)
    described = [served.v2_output_metadata(runtime.spec) for runtime in runtimes]
    outputs = described[0] if all(d == described[0] for d in described) else None
    return {
        "name": name,
        "versions": [runtime.served.version for runtime in runtimes],
        "platform": PLATFORM,
        "inputs": [{"name": INPUT, "datatype": "BYTES", "shape": [-1]}],
        "outputs": outputs if outputs is not None else served.v2_output_metadata(None),
    }


# -- requests --------------------------------------------------------------------------


def check_infer_content_type(content_type: str | None) -> None:
    """JSON (as on predict), or the binary extension's ``application/octet-stream``; none
    is taken as either (``tritonclient.http`` sends none)."""
    if content_type and content_type.partition(";")[0].strip().lower() == OCTET_STREAM:
        return
    try:
        check_content_type(content_type)
    except UnsupportedMediaType as error:
        what = error.message.partition(";")[0]  # "content type 'text/plain' is not supported"
        raise UnsupportedMediaType(
            f"{what}; send 'content-type: application/json', or '{OCTET_STREAM}' with "
            "binary tensors after an Inference-Header-Content-Length JSON header"
        ) from None


def infer_parser(task: str | None, headers: Mapping[str, str]) -> Parse:
    """The parser of an infer call to a model of ``task`` (None: no such model, and the
    front-end says so before parsing), reading the binary extension's header."""
    header_length = headers.get(HEADER_LENGTH)
    outputs = () if task is None else tasks.get(task).v2_outputs

    def parse(body: bytes, limits: Limits) -> PredictRequest:
        if task is not None:
            refuse_unless_served(task)
        return parse_infer(body, limits, outputs, header_length)

    return parse


def refuse_unless_served(task: str) -> None:
    """Refuse a model whose task's answers are no tensors of this protocol, naming the
    endpoint that serves it (REST and gRPC alike)."""
    served = tasks.get(task)
    if not served.v2_outputs:
        raise InvalidInput(
            f"the V2 protocol serves {' and '.join(OUTPUTS)} models here; this is a "
            f"{task} model: use POST /v1/models/{{name}}/predict"
            + (" or /v1/models/{name}/rerank" if served.reranks else "")
        )


# -- responses -------------------------------------------------------------------------


def render_infer(answer: Answer) -> dict[str, Any] | Response:
    """The infer response: JSON alone, or with binary outputs a JSON header (its length in
    the Inference-Header-Content-Length header) followed by their bytes in order."""
    tensors = output_tensors(answer)
    header: dict[str, Any] = {
        "model_name": answer.model.name,
        "model_version": answer.runtime.served.version,
    }
    if answer.request.extra.get("id") is not None:
        header["id"] = answer.request.extra["id"]
    described, chunks = [], []
    for output in answer.request.extra["outputs"]:
        datatype, values = tensors[output.name]
        tensor: dict[str, Any] = {"name": output.name, "datatype": datatype}
        tensor["shape"] = list(np.shape(values))
        if output.binary:
            chunk = to_binary(datatype, values)
            tensor["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            tensor["data"] = _to_json(datatype, values)
        described.append(tensor)
    header["outputs"] = described
    if not chunks:
        return header
    head = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(
        head + b"".join(chunks),
        media_type=OCTET_STREAM,
        headers={HEADER_LENGTH: str(len(head))},
    )


def output_tensors(answer: Answer) -> dict[str, tuple[str, Any]]:
    """Each output of the answer's task: its datatype and values (an array, or a list of
    strings for BYTES)."""
    prediction = answer.prediction
    return tasks.get(answer.runtime.spec.task).v2_tensors(prediction.outputs, prediction.raw)


def _to_json(datatype: str, values: Any) -> Any:
    if datatype == "BYTES":
        return list(values)
    # Row-major; orjson writes a float32 as one: 0.98, not 0.9800000190734863.
    return np.ravel(values)

"""The infer request of the Open Inference Protocol (``infergate.protocols.kserve_v2``),
declared once: ``V2InferRequest`` is the request's schema in the OpenAPI document, and
``parse_infer`` reads every body through it, the JSON and, with the binary tensor data
extension, the binary tensors after it (``infergate.protocols.v2_binary``). Every way a
request can be wrong maps to one typed error naming the part of the request at fault.

Pure: no Ray, no Triton.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from infergate.errors import InvalidInput, MalformedBody
from infergate.protocols.v2_binary import HEADER_LENGTH, binary_elements, split
from infergate.protocols.wire import (
    Limits,
    PredictRequest,
    check_body_size,
    check_parameters,
    check_text_count,
    check_texts,
    json_type,
    load_json,
)
from infergate.serving.prompts import PROMPT_NAME

# The one input every model takes: one UTF-8 text a row.
INPUT = "text"
# binary_data_output is the extension's; normalize and prompt_name (a named prompt of
# the version, infergate.serving.prompts) are the predict endpoint's.
PARAMETERS = {"binary_data_output": bool, "normalize": bool, PROMPT_NAME: str}
EXAMPLE = '{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}'


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool  # in the binary part of the body, rather than as JSON "data"


@dataclass(frozen=True)
class InferContext:
    """What an infer request is checked against beside its JSON: the limits, the
    model's outputs, and the binary tensors after the JSON header (None: the body is
    all JSON)."""

    limits: Limits
    outputs: Sequence[str]
    binary: bytes | None = None


class V2InputTensor(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Always 'text'.", examples=["text"])
    shape: list[int] = Field(description="[n] (or [n, 1]) for n texts.", examples=[[2]])
    datatype: str = Field(description="Always 'BYTES'.", examples=["BYTES"])
    data: list[str] | None = Field(
        None, description="The texts, row-major; absent when they follow as binary data."
    )
    parameters: dict[str, int] = Field(
        default_factory=dict,
        description="'binary_data_size': bytes of this tensor in the binary part of the body.",
    )


class V2RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="probabilities or label (text-classification), embedding.")
    parameters: dict[str, bool] = Field(
        default_factory=dict, description="'binary_data': return it as binary data."
    )


# Declared as wire.Body's subclasses are, without being one: beside the limits, its check
# needs the model's outputs and the binary tensors after the JSON (an InferContext), and
# its messages name the part of the request at fault. Those tensors are bytes, not JSON,
# so check decodes them by hand (infergate.protocols.v2_binary).
class V2InferRequest(BaseModel):
    """The infer request: this JSON, or with the binary tensor data extension this JSON
    as a header followed by the tensors' bytes."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(None, description="Returned in the response.")
    inputs: list[V2InputTensor] = Field(description="One input, 'text'.")
    outputs: list[V2RequestedOutput] | None = Field(
        None, description="The outputs to return; all of the model's by default."
    )
    parameters: dict[str, bool | str] = Field(
        default_factory=dict,
        description="'binary_data_output': every output as binary data; 'normalize' (default "
        "true, feature-extraction only); 'prompt_name': a prompt the model was registered "
        "with, put before each text (default: its default prompt, if any).",
    )

    @classmethod
    def read(cls, header: bytes, context: InferContext) -> V2InferRequest:
        """The request whose JSON is ``header``, or a typed error naming what was wrong."""
        return cls.from_payload(load_json(header, EXAMPLE), context)

    @classmethod
    def from_payload(cls, payload: Any, context: InferContext) -> V2InferRequest:
        """The request of a decoded JSON value (or of what the gRPC protocol's message
        amounts to), or a typed error naming what was wrong."""
        if not isinstance(payload, dict):
            raise InvalidInput(
                f"expected a JSON object such as {EXAMPLE}, got {json_type(payload)}"
            )
        try:
            return cls.model_validate(payload, context=context)
        except ValidationError as error:  # what ``check`` let through: never a 500
            raise InvalidInput(f"invalid body: {error.errors()[0]['msg']}") from None

    @classmethod
    def check(cls, payload: dict[str, Any], context: InferContext) -> dict[str, Any]:
        """``payload`` checked, as the all-JSON request it amounts to: the input's texts
        in its ``data`` (wherever they came), each output to return named with its
        ``binary_data``, and in ``parameters`` the model's alone; or a typed error."""
        _no_unknown_keys(payload, frozenset(cls.model_fields), "the request")
        request_id = payload.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise InvalidInput(f"'id' must be a string, got {json_type(request_id)}")
        parameters = dict(check_parameters(payload.get("parameters"), PARAMETERS))
        binary_default = parameters.pop("binary_data_output", False)
        tensor = _input_tensor(payload.get("inputs"), context.binary, context.limits)
        requested = _requested_outputs(payload.get("outputs"), context.outputs, binary_default)
        return {
            "id": request_id,
            "inputs": [tensor],
            "outputs": [
                {"name": output.name, "parameters": {"binary_data": output.binary}}
                for output in requested
            ],
            "parameters": parameters,
        }

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, payload: Any, info: ValidationInfo) -> Any:
        if isinstance(info.context, InferContext):
            return cls.check(payload, info.context)
        return payload

    @property
    def texts(self) -> list[str]:
        return self.inputs[0].data or []

    @property
    def requested(self) -> tuple[RequestedOutput, ...]:
        """The outputs to return, in order."""
        return tuple(
            RequestedOutput(output.name, output.parameters["binary_data"])
            for output in self.outputs or ()
        )


def parse_infer(
    body: bytes,
    limits: Limits,
    outputs: Sequence[str],
    header_length: str | None = None,
) -> PredictRequest:
    """The texts of an infer request, its parameters for the model, and in ``extra`` its
    ``id`` and ``outputs`` (``RequestedOutput``s among ``outputs``, the model's). A binary
    body has a JSON header of ``header_length`` bytes, then the binary tensors."""
    check_body_size(body, limits)
    header, binary = split(body, header_length)
    return predict_request(V2InferRequest.read(header, InferContext(limits, outputs, binary)))


def predict_request(request: V2InferRequest) -> PredictRequest:
    """What an infer request, checked, asks the inference path for."""
    return PredictRequest(
        texts=request.texts,
        parameters=request.parameters,
        extra={"id": request.id, "outputs": request.requested},
    )


def _input_tensor(inputs: Any, binary: bytes | None, limits: Limits) -> dict[str, Any]:
    """The one input, its texts (from JSON or the binary part) checked, as JSON data."""
    if inputs is None:
        raise InvalidInput(f"field 'inputs' is missing; expected {EXAMPLE}")
    if not isinstance(inputs, list) or not inputs:
        got = "an empty list" if inputs == [] else json_type(inputs)
        raise InvalidInput(f"'inputs' must be a list holding the input {INPUT!r}, got {got}")
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise InvalidInput(f"'inputs[{index}]' must be an object, got {json_type(tensor)}")
        if tensor.get("name") != INPUT:
            raise InvalidInput(
                f"unknown input {tensor.get('name')!r} in 'inputs[{index}]'; the model takes "
                f"one input, {INPUT!r}"
            )
    if len(inputs) > 1:
        raise InvalidInput(f"input {INPUT!r} is given {len(inputs)} times; send it once")
    tensor = inputs[0]
    where = f"input {INPUT!r}"
    _no_unknown_keys(tensor, frozenset(V2InputTensor.model_fields), where)
    if tensor.get("datatype") != "BYTES":
        raise InvalidInput(
            f"{where} has datatype {tensor.get('datatype')!r}; it takes 'BYTES' (UTF-8 texts)"
        )
    count = _row_count(tensor.get("shape"), where, limits)
    size = _binary_size(tensor.get("parameters"), where)
    if size is None:
        if binary:
            raise MalformedBody(
                f"the body has {len(binary)} bytes after its JSON header but no input "
                "declares 'binary_data_size'"
            )
        if "data" not in tensor:
            raise InvalidInput(f"{where} has no 'data'; send its texts, e.g. {EXAMPLE}")
        elements = _json_elements(tensor["data"], count, where)
    else:
        if "data" in tensor:
            raise InvalidInput(
                f"{where} has both 'data' and parameter 'binary_data_size'; send one of them"
            )
        if binary is None:
            raise MalformedBody(
                f"{where} declares binary_data_size but the request has no {HEADER_LENGTH} "
                "header to say where the JSON ends and the binary data begins"
            )
        if size != len(binary):
            raise MalformedBody(
                f"{where} declares binary_data_size {size} but the body has {len(binary)} "
                "bytes after its JSON header"
            )
        elements = binary_elements(binary, count, where)
    if len(elements) != count:
        held = len(elements) if len(elements) <= count else f"more than {count}"
        raise InvalidInput(
            f"{where} has shape {tensor['shape']} ({count} elements) but its data holds {held}"
        )
    texts = check_texts(elements, limits, where, lambda index: f"{where} element {index}")
    return {"name": INPUT, "shape": tensor["shape"], "datatype": "BYTES", "data": texts}


def _row_count(shape: Any, where: str, limits: Limits) -> int:
    """The number of texts a ``[n]`` or ``[n, 1]`` shape holds."""
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidInput(
            f"{where} has shape {shape!r}; expected a list of non-negative integers, "
            "[n] for n texts"
        )
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise InvalidInput(f"{where} has shape {shape}; expected [n] (or [n, 1]) for n texts")
    count = math.prod(shape)
    check_text_count(count, limits, where)  # before its data is read
    return count


def _binary_size(parameters: Any, where: str) -> int | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{where}'s 'parameters' must be an object, got {json_type(parameters)}")
    for key in parameters:
        if key.startswith("shared_memory"):
            raise InvalidInput(
                f"{where} uses {key!r}; shared memory is not offered, send the data in the body"
            )
        if key != "binary_data_size":
            raise InvalidInput(f"unknown parameter {key!r} of {where}; known: 'binary_data_size'")
    size = parameters.get("binary_data_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise InvalidInput(
            f"{where}'s binary_data_size must be a non-negative integer, got {size!r}"
        )
    return size


def _json_elements(data: Any, limit: int, where: str) -> list[Any]:
    """The elements of JSON tensor data, flat or nested row-major; at most ``limit`` + 1
    are taken (enough to tell the shape was wrong)."""
    if not isinstance(data, list):
        raise InvalidInput(f"{where}'s 'data' must be a list of strings, got {json_type(data)}")
    flat: list[Any] = []
    stack = [iter(data)]
    while stack and len(flat) <= limit:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
            if len(flat) > limit:
                break
        else:
            stack.pop()
    return flat


def _requested_outputs(
    requested: Any, outputs: Sequence[str], binary_default: bool
) -> tuple[RequestedOutput, ...]:
    if requested is None or requested == []:
        return tuple(RequestedOutput(name, binary_default) for name in outputs)
    if not isinstance(requested, list):
        raise InvalidInput(f"'outputs' must be a list of objects, got {json_type(requested)}")
    chosen: dict[str, RequestedOutput] = {}
    for index, output in enumerate(requested):
        if not isinstance(output, dict):
            raise InvalidInput(f"'outputs[{index}]' must be an object, got {json_type(output)}")
        _no_unknown_keys(output, frozenset(V2RequestedOutput.model_fields), f"'outputs[{index}]'")
        name = output.get("name")
        if not isinstance(name, str) or name not in outputs:
            raise InvalidInput(
                f"unknown output {name!r} in 'outputs[{index}]'; the model's outputs are "
                f"{list(outputs)}"
            )
        if name in chosen:
            raise InvalidInput(f"output {name!r} is requested twice; request it once")
        chosen[name] = RequestedOutput(name, _binary_choice(output, name, binary_default))
    return tuple(chosen.values())


def _binary_choice(output: dict[str, Any], name: str, binary_default: bool) -> bool:
    parameters = output.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput(
            f"output {name!r}'s 'parameters' must be an object, got {json_type(parameters)}"
        )
    for key in parameters:
        if key == "classification":
            raise InvalidInput(
                "the classification extension is not offered; request the outputs "
                "'label' and 'probabilities'"
            )
        if key.startswith("shared_memory"):
            raise InvalidInput(f"output {name!r} uses {key!r}; shared memory is not offered")
        if key != "binary_data":
            raise InvalidInput(
                f"unknown parameter {key!r} of output {name!r}; known: 'binary_data'"
            )
    binary = parameters.get("binary_data", binary_default)
    if not isinstance(binary, bool):
        raise InvalidInput(
            f"output {name!r}'s binary_data must be a boolean, got {json_type(binary)}"
        )
    return binary


def _no_unknown_keys(value: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InvalidInput(
            f"unknown field(s) {unknown} in {where}; allowed fields are {sorted(allowed)}"
        )

"""Triton Python-backend model: ONNX Runtime over one dynamic batch of ragged requests.

This file is copied into every model folder as ``<name>/1/model.py`` and runs inside
Triton's Python-backend stub, the only place ``triton_python_backend_utils`` exists; the
rest of infergate never imports it, except ``infergate batch``, which opens and runs the
session through :func:`make_session` and :func:`run` so that a batch job runs the same
graph with the same inputs and options (``triton_python_backend_utils`` is then absent and
``TritonPythonModel`` unused). It depends on numpy and onnxruntime only.

Contract of ``model.onnx`` next to it: inputs ``input_ids`` and ``attention_mask`` (int64,
``[batch, sequence]``), one float32 output ``[batch, dim]`` (or ``[batch, sequence, dim]``
for per-token outputs) whose name is the output in ``config.pbtxt``. The model must use
the attention mask, which is what makes the right-padding below invisible in its
results; a per-token output is cut back to each request's own sequence length.

A text's answer does not depend on what it is batched with (``docs/registration.md``,
"Answers independent of batch-mates"; tests/integration/test_batch_mates.py):

- ONNX Runtime's int8 ``MatMulNBits`` kernel (accuracy level 4, AVX-512 here) computes
  rows in pairs and a last odd row with another kernel that rounds differently, so the
  batch is padded to an even number of rows (tokens x texts) by one more padded column
  when both are odd (no measurable cost); padding itself changes nothing measurable
  (5e-15 cosine distance).
- A graph marked ``infergate.rows_alone`` (dynamic int8: one activation scale for the
  whole input, padding included) runs each text alone on its own tokens. On the 406 demo
  texts (12 tokens on average) that took from 10% more to 20% less CPU than padded
  batches of 32, which compute their padding too.

Python-backend API: https://github.com/triton-inference-server/python_backend#usage
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

try:
    import triton_python_backend_utils as pb_utils
except ModuleNotFoundError:  # outside Triton: infergate batch uses the session half only
    pb_utils = None

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
# Right-padding value of both inputs: mask 0 hides the padded positions, and id 0 (BERT's
# [PAD]) is as good as any other id there.
PAD_VALUE = 0
# Metadata key of a graph whose texts must run alone (infergate.registration.quantise).
ROWS_ALONE_KEY = "infergate.rows_alone"


class TritonPythonModel:
    """One model instance: an ONNX Runtime session over ``model.onnx``."""

    def initialize(self, args: dict[str, str]) -> None:
        """Open the session; any exception here fails the load with its message."""
        config = json.loads(args["model_config"])
        self.output_name: str = config["output"][0]["name"]
        parameters = config.get("parameters", {})
        threads = int(parameters.get("ort_intra_op_threads", {}).get("string_value", "0"))
        # args["model_repository"] is this model's folder (python_backend README, "initialize").
        model_path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = make_session(model_path, threads, _providers(args), self.output_name)
        self.rows_alone = rows_alone(self.session)

    def execute(self, requests: list[Any]) -> list[Any]:
        """Run the whole batch in one ``session.run``; one response per request.

        A malformed request gets its own error response and the others still run. If the
        batched run fails (say one request holds a token id outside the vocabulary), each
        request is run alone so that only the faulty ones fail.
        """
        responses: list[Any] = [None] * len(requests)
        valid: list[tuple[int, np.ndarray, np.ndarray]] = []
        for index, request in enumerate(requests):
            ids = pb_utils.get_input_tensor_by_name(request, INPUT_IDS)
            mask = pb_utils.get_input_tensor_by_name(request, ATTENTION_MASK)
            problem: str | None
            if ids is None or mask is None:
                problem = f"the request needs both {INPUT_IDS!r} and {ATTENTION_MASK!r}."
            else:
                # as_numpy() is a view of the request's shared memory, not a copy.
                ids, mask = ids.as_numpy(), mask.as_numpy()
                problem = _shape_problem(ids, mask)
            if problem is None:
                valid.append((index, ids, mask))
            else:
                responses[index] = _error_response(problem, pb_utils.TritonError.INVALID_ARG)
        if not valid:
            return responses
        try:
            self._respond(valid, responses)
        except Exception as batch_failure:
            if len(valid) == 1:
                responses[valid[0][0]] = _failure_response(batch_failure)
            else:
                for item in valid:
                    try:
                        self._respond([item], responses)
                    except Exception as failure:
                        responses[item[0]] = _failure_response(failure)
        return responses

    def _respond(
        self, items: list[tuple[int, np.ndarray, np.ndarray]], responses: list[Any]
    ) -> None:
        ids = _pad_and_stack([item[1] for item in items])
        mask = _pad_and_stack([item[2] for item in items])
        output = run(self.session, self.output_name, ids, mask, rows_alone=self.rows_alone)
        start = 0
        for index, request_ids, _ in items:
            stop = start + request_ids.shape[0]
            # Row slices of a C-contiguous array are contiguous views; no copy until Triton
            # moves them into the response's shared memory. Per-token rows lose the padding
            # that other requests' longer sequences added (a copy, as Triton needs).
            rows = output[start:stop]
            if rows.ndim == 3 and rows.shape[1] != request_ids.shape[1]:
                rows = np.ascontiguousarray(rows[:, : request_ids.shape[1]])
            tensor = pb_utils.Tensor(self.output_name, rows)
            responses[index] = pb_utils.InferenceResponse(output_tensors=[tensor])
            start = stop

    def finalize(self) -> None:
        """Release the session when Triton unloads the model."""
        self.session = None


def make_session(
    model_path: Path, threads: int, providers: list[Any], output_name: str
) -> ort.InferenceSession:
    """An ONNX Runtime session over ``model_path`` with the serving options; ValueError if
    the graph lacks the contract's inputs or ``output_name``."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # 0: ONNX Runtime picks (one per core)
    # Idle threads spin-wait for work by default; beside a front-end on a few cores
    # that burned 7.2 ms of CPU for a 1.9 ms run (3.2 ms without spinning).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.inter_op_num_threads = 1  # a transformer graph has no parallel branches
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(model_path), sess_options=options, providers=providers)
    inputs = sorted(i.name for i in session.get_inputs())
    outputs = [o.name for o in session.get_outputs()]
    if inputs != sorted((INPUT_IDS, ATTENTION_MASK)) or output_name not in outputs:
        raise ValueError(
            f"{model_path} has inputs {inputs} and outputs {outputs}; expected inputs "
            f"{[ATTENTION_MASK, INPUT_IDS]} and an output {output_name!r}."
        )
    return session


def rows_alone(session: ort.InferenceSession) -> bool:
    """Whether the graph's texts must each run alone (its ``ROWS_ALONE_KEY`` mark)."""
    return session.get_modelmeta().custom_metadata_map.get(ROWS_ALONE_KEY) == "true"


def run(
    session: ort.InferenceSession, output_name: str, ids: np.ndarray, mask: np.ndarray,
    *, rows_alone: bool,
) -> np.ndarray:  # fmt: skip
    """The graph's ``output_name`` for right-padded ``[texts, tokens]`` inputs, each text's
    answer the same whatever it is batched with (the module docstring); per-token outputs
    have ``tokens`` columns, zero where a text was padded."""
    if rows_alone:
        return _run_rows_alone(session, output_name, ids, mask)
    output = _run(session, output_name, _even_rows(ids), _even_rows(mask))
    return output[:, : ids.shape[1]] if output.ndim == 3 else output


def _run(
    session: ort.InferenceSession, output_name: str, ids: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    return session.run([output_name], {INPUT_IDS: ids, ATTENTION_MASK: mask})[0]


def _run_rows_alone(
    session: ort.InferenceSession, output_name: str, ids: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """One run per text on its own tokens, stacked as one batched run's output would be
    (per-token outputs zero where a text was padded)."""
    rows = []
    for row_ids, row_mask in zip(ids, mask, strict=True):
        length = _own_length(row_mask)
        rows.append(_run(session, output_name, row_ids[None, :length], row_mask[None, :length])[0])
    if rows[0].ndim == 1:
        return np.stack(rows)
    output = np.zeros((len(rows), ids.shape[1], rows[0].shape[-1]), dtype=rows[0].dtype)
    for index, row in enumerate(rows):
        output[index, : row.shape[0]] = row
    return output


def providers(gpu: bool, device_id: int = 0) -> list[Any]:
    """ONNX Runtime's providers: CUDA first on a GPU (when this build has it), else CPU."""
    if gpu and "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _providers(args: dict[str, str]) -> list[Any]:
    # onnxruntime-gpu lists the CUDA provider even on a machine without a GPU, and asking for
    # it there logs a load error before falling back; so use it only when Triton placed this
    # instance on a GPU (instance_group kind KIND_GPU).
    gpu = args.get("model_instance_kind") == "GPU"
    return providers(gpu, int(args.get("model_instance_device_id", "0")))


def _shape_problem(ids: np.ndarray, mask: np.ndarray) -> str | None:
    """Why a request cannot run, or None. Triton has already checked names, dtypes and
    rank against config.pbtxt; what it cannot check is that the two inputs agree."""
    if ids.shape != mask.shape:
        return (
            f"{INPUT_IDS} has shape {list(ids.shape)} but {ATTENTION_MASK} has shape "
            f"{list(mask.shape)}; both must be the same [batch, sequence]."
        )
    if ids.ndim != 2 or ids.shape[1] < 1:
        return f"{INPUT_IDS} has shape {list(ids.shape)}; expected [batch, sequence >= 1]."
    return None


def _pad_and_stack(arrays: list[np.ndarray]) -> np.ndarray:
    """Stack ``[rows_i, length_i]`` arrays into ``[sum rows, max length]``, right-padded.

    One request passes through untouched; otherwise exactly one copy is made.
    """
    if len(arrays) == 1:
        return arrays[0]
    longest = max(array.shape[1] for array in arrays)
    if all(array.shape[1] == longest for array in arrays):
        return np.concatenate(arrays)
    stacked = np.full(
        (sum(array.shape[0] for array in arrays), longest), PAD_VALUE, dtype=arrays[0].dtype
    )
    row = 0
    for array in arrays:
        stacked[row : row + array.shape[0], : array.shape[1]] = array
        row += array.shape[0]
    return stacked


def _even_rows(array: np.ndarray) -> np.ndarray:
    """``[texts, tokens]`` with one more padded column if both are odd, so that the batch
    has an even number of rows for the GEMMs (see the module docstring)."""
    texts, tokens = array.shape
    if texts % 2 == 0 or tokens % 2 == 0:
        return array
    return np.pad(array, ((0, 0), (0, 1)), constant_values=PAD_VALUE)


def _own_length(mask: np.ndarray) -> int:
    """Tokens up to the last attended one (at least one): a right-padded row's own."""
    attended = np.flatnonzero(mask)
    return int(attended[-1]) + 1 if attended.size else 1


def _failure_response(exc: Exception) -> Any:
    # ONNX Runtime reports bad input values (ids outside the vocabulary, a sequence longer
    # than the position table) as InvalidArgument: the request's fault, not the model's.
    invalid = type(exc).__name__ == "InvalidArgument"
    code = pb_utils.TritonError.INVALID_ARG if invalid else pb_utils.TritonError.INTERNAL
    return _error_response(f"ONNX Runtime failed on this request: {exc}", code)


def _error_response(message: str, code: Any) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))

"""Clients of a running Triton: the async data path and the sync control path.

Errors from tritonclient carry the gRPC status as a string (``"StatusCode.UNAVAILABLE"``,
see ``tritonclient/grpc/_utils.py: get_error_grpc``); they are mapped here onto infergate's
typed errors, whose messages never expose Triton internals to HTTP clients. The original
exception stays reachable as ``__cause__``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from tritonclient.utils import InferenceServerException

from infergate.errors import (
    BackendTimeout,
    BackendUnavailable,
    InfergateError,
    RegistrationError,
)

log = logging.getLogger(__name__)

# Statuses that mean "the backend cannot serve this model right now" rather than "this
# request is wrong". Triton 2.51 answers NOT_FOUND both for a model it does not know and
# for one with no ready version (failed, unloading or unloaded); UNAVAILABLE means the
# server is unreachable. Checked against the real server in tests/e2e/test_triton.py.
_UNAVAILABLE_STATUSES = frozenset(
    {
        "StatusCode.UNAVAILABLE",
        "StatusCode.NOT_FOUND",
        "StatusCode.CANCELLED",
        "StatusCode.RESOURCE_EXHAUSTED",
    }
)


# Deadline of the control calls that only read state.
_QUICK_CALL_TIMEOUT_S = 5.0


def _status(exc: InferenceServerException) -> str:
    return str(exc.status() or "")


def _without_traceback(message: str) -> str:
    # The Python backend appends the Python stack ("\n\nAt:\n  file(line): function") to
    # errors raised in model.py; it stays in the exception's __cause__ and Triton's log.
    return message.split("\n\nAt:\n", 1)[0].strip()


class TritonBackend:
    """Async inference against Triton over gRPC, one channel per instance.

    Meant for one asyncio event loop (a Ray Serve replica): the underlying
    ``grpc.aio`` channel belongs to the loop it was created in, so it is created lazily,
    on the first call, inside that loop.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        """``url`` is ``host:port`` of Triton's gRPC endpoint; ``timeout_s`` bounds each call."""
        self.url = url
        self.timeout_s = timeout_s
        self._client: grpcclient_aio.InferenceServerClient | None = None

    def _get_client(self) -> grpcclient_aio.InferenceServerClient:
        if self._client is None:
            self._client = grpcclient_aio.InferenceServerClient(self.url)
        return self._client

    async def infer(
        self,
        model: str,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        output_name: str,
        *,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Run ``model`` on one tokenized batch and return its ``[batch, dim]`` output;
        ``extra`` holds more int64 inputs by name (translation's decoding settings).

        Raises:
            BackendUnavailable: Triton is unreachable, timed out, or ``model`` is not loaded.
            InfergateError: Triton rejected the request or the model failed on it (500).
        """
        inputs = [
            _infer_input("input_ids", input_ids),
            _infer_input("attention_mask", attention_mask),
            *(_infer_input(name, array) for name, array in (extra or {}).items()),
        ]
        outputs = [grpcclient_aio.InferRequestedOutput(output_name)]
        try:
            result = await self._get_client().infer(
                model, inputs, outputs=outputs, client_timeout=self.timeout_s
            )
        except InferenceServerException as exc:
            # The answer names no Triton model (an internal name); the log does.
            log.warning("Triton inference on %s (%d rows) failed: %s", model, len(input_ids), exc)
            status = _status(exc)
            if status == "StatusCode.DEADLINE_EXCEEDED":  # a 504: the call went out, no answer
                raise BackendTimeout(
                    f"The model did not answer within {self.timeout_s:g} s: the backend is "
                    "overloaded or stalled, or the request is too large for that deadline."
                ) from exc
            if status in _UNAVAILABLE_STATUSES:
                raise BackendUnavailable(
                    "The inference backend cannot serve this model right now; retry later."
                ) from exc
            raise InfergateError("The inference backend failed to run this model.") from exc
        output = result.as_numpy(output_name)
        if output is None:
            raise InfergateError(f"The inference backend returned no {output_name!r}.")
        return output

    async def is_model_ready(self, model: str) -> bool:
        """Whether ``model`` is loaded and ready; False also when Triton is unreachable."""
        try:
            return bool(
                await self._get_client().is_model_ready(model, client_timeout=self.timeout_s)
            )
        except InferenceServerException as exc:
            log.debug("Triton readiness of %s unknown: %s", model, exc)
            return False

    async def server_ready(self) -> bool:
        """Whether Triton answers and is ready; False when unreachable."""
        try:
            return bool(await self._get_client().is_server_ready(client_timeout=self.timeout_s))
        except InferenceServerException as exc:
            log.debug("Triton server readiness unknown: %s", exc)
            return False

    async def close(self) -> None:
        """Close the channel; a later call opens a new one."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()


def _infer_input(name: str, array: np.ndarray) -> grpcclient_aio.InferInput:
    # A no-op for the int64 C-contiguous arrays the tokenizer produces.
    array = np.ascontiguousarray(array, dtype=np.int64)
    tensor = grpcclient_aio.InferInput(name, list(array.shape), "INT64")
    tensor.set_data_from_numpy(array)  # gRPC always sends raw (binary) tensor contents
    return tensor


class TritonControl:
    """Synchronous control of Triton's model repository (explicit model control mode)."""

    def __init__(self, url: str) -> None:
        """``url`` is ``host:port`` of Triton's gRPC endpoint."""
        self.url = url
        self._client = grpcclient.InferenceServerClient(url)

    def load(
        self,
        model: str,
        timeout_s: float,
        *,
        config: str | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        """Load (or reload) ``model`` and wait until it is ready: from the server's own
        repository, or from ``config`` (JSON) and ``files`` (``file:<path>`` overrides)
        sent with the request.

        Raises:
            RegistrationError: Triton could not load it; the message is Triton's (a corrupt
                ONNX file, a config error) or says that the load did not finish in time.
            BackendUnavailable: Triton is not reachable.
        """
        try:
            self._client.load_model(model, config=config, files=files, client_timeout=timeout_s)
        except InferenceServerException as exc:
            status = _status(exc)
            if status == "StatusCode.UNAVAILABLE":
                raise BackendUnavailable(f"Triton at {self.url} is not reachable.") from exc
            if status == "StatusCode.DEADLINE_EXCEEDED":
                raise RegistrationError(
                    f"Triton did not finish loading model {model!r} within {timeout_s:g} s; "
                    "it may still be loading. Raise triton.load_timeout_s if models are large."
                ) from exc
            raise RegistrationError(
                f"Triton could not load model {model!r}: {_without_traceback(exc.message())}"
            ) from exc

    def unload(self, model: str, timeout_s: float = 30.0) -> None:
        """Unload ``model`` and wait until Triton has released it.

        Triton finishes the requests in flight first, then stops the model's stub process
        (about a second here); unloading an unknown model is a no-op.

        Raises:
            BackendUnavailable: Triton is unreachable or the unload did not end in time.
        """
        try:
            self._client.unload_model(model, client_timeout=timeout_s)
            deadline = time.monotonic() + timeout_s
            while self.loaded_models().get(model) in ("READY", "UNLOADING"):
                if time.monotonic() > deadline:
                    raise BackendUnavailable(
                        f"Model {model!r} was still unloading {timeout_s:g} s after the request."
                    )
                time.sleep(0.05)
        except InferenceServerException as exc:
            raise BackendUnavailable(f"Triton could not unload model {model!r}.") from exc

    def loaded_models(self) -> dict[str, str]:
        """Every model of the repository index that Triton has a state for, name -> state:
        ``READY``, ``LOADING``, ``UNLOADING`` or ``UNAVAILABLE`` (failed to load, or
        unloaded). Folders never loaded are left out."""
        try:
            index = self._client.get_model_repository_index(
                as_json=True, client_timeout=_QUICK_CALL_TIMEOUT_S
            )
        except InferenceServerException as exc:
            raise BackendUnavailable(f"Triton at {self.url} is not reachable.") from exc
        return {
            entry["name"]: entry["state"] for entry in index.get("models", []) if entry.get("state")
        }

    def is_ready(self, model: str) -> bool:
        """Whether ``model`` is loaded and ready; False also when Triton is unreachable."""
        try:
            return bool(self._client.is_model_ready(model, client_timeout=_QUICK_CALL_TIMEOUT_S))
        except InferenceServerException:
            return False

    def server_ready(self) -> bool:
        """Whether Triton answers and is ready; False when unreachable."""
        try:
            return bool(self._client.is_server_ready(client_timeout=_QUICK_CALL_TIMEOUT_S))
        except InferenceServerException:
            return False

    def wait_server_ready(self, timeout_s: float) -> None:
        """Block until Triton answers as ready.

        Raises:
            BackendUnavailable: it did not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while not self.server_ready():
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"Triton at {self.url} was not ready after {timeout_s:g} s."
                )
            time.sleep(0.1)

    def close(self) -> None:
        """Close the gRPC channel."""
        self._client.close()

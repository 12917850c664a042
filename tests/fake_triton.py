"""A stand-in for one Triton's control API (``infergate.triton.client.TritonControl``),
for tests of what the control plane asks of it; real Triton runs in tests/e2e."""

from __future__ import annotations

import json

from infergate.errors import RegistrationError


class FakeTriton:
    """Records loads and unloads, and knows what is ready. Without ``native`` it refuses
    models on the native ONNX Runtime backend, as the nvidia-pytriton wheel's Triton does."""

    def __init__(self, url: str = "", native: bool = False) -> None:
        self.url, self.native = url, native
        self.loaded: list[str] = []
        self.requests: list[tuple[str, dict]] = []  # the config and files sent with each
        self.unloaded: list[str] = []
        self.ready: set[str] = set()
        self.closed = False
        self.up = True  # False: it does not answer
        self.refuse: str | None = None  # set: every load fails with this message

    def load(self, model: str, timeout_s: float, *, config=None, files=None) -> None:
        if self.refuse is not None:
            raise RegistrationError(self.refuse)
        if config and json.loads(config).get("platform") == "onnxruntime_onnx" and not self.native:
            raise RegistrationError("unknown platform onnxruntime_onnx")
        self.loaded.append(model)
        self.requests.append((model, {"config": config, "files": files}))
        self.ready.add(model)

    def unload(self, model: str, timeout_s: float = 30.0) -> None:
        self.unloaded.append(model)
        self.ready.discard(model)

    def is_ready(self, model: str) -> bool:
        return model in self.ready

    def server_ready(self) -> bool:
        return self.up

    def close(self) -> None:
        self.closed = True

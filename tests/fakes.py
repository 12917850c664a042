"""The stand-ins the tests share, each written once with what it replaces and why a test
that passes against it would pass against the real thing:

- ``asgi``: a front-end served as Ray Serve's ingress serves it;
- ``answered``: a version's answer to a batch of texts, for telemetry and monitors;
- ``FakeClock``: time that moves only when a test moves it;
- ``Recorder``: a replica's telemetry and monitors, keeping what they were told;
- ``FakeVersion``: a loaded version that answers at once, fails or hangs;
- ``FakeTritonBackend``: Triton for inference, computing what a test chooses;
- ``FakeTritonControl``: Triton's control API, loading and unloading in memory;
- ``MemoryRegistry``: MLflow's model registry in memory, artifacts from a folder.

A stand-in that only one test module needs, and that behaves otherwise, stays there.
pytest puts tests/ on the path (``pythonpath`` in pyproject.toml): ``from fakes import ...``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request

from infergate.errors import BackendUnavailable, ModelNotFound, RegistrationError
from infergate.observe.counters import ShadowCounters
from infergate.observe.monitor import Monitors
from infergate.serving.runtime import Prediction, Timings
from infergate.serving.tokenization import Batch
from infergate.versions import SPEC_FILE, ServedVersion

if TYPE_CHECKING:
    from infergate.protocols.frontend import Frontend
    from infergate.registry import RegisteredModel
    from infergate.serving.runtime import ModelRuntime
    from infergate.triton.fleet import TritonFleet

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def asgi(frontend: Frontend) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """``frontend`` as an ASGI app, for starlette's ``TestClient`` or httpx's transport.

    Ray Serve's ingress hands each request to the replica as a starlette ``Request``
    (``serve_app``) and sends back the ``Response`` it gets: so does this, without Ray."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await frontend.handle(Request(scope, receive))
        await response(scope, receive, send)

    return app


def answered(
    raw: np.ndarray,
    labels: Sequence[str] = (),
    *,
    tokens: int = 4,
    timings: Timings | None = None,
    first_truncated: bool = False,
) -> Prediction:
    """A version's answer ``raw`` to ``len(raw)`` texts of ``tokens`` tokens each, as the
    runtime hands it to telemetry and monitors (the first text cut if ``first_truncated``)."""
    n = len(raw)
    truncated = np.zeros(n, bool)
    truncated[:1] = first_truncated
    ids = np.zeros((n, 4), np.int64)
    batch = Batch(ids, np.ones_like(ids), np.full(n, tokens), np.zeros(n), truncated)
    return Prediction([], batch, raw, timings or Timings(), list(labels))


class FakeClock:
    """Stands in for ``time.monotonic`` (or ``time.time``) where code takes a ``clock``:
    calling it reads ``now``, which moves only when a test sets it or calls ``advance``.

    It starts at 1000 s rather than 0, so that an age measured from a forgotten zero
    default cannot pass by chance; a test that needs another start passes it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move ``seconds`` on; the new time."""
        self.now += seconds
        return self.now


def _model_version_status(model: str, version: str, status: int) -> object:
    return model, version, status


class Recorder:
    """Stands in for a replica's ``Telemetry`` (``infergate.observe.telemetry``) and its
    ``Monitors`` at once: it has every method of both, and keeps in order what each was
    told where the real ones publish it to Ray. A test reads exactly what the front-end
    reported, with nothing counted or aggregated on the way.

    ``requests`` holds ``keep(model, version, status)`` of each request, so that a test
    keeps the fields it is about (the status alone, say) and compares them whole."""

    def __init__(self, keep: Callable[[str, str, int], object] = _model_version_status) -> None:
        self.keep = keep
        self.requests: list[Any] = []
        self.predictions: list[Prediction | None] = []  # each request's, in order
        self.callers: list[tuple[str, str, int]] = []
        self.drifts: list[dict[tuple[str, str], float]] = []
        self.weights: list[tuple[str, str, str, float]] = []
        self.shadows: list[tuple[str, str, ShadowCounters]] = []
        self.monitored: list[int] = []

    def request(
        self, model: str, version: str, status: int, prediction: Prediction | None, total_s: float
    ) -> None:
        self.requests.append(self.keep(model, version, status))
        self.predictions.append(prediction)

    def caller(self, key: str, model: str, status: int) -> None:
        self.callers.append((key, model, status))

    def drift(self, model: str, version: str, scores: dict[tuple[str, str], float]) -> None:
        self.drifts.append(dict(scores))

    def weight(self, model: str, version: str, role: str, weight: float) -> None:
        self.weights.append((model, version, role, weight))

    def shadow(self, model: str, version: str, counters: ShadowCounters) -> None:
        self.shadows.append((model, version, replace(counters)))

    def flush(self) -> None:
        pass

    def record(
        self, runtime: ModelRuntime, status: int, seconds: float, prediction: Prediction | None
    ) -> None:
        self.monitored.append(status)


class FakeVersion:
    """Stands in for a loaded version, a ``ModelRuntime`` (``infergate.serving.runtime``), as
    the front-end and ``drain`` use it: its ``served`` version, the requests inside its
    ``predict`` (``in_flight``), and ``predict`` itself, which labels every text 'pos' at
    once, or fails with ``error``, or with ``stuck`` never answers, as when its Triton
    hangs. The front-end's handling around a version is what these tests check; running
    a version is covered with a real model in tests/served_locally.py.

    ``called`` is set once ``predict`` is; ``done`` answers the requests in flight. With
    ``calls_backend`` its ``predict`` calls the backend it is given first (no arrays), for
    the tests of what happens around that call."""

    def __init__(
        self,
        name: str = "m",
        *,
        error: Exception | None = None,
        stuck: bool = False,
        in_flight: int = 0,
        calls_backend: bool = False,
    ) -> None:
        self.served = ServedVersion(name, "1", "text-classification", "src", "champion", 100)
        self.calls_backend = calls_backend
        self.triton_model = self.served.triton_model
        self.error, self.stuck, self.in_flight = error, stuck, in_flight
        self.called = asyncio.Event()

    async def predict(
        self, texts: list[str], parameters: dict[str, Any], backend: object
    ) -> Prediction:
        self.called.set()
        self.in_flight += 1
        try:
            if self.stuck:
                await asyncio.Event().wait()
            if self.error is not None:
                raise self.error
            if self.calls_backend:
                await backend.infer(self.triton_model, None, None, "logits")  # type: ignore[attr-defined]
        finally:
            self.in_flight -= 1
        outputs = [{"label": "pos", "score": 1.0} for _ in texts]
        return Prediction(outputs, None, np.ones((len(texts), 2)), Timings(), [])  # type: ignore[arg-type]

    def done(self) -> None:
        self.in_flight = 0


Outputs = Callable[[str, np.ndarray, np.ndarray, str], np.ndarray]


class FakeTritonBackend:
    """Stands in for ``TritonBackend`` (``infergate.triton.client``), a replica's channel to
    Triton for inference. ``infer`` takes what the real one takes (a Triton model's name, a
    tokenized batch, the output to read) and returns that output for the batch, as Triton
    does; what the model computes is ``outputs``, chosen by each test so that it can check
    the answers by hand. Real models run in tests/onnx_backend.py and tests/e2e.

    It records the Triton models called. With ``error`` every call fails with it, as when
    Triton is away or sheds load; without ``outputs`` any call is a test's mistake."""

    def __init__(
        self,
        url: str = "",
        timeout_s: float = 30.0,
        *,
        outputs: Outputs | None = None,
        error: Exception | None = None,
    ) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.outputs, self.error = outputs, error
        self.calls: list[str] = []
        self.closed = False

    async def infer(
        self,
        model: str,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        output_name: str,
        *,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        self.calls.append(model)
        if self.error is not None:
            raise self.error
        if self.outputs is None:
            raise AssertionError(f"no inference expected, yet {model} was called")
        return self.outputs(model, input_ids, attention_mask, output_name)

    async def close(self) -> None:
        self.closed = True


class FakeTritonControl:
    """Stands in for ``TritonControl`` (``infergate.triton.client``), one Triton's control
    API, for tests of what the control plane asks of it; real Triton runs in tests/e2e.

    It records loads and unloads, and knows what is ready. Without ``native`` it refuses
    models on the native ONNX Runtime backend, as the nvidia-pytriton wheel's Triton does."""

    def __init__(self, url: str = "", native: bool = False) -> None:
        self.url, self.native = url, native
        self.loaded: list[str] = []
        self.requests: list[tuple[str, dict]] = []  # the config and files sent with each
        self.unloaded: list[str] = []
        self.ready: set[str] = set()
        self.closed = False
        self.up = True  # False: it does not answer
        self.asked = 0  # whether it answers (server_ready)
        self.refuse: str | None = None  # set: every load fails with this message

    def load(
        self,
        model: str,
        timeout_s: float,
        *,
        config: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        if not self.up:
            raise BackendUnavailable(f"Triton at {self.url} is not reachable")
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
        self.asked += 1
        return self.up

    def close(self) -> None:
        self.closed = True


class FakePods:
    """Fake Tritons (``FakeTritonControl``) behind a name, as a headless Service resolves
    it to pods: ``fleet`` drives them; ``addresses`` can change (pods come and go)."""

    def __init__(self, *addresses: str, native: bool = False) -> None:
        self.addresses = list(addresses)
        self.tritons: dict[str, FakeTritonControl] = {}
        self.native = native

    def connect(self, url: str) -> FakeTritonControl:
        self.tritons[url] = FakeTritonControl(url, self.native)
        return self.tritons[url]

    def fleet(self, repository: Path | None = None, **settings: Any) -> TritonFleet:
        from infergate.config import TritonSettings
        from infergate.triton.fleet import TritonFleet

        return TritonFleet(
            TritonSettings(external_host="triton-headless", **settings),
            repository,
            connect=self.connect,
            resolve=lambda host: self.addresses,
        )


class MemoryRegistry:
    """Stands in for ``Registry`` (``infergate.registry``), MLflow's model registry as the
    control plane uses it: models with their aliases and tags held in memory, changed at
    once as MLflow changes them, and every version's artifacts read from one folder,
    ``files``, as ``Registry.download`` would have fetched them. The real registry is
    covered in tests/e2e.

    A model's versions come from one run, ``run-1`` until it is registered again; a version
    has its model's task unless ``tasks`` says otherwise; version tags are kept by version.
    ``register`` (what ``infergate register`` calls) keeps each new version's files,
    copied under ``files``/name/version, and its run's metrics, params and tags in
    ``registered``.
    """

    def __init__(self, *models: RegisteredModel, files: Path | None = None) -> None:
        self._models = {m.name: m for m in models}
        self._runs = {m.name: "run-1" for m in models}
        self.tasks: dict[tuple[str, str], str] = {}  # versions of another task than their model
        self.version_tags: dict[tuple[str, str], dict[str, str]] = {}
        self.files = files
        self.registered: dict[tuple[str, str], dict[str, Any]] = {}

    def models(self) -> list[RegisteredModel]:
        return list(self._models.values())

    def model(self, name: str) -> RegisteredModel:
        if name not in self._models:
            raise ModelNotFound(f"model {name!r} is not in the registry")
        return self._models[name]

    def register(
        self,
        name: str,
        task: str,
        files: Path,
        *,
        metrics: Mapping[str, float],
        params: Mapping[str, str],
        tags: Mapping[str, str],
        alias: str | None = None,
    ) -> str:
        from infergate.registry import RegisteredModel

        if self.files is None:
            raise FileNotFoundError("this registry keeps no artifacts: give it a folder")
        model = self._models.setdefault(name, RegisteredModel(name, task, {}, {}))
        self._runs.setdefault(name, "run-1")
        version = str(1 + sum(1 for named, _ in self.registered if named == name))
        kept = shutil.copytree(files, self.files / name / version)
        self.registered[name, version] = {
            "files": kept, "metrics": dict(metrics), "params": dict(params), "tags": dict(tags)
        }  # fmt: skip
        if alias:
            model.aliases[alias] = version
        return version

    def version_source(self, name: str, version: str) -> str:
        return f"runs:/{self._runs[name]}/{name}/{version}"

    def version_task(self, name: str, version: str) -> str:
        return self.tasks.get((name, version), self._models[name].task)

    def register_again(self, model: RegisteredModel, run: str) -> None:
        """Delete ``model.name`` and register it again; its versions come from ``run``."""
        self._models[model.name], self._runs[model.name] = model, run

    def set_model_tags(self, name: str, tags: Mapping[str, str]) -> None:
        self._models[name].tags.update(tags)

    def delete_model_tags(self, name: str, keys: list[str]) -> None:
        for key in keys:
            self._models[name].tags.pop(key, None)

    def set_version_tags(self, name: str, version: str, tags: Mapping[str, str]) -> None:
        self.version_tags.setdefault((name, version), {}).update(tags)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._models[name].aliases[alias] = version

    def delete_alias(self, name: str, alias: str) -> None:
        self._models[name].aliases.pop(alias, None)

    def download(self, source: str, relative: str, dst: Path) -> Path:
        if self.files is None:
            raise FileNotFoundError(f"this registry holds no artifacts: {source}/{relative}")
        return self.files / relative

    def load_spec(self, source: str, cache: Path) -> dict[str, Any]:
        return json.loads(self.download(source, SPEC_FILE, cache).read_text())


class FakeResidentTriton:
    """Stands in for Triton with load on demand: ``infer`` on a model not in ``loaded``
    fails as Triton's NOT_FOUND does (``BackendUnavailable``); ``warm`` is the control
    plane's side as a replica calls it (``Warmer``'s ``warm``): it counts the calls,
    waits ``load_s`` and loads the model, or answers ``refuse`` (why not) instead."""

    def __init__(self, *loaded: str, load_s: float = 0.05, refuse: str | None = None) -> None:
        self.loaded = set(loaded)
        self.load_s, self.refuse = load_s, refuse
        self.warmed: list[str] = []
        self.calls: list[str] = []

    async def infer(self, model: str, *args: object, **kwargs: object) -> np.ndarray:
        from infergate.errors import BackendUnavailable

        self.calls.append(model)
        if model not in self.loaded:
            raise BackendUnavailable("The inference backend cannot serve this model right now")
        return np.ones((1, 2))

    async def warm(self, model: str, timeout_s: float) -> tuple[str | None, list[str]]:
        self.warmed.append(model)
        await asyncio.sleep(min(self.load_s, timeout_s))
        if self.load_s > timeout_s:
            return "still loading", []
        if self.refuse is None:
            self.loaded.add(model)
        return self.refuse, []


class Unmonitored(Monitors):
    """``Monitors`` that records nothing per version: for tests whose fake versions have
    no spec or tokenizer (``FakeVersion``) yet answer."""

    def record(self, *args: object, **kwargs: object) -> None:
        return None

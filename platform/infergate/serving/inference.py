"""The inference path of one traffic table, with no HTTP inside: which models are served,
who may call them, which version answers, the call to Triton, and what every call
records. Protocol handlers (``infergate.protocols``) read bodies and render answers; they
hand this plain values (a caller, a model name, texts, parameters) and get a prediction.

One ``InferencePath`` per traffic table: a replica builds a new one when its table
changes, and keeps the API keys (``Access``) across tables.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from infergate.errors import (
    BackendTimeout,
    BackendUnavailable,
    ClientClosedRequest,
    Forbidden,
    InfergateError,
    ModelNotFound,
    Overloaded,
    RateLimited,
)
from infergate.observe.monitor import Monitors
from infergate.observe.payloads import NO_PAYLOADS, Payload, PayloadLog
from infergate.observe.telemetry import NullTelemetry, Telemetry
from infergate.serving.access import Access, Caller
from infergate.serving.batching import Backend
from infergate.serving.mirror import Mirror
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime, Prediction
from infergate.serving.warming import Warmer

log = logging.getLogger(__name__)
READINESS_CACHE_S = 1.0
UNKNOWN_MODEL_LABEL = "_unknown"
# Status recorded for a request whose client went away before the answer (nginx's 499);
# no response is sent.
CLIENT_CLOSED_REQUEST = ClientClosedRequest.status
REFUSALS = (Forbidden.status, RateLimited.status)  # logged with the API key's id

Probe = Callable[[ModelRuntime], Awaitable[bool]]


@dataclass
class Call:
    """One inference call as its records see it: opened before the body is read (so a
    refused body is counted against the model), closed with the call's status."""

    path: InferencePath
    caller: Caller
    label: str
    start: float = field(default_factory=time.perf_counter)
    runtime: ModelRuntime | None = None
    prediction: Prediction | None = None
    texts: list[str] | None = None  # once the body is read

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def __enter__(self) -> Call:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error is None:
            status = 200
        elif isinstance(error, InfergateError):
            status = error.status
        elif isinstance(error, asyncio.CancelledError):
            status = CLIENT_CLOSED_REQUEST
        else:
            status = 500
        self.path.record(self, status)


class InferencePath:
    """The served models of one traffic table and the path every call takes through
    them. ``has_table`` False: the control plane's table has not arrived yet, so
    ``models`` is empty for now rather than for good. ``loading``: models of the table
    this replica cannot serve yet (it tries again); ``missing``: the versions of the
    table it could not load, as ``name vN``."""

    def __init__(
        self,
        backend: Backend,
        models: dict[str, ServedModel],
        *,
        access: Access | None = None,
        telemetry: Telemetry | None = None,
        monitors: Monitors | None = None,
        mirror: Mirror | None = None,
        payloads: PayloadLog | None = None,
        readiness_probe: Probe | None = None,
        has_table: bool = True,
        loading: frozenset[str] = frozenset(),
        missing: tuple[str, ...] = (),
        warmer: Warmer | None = None,
    ) -> None:
        self.backend = backend
        self.warmer = warmer or Warmer()
        self.models = models
        self.access = access or Access(None)
        self.telemetry = telemetry or NullTelemetry()
        self.monitors = monitors or Monitors(self.telemetry)
        self.payloads = payloads or (mirror.payloads if mirror is not None else NO_PAYLOADS)
        self.mirror = mirror or Mirror(
            lambda runtime: self.monitors.version_counters(runtime), payloads=self.payloads
        )
        self.has_table = has_table
        self.loading = loading
        self.missing = missing
        self._probe = readiness_probe or self.answers
        self._ready_at = 0.0

    # -- which model ----------------------------------------------------------------------

    def model(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None and not self.has_table:
            # A replica that has not received its traffic table yet: the model may well
            # be served a moment later, so this is no 404.
            raise BackendUnavailable("the front-end is still starting; retry shortly")
        if model is None and name in self.loading:
            raise BackendUnavailable(f"model {name!r} is still loading; retry shortly")
        if model is None:
            known = ", ".join(sorted(self.models)) or "none yet"
            raise ModelNotFound(f"model {name!r} is not served; served models: {known}")
        return model

    def model_for(self, caller: Caller, name: str) -> ServedModel:
        """The served model ``name``, if ``caller``'s API key may use it."""
        caller.check_model(name)
        return self.model(name)

    def visible(self, caller: Caller) -> list[ServedModel]:
        """The served models ``caller``'s API key may use."""
        key = caller.key
        return [m for m in self.models.values() if key is None or key.may_use(m.name)]

    def label(self, name: str | None) -> str:
        # Unknown names share one label value so a scan of made-up names cannot blow up
        # the metrics' cardinality.
        known = name is not None and (name in self.models or name in self.loading)
        return name if known and name is not None else UNKNOWN_MODEL_LABEL

    # -- one call -------------------------------------------------------------------------

    def call(self, caller: Caller, name: str | None) -> Call:
        """Open the records of one call to model ``name`` (None: the body will name it,
        then :meth:`named` relabels the call)."""
        return Call(self, caller, self.label(name))

    def named(self, call: Call, name: str | None) -> ServedModel:
        """The model a call's body names."""
        call.label = self.label(name)
        return self.model_for(call.caller, name or "")

    async def infer(
        self,
        call: Call,
        model: ServedModel,
        texts: list[str],
        parameters: dict[str, Any],
        *,
        routing_key: str | None = None,
        pinned: str | None = None,
        check: Callable[[ModelRuntime], None] | None = None,
    ) -> Prediction:
        """Admit the caller, pick the version (``pinned``, else by the traffic split and
        ``routing_key``), let ``check`` refuse it, and run it. A champion's answer may be
        mirrored to a canary in shadow (``Mirror``), which the caller never waits for."""
        call.texts = texts
        self.access.admit(call.caller, len(texts))
        call.runtime = model.pick(routing_key, pinned)
        if check is not None:
            check(call.runtime)
        call.prediction = await self._predict(call.runtime, texts, parameters)
        if pinned is None:
            self.mirror.offer(
                model, call.prediction, call.runtime, texts, parameters, self.backend,
                key_id=call.caller.id,
            )  # fmt: skip
        return call.prediction

    async def _predict(
        self, runtime: ModelRuntime, texts: list[str], parameters: dict[str, Any]
    ) -> Prediction:
        """Run ``runtime``; one that is not loaded in Triton (load on demand) is loaded
        first, or again when Triton turned out not to have it (unloaded meanwhile), and
        the answer says how long that took."""
        warmer = self.warmer
        if not warmer.enabled:
            return await runtime.predict(texts, parameters, self.backend)
        model = runtime.triton_model
        warmer.use(model)
        cold_s = 0.0
        if not warmer.is_loaded(model):
            cold_s = await warmer.load(model)
        try:
            prediction = await runtime.predict(texts, parameters, self.backend)
        except BackendTimeout:
            raise
        except BackendUnavailable:
            # Unloaded between the control plane's word and this call (idle, or evicted
            # while this request was on its way): load it again, once.
            cold_s += await warmer.load(model)
            prediction = await runtime.predict(texts, parameters, self.backend)
        return replace(prediction, cold_start_s=cold_s) if cold_s else prediction

    def record(self, call: Call, status: int) -> None:
        """What every call leaves behind: its metrics, the key's, (for a call a version
        answered, or failed) the canary's counters, and maybe a payload log record."""
        seconds = call.elapsed_s()
        runtime = call.runtime
        served_version = runtime.served.version if runtime is not None else ""
        self.telemetry.request(call.label, served_version, status, call.prediction, seconds)
        caller = call.caller
        if caller.key is not None:
            self.telemetry.caller(caller.id, call.label, status)
            if status in REFUSALS:  # the key's id, never the key (rate-limited: replica_logs)
                log.info("key %s refused on model %s: %s", caller.id, call.label, status)
        # A request shed for load was never the version's to answer: the canary's
        # analysis must not count it, as an error or as a (short) latency.
        if runtime is not None and status != Overloaded.status:
            # A 499 is no error of the version's, but its wait is a latency of at least
            # ``seconds``: a canary that hangs until clients give up still gets judged.
            self.monitors.record(runtime, status, seconds, call.prediction)
        served = runtime.served if runtime is not None else None
        if self.payloads.wants(served.role if served is not None else ""):
            # What there is: a body that failed parsing left no texts, and no version.
            self.payloads.add(
                Payload(
                    self.payloads.clock(), served.name if served else call.label,
                    served_version, served.role if served else "", call.texts,
                    call.prediction.outputs if call.prediction is not None else None,
                    seconds * 1000, status, caller.id,
                )
            )  # fmt: skip

    # -- readiness ------------------------------------------------------------------------

    async def ready(self) -> list[str]:
        """The served models' names, once every served version answers (cached for
        ``READINESS_CACHE_S``); raises ``BackendUnavailable`` naming what does not."""
        runtimes = [r for m in self.models.values() for r in m.versions]
        if not runtimes:
            raise BackendUnavailable("no model is served yet")
        # Versions out of Triton until asked for are served but not probed: ready means
        # every version that is loaded answers.
        runtimes = [r for r in runtimes if self.warmer.is_loaded(r.triton_model)]
        if self.missing:
            raise BackendUnavailable(f"not ready: not loaded yet: {', '.join(self.missing)}")
        now = time.monotonic()
        if now - self._ready_at > READINESS_CACHE_S:
            answers = await asyncio.gather(*(self._probe(r) for r in runtimes))
            failing = [r.triton_model for r, ok in zip(runtimes, answers, strict=True) if not ok]
            if failing and self.warmer.enabled:  # unloaded since the last word: not failing
                failing = [m for m in failing if self.warmer.is_loaded(m)]
            if failing:
                raise BackendUnavailable(f"not ready: {', '.join(failing)}")
            self._ready_at = now
        return sorted(self.models)

    async def model_ready(self, model: ServedModel, version: str | None) -> None:
        """Raises unless the version named, or every version of ``model``, answers.

        A version out of Triton that loads on demand is ready without a probe: its next
        request loads it and is answered (after a cold start), and a probe would either
        fail or load it, evicting another, for a health check."""
        runtimes = (model.pick(pinned=version),) if version is not None else model.versions
        loaded = [r for r in runtimes if self.warmer.is_loaded(r.triton_model)]
        answers = await asyncio.gather(*(self._probe(r) for r in loaded))
        failing = [
            r.served.version
            for r, ok in zip(loaded, answers, strict=True)
            # Unloaded while probed (the control plane's word came meanwhile): not failing.
            if not ok and self.warmer.is_loaded(r.triton_model)
        ]
        if failing:
            raise BackendUnavailable(f"model {model.name!r} is not ready: version(s) {failing}")

    async def answers(self, runtime: ModelRuntime) -> bool:
        """Ready means loaded in Triton and answering a real request."""
        try:
            probe = dict(runtime.task.probe_parameters)
            await runtime.predict(["readiness probe"], probe, self.backend)
        except InfergateError:
            return False
        return True

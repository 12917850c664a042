"""The Tritons the control plane keeps served versions loaded in.

Its own Triton on this machine, or one it did not start: every address the configured
host resolves to (a Kubernetes headless Service's pods) is a Triton of its own. Without
a budget of loaded versions each gets every load and unload; with one, the control
plane names the Triton (``only``). A version reaches a Triton through a repository folder both can
read, or, where there is none (another machine, an empty pod), with the load request
itself: Triton's repository API takes the model's config and files along
(``ModelFiles.load_request``).

``missing`` asks each Triton whether it has ready what it should hold, so a Triton that
restarted empty, or a new pod, is found and loaded again by the next reconcile.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Protocol

from onnx import TensorProto, helper

from infergate.config import TritonSettings
from infergate.errors import BackendUnavailable, InfergateError, RegistrationError
from infergate.triton.client import TritonControl
from infergate.triton.repository import ModelFiles, remove_model, write_files

log = logging.getLogger(__name__)
PROBE_MODEL = "infergate_backend_probe"


class Control(Protocol):
    """What the fleet asks of one Triton (``TritonControl``)."""

    def load(
        self,
        model: str,
        timeout_s: float,
        *,
        config: str | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None: ...

    def unload(self, model: str, timeout_s: float = 30.0) -> None: ...

    def is_ready(self, model: str) -> bool: ...

    def server_ready(self) -> bool: ...

    def close(self) -> None: ...


def resolve(host: str) -> list[str]:
    """Every address ``host`` resolves to now (an address resolves to itself): its IPv4
    ones, or its IPv6 ones when it has no IPv4 (``localhost`` has both, one Triton).

    Raises:
        BackendUnavailable: the name cannot be looked up now (DNS not answering); that is
            not "no Triton", which a name without addresses is.
    """
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []  # a headless Service with no ready pod has no address
        raise BackendUnavailable(f"cannot look up Triton's host {host!r} now: {exc}") from exc
    v4 = {str(i[4][0]) for i in infos if i[0] == socket.AF_INET}
    v6 = {str(i[4][0]) for i in infos if i[0] == socket.AF_INET6}
    return sorted(v4 or v6)


def _url(address: str, port: int) -> str:
    ip = ipaddress.ip_address(address)
    return f"[{address}]:{port}" if ip.version == 6 else f"{address}:{port}"


class TritonFleet:
    """Loads and unloads served versions on every Triton of ``settings``.

    ``repository``: a model repository folder every Triton reads, or None to send each
    version's files with its load. ``connect`` opens a control client for a ``host:port``;
    ``resolve`` turns the host into addresses."""

    def __init__(
        self,
        settings: TritonSettings,
        repository: Path | None,
        *,
        connect: Callable[[str], Control] = TritonControl,
        resolve: Callable[[str], list[str]] = resolve,
    ) -> None:
        self.settings = settings
        self.repository = repository
        self._connect = connect
        self._resolve = resolve
        self._controls: dict[str, Control] = {}
        self._lock = threading.Lock()
        self._backend: str | None = None if settings.backend == "auto" else settings.backend

    def endpoints(self) -> dict[str, Control]:
        """A control client per Triton the host resolves to now, by ``host:port``."""
        addresses = self._resolve(self.settings.host)
        urls = {_url(address, self.settings.grpc_port) for address in addresses}
        # The supervisor's check and a reconcile (under the control plane's lock, from any
        # thread) may both get here.
        with self._lock:
            for url in sorted(set(self._controls) - urls):  # a pod that went away
                self._controls.pop(url).close()
            for url in sorted(urls - set(self._controls)):
                self._controls[url] = self._connect(url)
            return dict(sorted(self._controls.items()))

    def ready(self) -> bool:
        """At least one Triton answers, and all that resolve do."""
        try:
            endpoints = self.endpoints()
        except BackendUnavailable:  # its name cannot be looked up yet
            return False
        return bool(endpoints) and all(c.server_ready() for c in endpoints.values())

    # -- loading ------------------------------------------------------------------------

    def model_settings(self) -> TritonSettings:
        """The settings a model config is built with: ``auto`` resolved to the backend the
        Tritons can load."""
        if self._backend is None:
            self._backend = self._probe_backend()
            log.info("Triton runs versions on its %s backend", self._backend)
        return self.settings.model_copy(update={"backend": self._backend})

    def load(self, model: ModelFiles, only: Iterable[str] | None = None) -> None:
        """Load ``model`` into every Triton (or the ``only`` ones, by ``host:port``).

        Raises:
            BackendUnavailable: no Triton resolves, or one is not reachable.
            RegistrationError: a Triton could not load it.
        """
        endpoints = self.endpoints()
        if not endpoints:
            raise BackendUnavailable(f"no Triton answers at {self.settings.host}")
        targets = endpoints if only is None else {u: endpoints[u] for u in only if u in endpoints}
        if not targets:
            raise BackendUnavailable(f"no Triton of {sorted(only or [])} resolves now")
        if self.repository is not None:
            write_files(self.repository, model)
            request: dict[str, object] = {}
        else:
            config, files = model.load_request()
            request = {"config": config, "files": files}
        done: list[str] = []
        try:
            for url, control in targets.items():
                control.load(model.name, self.settings.load_timeout_s, **request)  # type: ignore[arg-type]
                done.append(url)
                log.info("loaded %s into Triton at %s", model.name, url)
        except InfergateError:
            if only is None:  # a version new to the fleet: none of it may stay behind
                self._unload_from(model.name, {u: endpoints[u] for u in done})
            raise

    def _unload_from(self, model: str, controls: dict[str, Control]) -> None:
        for url, control in controls.items():
            try:
                control.unload(model)
            except InfergateError as exc:
                log.warning("could not unload %s from Triton at %s: %s", model, url, exc)

    def unload(self, model: str, only: Iterable[str] | None = None) -> None:
        """Unload ``model`` from every Triton that answers (or the ``only`` ones); one
        that does not has lost it anyway if it restarts, and keeps it otherwise
        (harmless, but said). Its files leave the shared repository when it is unloaded
        from every Triton at once."""
        endpoints = self.endpoints()
        targets = endpoints if only is None else {u: endpoints[u] for u in only if u in endpoints}
        self._unload_from(model, targets)
        if self.repository is not None and targets.keys() >= endpoints.keys():
            remove_model(self.repository, model)

    def drop_files(self, model: str) -> None:
        """Remove ``model``'s files from the shared repository (no Triton holds it)."""
        if self.repository is not None:
            remove_model(self.repository, model)

    def missing(
        self, holds: Callable[[str], Iterable[str]], answering: Collection[str] | None = None
    ) -> dict[str, list[str]]:
        """The versions some Triton that answers should hold (``holds(host_port)``) and
        has not ready (it restarted empty, or is a new pod), with those Tritons; those
        that answer are ``answering`` when the caller has just asked (None: asked here).
        Asked model by model: a model loaded with its files in the request is in no
        repository index."""
        lacking: dict[str, list[str]] = {}
        for url, control in self.endpoints().items():
            wanted = sorted(set(holds(url)))
            if not wanted:
                continue
            answers = control.server_ready() if answering is None else url in answering
            if not answers:  # away: nothing to load it into
                continue
            for model in wanted:
                if not control.is_ready(model):
                    lacking.setdefault(model, []).append(url)
        return lacking

    def _probe_backend(self) -> str:
        """``onnxruntime`` if the first Triton loads an ONNX model on its native backend,
        else ``python`` (the nvidia-pytriton wheel has only that one)."""
        endpoints = self.endpoints()
        if not endpoints:
            raise BackendUnavailable(f"no Triton answers at {self.settings.host}")
        control = next(iter(endpoints.values()))
        config, files = _probe_request()
        try:
            control.load(PROBE_MODEL, self.settings.load_timeout_s, config=config, files=files)
        except RegistrationError as exc:  # refused; an unreachable Triton raises on, uncached
            log.info("Triton has no native ONNX Runtime backend: %s", exc)
            return "python"
        control.unload(PROBE_MODEL)
        return "onnxruntime"

    def close(self) -> None:
        with self._lock:
            for control in self._controls.values():
                control.close()
            self._controls.clear()


def _probe_request() -> tuple[str, dict[str, bytes]]:
    """A one-node ONNX model (Identity on int64) for the native ONNX Runtime backend."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [-1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [-1, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by every ONNX Runtime Triton ships
    config = {
        "name": PROBE_MODEL,
        "platform": "onnxruntime_onnx",
        "max_batch_size": 0,
        "input": [{"name": "x", "data_type": "TYPE_INT64", "dims": [-1, 1]}],
        "output": [{"name": "y", "data_type": "TYPE_INT64", "dims": [-1, 1]}],
    }
    return json.dumps(config), {"file:1/model.onnx": model.SerializeToString()}

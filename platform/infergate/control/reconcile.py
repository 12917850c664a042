"""Converges what runs on what the registry says.

Reads the versions to serve from MLflow, makes sure every Triton has each loaded
(explicit model control: no restarts; ``infergate.triton.fleet``), hands the front-end
its new traffic table, then unloads versions nothing references any more. A Triton that
lost a version it served (it restarted empty, or is a new pod) gets it again. A version that
Triton cannot load, or whose files the front-end replicas could not read, never receives
traffic; a new champion that fails leaves its model on the champion it had. A new
version that meets a fault of the place rather than of its files (Triton away, the
artifact cache's disk full) is held back without being judged, and tried again at every
check until it loads.

With a budget of loaded versions or idle unloads (``infergate.control.residency``) a
version that is served need not be loaded: a new version is still loaded once (so a
version Triton cannot load never gets traffic), after the least recently used ones made
room, and may be unloaded later; ``load_on_demand`` loads it again when a request asks.
With several Tritons the budget holds per Triton: such a version is loaded on one of
them (``Placement.choose``), and the replicas are told which (``placement``). A Triton
met for the first time (this control plane restarted, or a pod came back under its
address) is taken in with what it already holds, up to its budget.
Triton's loads and unloads, and the residency's record of them, happen under
``residency_lock``, never under a reconcile's wait for the replicas.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from infergate import tasks
from infergate.control.load_failures import of_the_place, reason_of
from infergate.control.residency import Placement, protected
from infergate.errors import ModelNotFound, RegistrationError
from infergate.registry import Registry
from infergate.serving.loader import load_version
from infergate.triton.fleet import Control, TritonFleet
from infergate.triton.repository import ModelFiles, model_files, translation_files
from infergate.versions import (
    CHAMPION,
    CT2_DIR,
    ONNX_FILE,
    ServedVersion,
    triton_model_name,
    version_cache,
)

log = logging.getLogger(__name__)


@dataclass
class ReconcileResult:
    served: list[ServedVersion] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    held_back: set[str] = field(default_factory=set)  # of ``failed``: tried again, not judged


class ControlPlane:
    def __init__(
        self,
        registry: Registry,
        fleet: TritonFleet,
        cache_dir: Path,
        deploy: Callable[[list[ServedVersion]], None],
        desired: Callable[[], list[ServedVersion]],
        on_load_failure: Callable[[ServedVersion, str], None] = lambda version, reason: None,
        residency: Placement | None = None,
        on_residency: Callable[[str, str, float], None] = lambda model, event, seconds: None,
    ) -> None:
        """``residency``: the budget of loaded versions (none by default: every served
        version stays loaded); ``on_residency(model, event, seconds)`` hears of each
        ``"demand"`` load (with its seconds) and each ``"room"`` or ``"idle"`` unload,
        for the metrics."""
        self.registry = registry
        self.desired = desired
        self.on_load_failure = on_load_failure
        self.fleet = fleet
        self.cache_dir = cache_dir
        self.deploy = deploy
        self.serving: dict[str, ServedVersion] = {}
        self.held_back: set[str] = set()  # new versions waiting on Triton or the disk
        self._deployed = False
        self.residency = residency or Placement(clock=time.monotonic)
        self.on_residency = on_residency
        self.residency_lock = threading.RLock()
        self.busy: set[str] = set()  # Triton models with requests in flight at a replica
        self.down: set[str] = set()  # Tritons that resolved but did not answer, last look
        self._files: dict[str, ModelFiles] = {}  # what reloads a version unloaded

    def lacking(self) -> dict[str, list[str]]:
        """Versions some Triton should hold and has not ready, with those Tritons (by
        address). Without a budget every Triton holds every served version (a new pod
        gets them all), or with idle unloads every loaded one; with a budget, each holds
        what was loaded into it."""
        if not self.residency.managed:
            return self.fleet.missing(lambda triton: self.serving)
        served = set(self.serving)
        with self.residency_lock:
            # Before the first table nothing is served yet: no Triton is taken in empty.
            answering = self._answering(served if self._deployed else None)
            if self.residency.placed:
                holds = {t: self.residency.holds(t) & served for t in answering}
            else:
                everywhere = set(self.residency.loaded) & served
                holds = {t: everywhere for t in answering}
        return self.fleet.missing(lambda triton: holds.get(triton, ()), answering)

    def placement(self) -> dict[str, list[str]]:
        """Each loaded version and the Tritons (``host:port``) that hold it and answered
        at the last look; no address when there is one Triton (the replicas' own
        setting reaches it, and may name it otherwise than this machine does)."""
        with self.residency_lock:
            loaded = self.residency.loaded
            if len(self.residency.tritons) <= 1:
                return {model: [] for model in loaded}
            return {m: [t for t in held if t not in self.down] for m, held in loaded.items()}

    def _answering(self, models: set[str] | None) -> list[str]:
        """The Tritons that answer now; those that resolve and do not are noted in
        ``down``. With a budget, a Triton answering for the first time is taken in with
        what it already holds of ``models`` (None: not yet, it stays unknown)."""
        tritons = self.fleet.endpoints()
        self.residency.keep(tritons)
        answering = [url for url, control in tritons.items() if control.server_ready()]
        self.down = set(tritons) - set(answering)
        if self.residency.placed and models is not None:
            for url in answering:
                if url not in self.residency.tritons:
                    self._take_in(url, tritons[url], models)
        return answering

    def _take_in(self, triton: str, control: Control, models: set[str]) -> None:
        """Record what of ``models`` ``triton`` holds already, up to the budget; unload the
        rest from it (a control plane that restarted would not know of them)."""
        held = [model for model in sorted(models) if control.is_ready(model)]
        self.residency.of(triton)  # known from now on, even empty
        budget = self.residency.budget or len(held)
        for model in held[:budget]:
            self.residency.did_load(model, [triton])
        for model in held[budget:]:
            log.info("unloading %s from the Triton at %s: over its budget", model, triton)
            self.fleet.unload(model, only=[triton])
        if held:
            log.info("the Triton at %s holds %s already", triton, held[:budget])

    def reconcile(self) -> ReconcileResult:
        result = ReconcileResult()
        desired = self.desired()
        wanted = {triton_model_name(v.name, v.version) for v in desired}
        replaced = self._replaced(desired)
        if replaced:
            self._withdraw(replaced)
        lacking = self.lacking()
        for version in desired:
            model = triton_model_name(version.name, version.version)
            new = model not in self.serving or model in replaced
            if new or model in lacking:
                loaded = False
                try:
                    with self.residency_lock:
                        if new:  # a version to be judged is loaded, within the budget
                            where = self._make_room(model, desired)
                        else:
                            where = self._still_held(model, lacking[model])
                        if where is None or where:
                            self._load(version, model, only=where)
                            self._did_load(model, where)
                            loaded = True
                except Exception as exc:
                    if new and of_the_place(exc):
                        # Not the version at fault: it waits off the table and the next
                        # reconcile (every check wakes one while it waits) loads it.
                        self._held_back(version, reason_of(exc), wanted, result)
                        continue
                    if new:  # any other failure keeps a new version away from traffic
                        self._failed(version, reason_of(exc), wanted, result)
                        continue
                    # A Triton that lost a served version did not take it back: the others
                    # still serve it, and the next check tries that one again.
                    log.error("reloading %s into %s failed: %s", model, lacking[model], exc)
                    result.failed[model] = reason_of(exc)
                else:
                    if loaded:
                        result.loaded.append(model)
            result.served.append(version)
        result.served = _rebalance(result.served)
        new_serving = {triton_model_name(v.name, v.version): v for v in result.served}
        if new_serving != self.serving or not self._deployed:
            self.deploy(result.served)
            self._deployed = True
        with self.residency_lock:
            for model in sorted(set(self.serving) - set(new_serving)):
                self.fleet.unload(model)
                self.residency.forget(model)
                self._files.pop(model, None)
                result.unloaded.append(model)
            self.serving = new_serving
        self.held_back = set(result.held_back)
        return result

    def _replaced(self, desired: list[ServedVersion]) -> set[str]:
        """The Triton models served until now whose version now comes from other files:
        deleted and registered again under the same name and number."""
        replaced = set()
        for version in desired:
            model = triton_model_name(version.name, version.version)
            known = self.serving.get(model)
            if known is not None and known.source != version.source:
                replaced.add(model)
        return replaced

    def _withdraw(self, replaced: set[str]) -> None:
        """Have the replicas let go of ``replaced`` before Triton reloads them in place.

        Their Triton models keep their names; until the new files are in, replicas would
        send ids from the first files' tokenizer to the new graph (and label its scores
        with the first files' labels), so a table marking those versions ``reloading``
        must be in force, which ``deploy`` waits for, before Triton swaps the files.
        Meanwhile a reloading canary's share goes to its champion, and a model whose
        champion reloads answers 503 (retry shortly), as when a replica cannot load it.
        """
        log.info("%s registered again: off the table while Triton reloads", sorted(replaced))
        self.deploy([replace(v, reloading=m in replaced) for m, v in self.serving.items()])

    def _failed(
        self, version: ServedVersion, reason: str, wanted: set[str], result: ReconcileResult
    ) -> None:
        """Keep ``version`` away from traffic; a new champion's goes to the champion so far."""
        log.error("version %s v%s not served: %s", version.name, version.version, reason)
        result.failed[triton_model_name(version.name, version.version)] = reason
        self.on_load_failure(version, reason)
        fallback = self._fallback(version, wanted)
        if fallback is not None:
            result.served.append(fallback)

    def _held_back(
        self, version: ServedVersion, reason: str, wanted: set[str], result: ReconcileResult
    ) -> None:
        """Keep ``version`` off the table for now, without judging it: no rollback."""
        log.warning("version %s v%s waits: %s", version.name, version.version, reason)
        model = triton_model_name(version.name, version.version)
        result.failed[model] = reason
        result.held_back.add(model)
        fallback = self._fallback(version, wanted)
        if fallback is not None:
            result.served.append(fallback)

    def _fallback(self, failed: ServedVersion, wanted: set[str]) -> ServedVersion | None:
        """What takes the traffic of a new champion that could not be loaded: the champion
        served until now, unless the registry wants that version in another role."""
        if failed.role != CHAMPION:
            return None
        for model, version in self.serving.items():
            if version.name == failed.name and version.role == CHAMPION and model not in wanted:
                log.error("%s stays on version %s", failed.name, version.version)
                return replace(version, weight=failed.weight)
        return None

    def _load(self, version: ServedVersion, model: str, only: list[str] | None) -> None:
        """Load ``version`` into every Triton, or the ``only`` ones (by address)."""
        try:
            # What every front-end replica loads, read here first: a version they could not
            # load must not reach their table (its model would answer 503 until it left).
            spec = load_version(version, self.registry, self.cache_dir).spec
        except Exception as exc:
            raise RegistrationError(
                "its tokenizer, serving spec or drift reference cannot be read: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if spec.task != version.task:  # registered by hand, or before register refused it
            raise RegistrationError(
                f"it is a {spec.task} model; {version.name} serves {version.task}"
            )
        cache = version_cache(self.cache_dir, version)
        if tasks.get(spec.task).engine == tasks.CTRANSLATE2:
            ct2_dir = self.registry.download(version.source, CT2_DIR, cache)
            files = translation_files(
                model, ct2_dir, precision=spec.precision,
                max_decoding_length=spec.max_decoding_length,
                settings=self.fleet.model_settings(),
            )  # fmt: skip
            self._files[model] = files
            self.fleet.load(files, only=only)
            return
        onnx_path = self.registry.download(version.source, ONNX_FILE, cache)
        files = model_files(
            model,
            onnx_path,
            output_name=spec.output_name,
            output_dim=spec.output_dim,
            settings=self.fleet.model_settings(),
        )
        self._files[model] = files
        self.fleet.load(files, only=only)

    # -- load on demand ------------------------------------------------------------------

    def load_on_demand(self, model: str) -> float:
        """Load served Triton model ``model`` for a request that asked for it, after
        unloading the least recently used versions to make room; the seconds its load
        took (0 when it was loaded already).

        Raises:
            NoRoom: every version that would have to go is busy or protected.
            ModelNotFound: ``model`` is not served (any more).
            InfergateError: Triton could not load it.
        """
        with self.residency_lock:
            version = self.serving.get(model)
            if version is None:
                raise ModelNotFound(f"{model} is not served")
            self.residency.used([model])
            held = self.residency.holders(model)
            if held and (not self.residency.placed or set(held) - self.down):
                return 0.0  # with a budget, only where a Triton that holds it answers
            start = time.perf_counter()
            where = self._make_room(model, list(self.serving.values()))
            files = self._files.get(model)
            if files is None:
                self._load(version, model, only=where)
            else:
                self.fleet.load(files, only=where)
            self._did_load(model, where)
            seconds = time.perf_counter() - start
        log.info("loaded %s on demand in %.2f s, making room included", model, seconds)
        self.on_residency(model, "demand", seconds)
        return seconds

    def note_usage(self, ages: dict[str, float], busy: set[str]) -> None:
        """What the replicas reported: seconds since each model was used, and the
        models with requests in flight."""
        with self.residency_lock:
            self.residency.seen(ages)
            self.busy = busy

    def fullest(self) -> int:
        """The most versions one Triton holds."""
        with self.residency_lock:
            return self.residency.fullest

    def unload_idle(self) -> list[str]:
        """Unload the versions unused for ``triton.idle_unload_s``; those unloaded."""
        with self.residency_lock:
            idle = self.residency.idle(busy=self.busy, protected=protected(self.serving.values()))
            for triton, model in idle:
                self._unload(model, triton, "idle")
        return [model for _triton, model in idle]

    def _make_room(self, model: str, served: list[ServedVersion]) -> list[str] | None:
        """Where to load ``model``, room made there: every Triton (None) without a budget;
        else the answering Tritons that hold it (a version registered again is reloaded
        in place), or the one ``Placement.choose`` picks among those answering."""
        if not self.residency.placed:
            return None
        models = {triton_model_name(v.name, v.version) for v in served} | set(self.serving)
        answering = self._answering(models)
        held = [triton for triton in self.residency.holders(model) if triton in answering]
        if held:
            return held
        guarded = protected([*served, *self.serving.values()])
        triton, victims = self.residency.choose(model, answering, busy=self.busy, protected=guarded)
        for victim in victims:
            self._unload(victim, triton, "room")
        return [triton]

    def _still_held(self, model: str, lacking: list[str]) -> list[str]:
        """Of the Tritons ``lacking`` ``model``, those that should still hold it: with a
        budget, ``lacking`` may have looked while it was being unloaded (room, idle)."""
        if not self.residency.managed:
            return lacking
        held = self.residency.holders(model)
        if not self.residency.placed:  # idle unloads alone: all hold what is loaded
            return lacking if held else []
        return [triton for triton in lacking if triton in held]

    def _did_load(self, model: str, where: list[str] | None) -> None:
        self.residency.did_load(model, self.fleet.endpoints() if where is None else where)

    def _unload(self, model: str, triton: str, why: str) -> None:
        log.info("unloading %s from the Triton at %s (%s)", model, triton, why)
        self.fleet.unload(model, only=[triton])
        self.residency.did_unload(model, triton)
        if not self.residency.holders(model):  # its files go from a shared repository
            self.fleet.drop_files(model)
        self.on_residency(model, why, 0.0)


def _rebalance(served: list[ServedVersion]) -> list[ServedVersion]:
    """A model whose other version failed to load gives all traffic to what remains."""
    counts: dict[str, int] = {}
    for version in served:
        counts[version.name] = counts.get(version.name, 0) + 1
    return [
        replace(v, weight=100) if counts[v.name] == 1 and v.weight != 100 else v for v in served
    ]

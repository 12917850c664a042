"""The control plane of a running stack, wired together.

``ControlService`` holds the rollouts (``rollouts``), the reconcile against Triton
(``reconcile``), the admin API with the MLflow webhook (``admin``), and the way traffic
tables reach the front-end replicas (the ``ControlState`` actor). The supervisor
(``infergate.stack.supervisor``) starts it once Triton and Ray run, calls ``run_due`` from its
watch loop, and tells it when Triton came back empty.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infergate.config import StackConfig
from infergate.control.admin import AdminApi, AdminServer, check_exposure
from infergate.control.on_demand import OnDemandLoader
from infergate.control.reconcile import ControlPlane
from infergate.control.residency import Placement
from infergate.control.rollouts import Rollouts
from infergate.control.webhooks import register_webhook
from infergate.control.windows import StepWindows
from infergate.observe.counters import VersionCounters, merge_reports
from infergate.observe.metrics import ROLLOUT_DECISIONS, SHADOW_TESTS
from infergate.registry import Registry
from infergate.stack.processes import wait_until
from infergate.triton.fleet import TritonFleet
from infergate.versions import CANARY, ServedVersion

log = logging.getLogger(__name__)
ADOPTION_TIMEOUT_S = 30.0  # for every front-end replica to run a new traffic table


def triton_repository(config: StackConfig) -> Path | None:
    """The model repository folder the control plane writes versions to: the stack's own
    Triton's, a folder an external Triton shares, or none (files travel with each load)."""
    if config.triton.external_host is None:
        return config.state_dir / "triton-repository"
    return config.triton.repository_dir


class ControlService:
    """Rollouts, reconcile and the admin API of one stack; safe from any thread."""

    def __init__(
        self,
        config: StackConfig,
        registry: Registry,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.registry = registry
        self._clock = clock
        # Held by every reconcile, rollout command and analysis round, and by the
        # supervisor while it starts a component again.
        self.lock = threading.RLock()
        self._wake = threading.Event()  # set by webhooks: reconcile now
        self._app_deployed = config.serve.external  # KubeRay deploys it there
        self._decisions: Any = None
        self._shadow_tests: Any = None
        self._published: tuple[str, list[ServedVersion]] | None = None  # epoch, table
        self.rollouts = Rollouts(
            registry,
            self._stats,
            on_decision=self._count_decision,
            windows=StepWindows(config.state_dir / "rollout-windows.json"),
        )
        self.fleet = TritonFleet(config.triton, triton_repository(config))
        self.plane = ControlPlane(
            registry,
            self.fleet,
            config.state_dir / "artifacts",
            deploy=self._deploy,
            desired=self.rollouts.desired,
            on_load_failure=self._load_failed,
            residency=Placement(config.triton.budget, config.triton.idle_unload_s, clock),
        )
        self.admin: AdminServer | None = None
        self.on_demand: OnDemandLoader | None = None
        now = clock()
        self._next_reconcile = now + config.reconcile_interval_s
        self._next_analysis = now + config.admin.analysis_interval_s
        self._next_check = now + config.triton.check_interval_s

    @functools.cached_property
    def _link(self) -> Any:
        """The link to the ``ControlState`` actor, once Ray runs (this object is built
        without it); the control plane creates the actor where its settings say."""
        from infergate.control.state import ControlStateLink

        return ControlStateLink(create=True, labels=self.config.serve.control_actor_labels)

    @property
    def _state(self) -> Any:
        """The ``ControlState`` actor (created again if it was gone for good)."""
        return self._link.actor()

    def _ask(self, method: str, *args: Any, timeout_s: float = 10.0) -> Any:
        """Call ``method`` of the ``ControlState`` actor and wait for its answer."""
        import ray

        try:
            return ray.get(getattr(self._state, method).remote(*args), timeout=timeout_s)
        except Exception as error:
            self._link.failed(error)
            raise

    def start(self) -> None:
        """Serve the admin API; point the registry's webhook at it."""
        a = self.config.admin
        check_exposure(a)
        secret = a.webhook_secret or secrets.token_urlsafe(32)
        api = AdminApi(
            self.rollouts,
            self.reconcile,
            token=a.token,
            webhook_secret=secret,
            lock=self.lock,
            request_reconcile=self._wake.set,
            deliveries=self.config.state_dir / "webhook-deliveries.log",
        )
        self.admin = AdminServer(api.app, a.host, a.port)
        self.admin.start()
        if self.config.triton.loads_on_demand:
            self.on_demand = OnDemandLoader(self.plane, self._link)
            self.plane.on_residency = self.on_demand.on_residency
            self.on_demand.start()
        if a.webhooks:
            register_webhook(self.registry, f"{a.url}/admin/webhooks/mlflow", secret)

    def stop(self) -> None:
        if self.on_demand is not None:
            self.on_demand.stop()
            self.on_demand = None
        if self.admin is not None:
            self.admin.stop()
            self.admin = None
        self.fleet.close()

    @property
    def serving(self) -> dict[str, ServedVersion]:
        """What the front-end serves now, by Triton model name."""
        return self.plane.serving

    # -- converging ----------------------------------------------------------------------

    def reconcile(self) -> None:
        """Converge on the registry; safe from any thread (webhooks, commands, the loop)."""
        with self.lock:
            result = self.plane.reconcile()
        for model, reason in result.failed.items():
            log.error("%s could not be loaded: %s", model, reason)

    def run_due(self) -> None:
        """Analyse rollouts and reconcile when their intervals are up (or a webhook asked
        for a reconcile). A round that fails (the registry briefly away) is tried again
        at the next interval."""
        now = self._clock()
        try:
            self._publish_again_if_restarted()
            if now >= self._next_analysis:
                self._next_analysis = now + self.config.admin.analysis_interval_s
                with self.lock:
                    decisions = self.rollouts.tick()
                self._publish_shadow_tests()
                if decisions:
                    self.reconcile()
            if now >= self._next_check:
                self._next_check = now + self.config.triton.check_interval_s
                # A Triton restarted empty or a new one came; or a new version waits for
                # Triton or for room in the artifact cache.
                if self.plane.held_back or self.plane.lacking():
                    self._wake.set()
            if now >= self._next_reconcile or self._wake.is_set():
                self._wake.clear()
                self._next_reconcile = now + self.config.reconcile_interval_s
                self.reconcile()
        except Exception:
            log.exception("control loop round failed")

    def wait(self, timeout_s: float) -> None:
        """Until ``timeout_s`` passed or a webhook asked for a reconcile."""
        self._wake.wait(timeout_s)

    def triton_restarted(self) -> None:
        """The stack's own Triton came back empty: load every served version again now,
        rather than at the next check. A reconcile that fails (the registry away) is no
        reason to stop the stack: the check finds the versions missing and tries again."""
        try:
            self.reconcile()
        except Exception:
            log.exception("reconciling after Triton started again failed; retrying later")

    # -- what the parts ask of each other ---------------------------------------------------

    def _stats(self) -> dict[str, VersionCounters]:
        """The front-end replicas' counters, summed: what canary analysis reads."""
        return merge_reports(self._ask("snapshot"))

    def _deploy(self, served: list[ServedVersion]) -> None:
        """Publish the traffic table; wait until every front-end replica runs it."""
        from ray import serve

        from infergate.serve_app import APP_NAME, frontend_app

        epoch, version = self._ask("publish", [v.to_dict() for v in served], timeout_s=60.0)
        self._published = (epoch, served)
        if not self._app_deployed:
            app = frontend_app(self.config.frontend_settings(), self.config.serve)
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
            self._app_deployed = True
        # Old versions are unloaded from Triton after this: no replica may still use them.
        wait_until(
            None,
            lambda: self._ask("adopted", version, timeout_s=5.0),
            ADOPTION_TIMEOUT_S,
            f"front-end replicas adopting traffic table {version}",
        )

    def _load_failed(self, version: ServedVersion, reason: str) -> None:
        """A canary that cannot be loaded is rolled back at once; it never gets traffic.
        ``reason`` says what failed (Triton's load, or reading the replicas' files)."""
        if version.role == CANARY:
            self.rollouts.rollback(version.name, reason)

    def _publish_again_if_restarted(self) -> None:
        """The ``ControlState`` actor restarted (its node lost, say): it is empty, so give
        it the table again; replicas route by their last one meanwhile. An actor gone for
        good is created again here (``_ask`` dropped its handle), under a new epoch too."""
        if self._published is None:
            return
        epoch, served = self._published
        if self._ask("current_epoch") != epoch:
            log.warning("the control state actor restarted; publishing the traffic table again")
            with self.lock:
                self._deploy(served)

    def _publish_shadow_tests(self) -> None:
        """Where each shadow stage's sequential tests stand, for the rollout dashboard; a
        gauge no longer set (the stage over) leaves Ray's export by itself."""
        shadows = self.rollouts.shadow_tests()
        if not shadows:
            return
        from ray.util.metrics import Gauge

        if self._shadow_tests is None:
            metric = SHADOW_TESTS
            self._shadow_tests = Gauge(
                metric.full_name, description=metric.description, tag_keys=metric.labels
            )
        for model, tests in shadows.items():
            for test, llr in tests.items():
                self._shadow_tests.set(llr, {"model": model, "test": test})

    def _count_decision(self, model: str, action: str) -> None:
        from ray.util.metrics import Counter

        if self._decisions is None:
            metric = ROLLOUT_DECISIONS
            self._decisions = Counter(
                metric.full_name, description=metric.description, tag_keys=metric.labels
            )
        self._decisions.inc(1, {"model": model, "decision": action})

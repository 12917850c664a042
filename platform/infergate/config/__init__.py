"""Configuration of the platform, loaded once at the edge and passed down frozen.

Defaults live in ``deployments/local.yaml``; any field can be overridden by an
environment variable ``INFERGATE_<SECTION>__<FIELD>`` (for example
``INFERGATE_TRITON__GRPC_PORT=9101``) or by a command-line flag.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from infergate.config.frozen import Frozen
from infergate.config.payloads import PayloadSampling as PayloadSampling
from infergate.config.payloads import PayloadSettings
from infergate.config.sources import (
    ENV_PREFIX,
    Origin,
    Origins,
    env_overrides,
    invalid,
    merge,
    note,
    read_file,
)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG_FILE = PROJECT_ROOT / "deployments" / "local.yaml"


class MlflowSettings(Frozen):
    host: str = Field("127.0.0.1", description="Address the MLflow server binds to.")
    port: int = Field(5000, description="MLflow server port.")
    store_dir: Path = Field(
        PROJECT_ROOT / "registry" / "store",
        description="Folder holding the SQLite backend store and the artifact store.",
    )
    tracking_uri: str | None = Field(
        None, description="Use an existing MLflow server instead of starting one."
    )
    backend_store_uri: str | None = Field(
        None,
        description="The backend store of the MLflow server `up` starts: SQLite in store_dir "
        "when unset; a postgresql://user@host:port/db URI for a production registry (its "
        "password in PGPASSWORD or ~/.pgpass rather than in the URI).",
    )
    auth: bool = Field(
        False,
        description="Start MLflow with its basic-auth app: every call needs a user (HTTP "
        "basic auth), and only users with the permission may move aliases. The first start "
        "creates the admin user with MLFLOW_AUTH_ADMIN_PASSWORD; the platform's own clients "
        "sign in as MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (by default that "
        "admin).",
    )
    startup_timeout_s: float = Field(90.0, description="How long to wait for the server.")

    @property
    def uri(self) -> str:
        return self.tracking_uri or f"http://{self.host}:{self.port}"


class TritonSettings(Frozen):
    http_port: int = Field(8100, description="Triton HTTP port (KServe v2 protocol).")
    grpc_port: int = Field(8101, description="Triton gRPC port, used by the front-end.")
    metrics_port: int = Field(8102, description="Triton Prometheus metrics port.")
    max_batch_size: int = Field(64, ge=1, description="Largest batch Triton's batcher forms.")
    max_queue_delay_us: int = Field(
        500, ge=0, description="How long the dynamic batcher waits to fill a batch."
    )
    instance_count: int = Field(1, ge=1, description="Model instances per served version.")
    ort_intra_op_threads: int = Field(
        0, ge=0, description="ONNX Runtime threads per instance; 0 lets ONNX Runtime decide."
    )
    startup_timeout_s: float = Field(60.0, description="How long to wait for the server.")
    load_timeout_s: float = Field(120.0, description="How long a model load may take.")
    bind_address: str = Field(
        "127.0.0.1",
        description="Address Triton's HTTP, gRPC and metrics endpoints bind to; 0.0.0.0 in "
        "a container.",
    )
    gpu: bool = Field(
        False,
        description="Place model instances on GPUs (KIND_GPU); ONNX Runtime then tries its "
        "CUDA provider first. Needs a GPU machine.",
    )
    external_host: str | None = Field(
        None,
        description="Drive a Triton the platform did not start, at this host (on the ports "
        "above, explicit model control) instead of starting one. Every address the name "
        "resolves to is a Triton of its own (a headless Service's pods): each gets every "
        "load and unload, or with a budget (max_loaded_versions) holds a set of its own.",
    )
    repository_dir: Path | None = Field(
        None,
        description="A model repository folder an external Triton reads too (a shared "
        "volume): versions are written there and loaded by name. Unset, a version's files "
        "travel with its load request (Triton's repository API), so a Triton with an "
        "empty repository of its own, on another machine, works.",
    )
    backend: Literal["python", "onnxruntime", "auto"] = Field(
        "python",
        description="How Triton runs a version: 'onnxruntime' is Triton's native ONNX "
        "Runtime backend (NVIDIA's images); 'python' a Python-backend model running ONNX "
        "Runtime (the only backend of the nvidia-pytriton wheel); 'auto' asks the server "
        "which it can load.",
    )
    tensorrt: bool = Field(
        False,
        description="With the onnxruntime backend on GPU instances: let ONNX Runtime hand "
        "the graph to TensorRT (its execution accelerator), in FP16.",
    )
    max_loaded_versions: int | None = Field(
        None,
        ge=0,
        description="Most served versions loaded in each Triton at once; the others stay "
        "served and are loaded when a request asks for one, after unloading the least "
        "recently used. 0 or unset: no limit, every served version stays loaded.",
    )
    idle_unload_s: float | None = Field(
        None,
        gt=0,
        description="Unload a served version nobody asked for within this many seconds; "
        "its next request loads it again. Unset: never.",
    )
    check_interval_s: float = Field(
        2.0,
        gt=0,
        description="How often the control plane checks that every Triton has loaded what it "
        "should hold (one that restarted comes back empty) and loads that again.",
    )

    @property
    def budget(self) -> int | None:
        """``max_loaded_versions`` with 0 read as no limit."""
        return self.max_loaded_versions or None

    @property
    def loads_on_demand(self) -> bool:
        """Whether a served version may be out of Triton until asked for."""
        return self.budget is not None or self.idle_unload_s is not None

    @property
    def host(self) -> str:
        """Where Triton answers: the external host, or this machine."""
        return self.external_host or "127.0.0.1"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"


class AutoscalingSettings(Frozen):
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(2, ge=1)
    target_ongoing_requests: float = Field(
        32.0, gt=0, description="Ongoing requests per replica that Ray Serve aims for."
    )


class FrontendSettings(Frozen):
    """What every front-end replica needs; it travels to Ray Serve as user_config."""

    default_model: str = Field("sentiment", description="Model answering POST /predict.")
    max_texts_per_request: int = Field(64, ge=1, description="More texts get a 413.")
    max_body_bytes: int = Field(1_048_576, ge=1, description="Larger bodies get a 413.")
    max_chars_per_text: int = Field(
        20_000, ge=1, description="Longer texts get a 413; tokens past max length are truncated."
    )
    grpc_port: int = Field(
        8081,
        ge=0,
        le=65535,
        description="Port of the Open Inference Protocol's gRPC service (Ray Serve's gRPC "
        "ingress, on serve.host); 0 turns it off. Read when Serve starts: a change needs "
        "a restart.",
    )
    triton_grpc_url: str = Field("127.0.0.1:8101", description="Triton gRPC address.")
    triton_timeout_s: float = Field(10.0, gt=0, description="Deadline of one Triton call.")
    batch_max_rows: int = Field(
        64,
        ge=1,
        description="Most rows in one Triton call when a replica coalesces concurrent "
        "requests; capped at triton.max_batch_size. 1 turns coalescing off.",
    )
    batch_max_in_flight: int = Field(
        4,
        ge=1,
        description="Triton calls per model a replica keeps out at once; requests arriving "
        "meanwhile wait and leave together as the next call.",
    )
    batch_full_calls_ahead: int = Field(
        2,
        ge=0,
        description="Calls per model a replica may keep out beyond batch_max_in_flight when "
        "each is full (batch_max_rows rows): they wait in Triton's queue, so an instance "
        "that finishes a batch starts the next at once. Only load that fills whole calls "
        "sends them. 0 turns them off.",
    )
    artifact_cache_dir: Path = Field(
        PROJECT_ROOT / ".infergate" / "artifacts",
        description="Where replicas keep tokenizers and metadata downloaded from MLflow.",
    )
    tracking_uri: str = Field("http://127.0.0.1:5000", description="MLflow tracking URI.")
    api_keys_file: Path | None = Field(
        None,
        description="YAML file of API key digests (`infergate keys create`); set, every "
        "inference and model endpoint wants a key. Unset: open to whoever reaches the port.",
    )
    rate_limit_burst_s: float = Field(
        1.0, gt=0, description="Seconds of a key's rate it may spend at once."
    )
    body_timeout_s: float = Field(
        10.0, gt=0, description="A request whose body is not in within this gets a 408."
    )
    max_slow_uploads: int = Field(
        32,
        ge=1,
        description="Requests per replica whose body is still arriving after a moment; more "
        "get a 408 at once, so slow clients cannot take every request slot.",
    )
    max_queued_rows: int = Field(
        1024,
        ge=1,
        description="Texts per model and replica waiting for a Triton call; past it a request "
        "gets a 429 at once instead of waiting ever longer.",
    )
    cold_start_timeout_s: float = Field(
        30.0,
        gt=0,
        description="How long a request for a served version that is not loaded in Triton "
        "(triton.max_loaded_versions, triton.idle_unload_s) waits for its load; past it, a "
        "503 with Retry-After.",
    )
    load_on_demand: bool = Field(
        False,
        description="Ask the control plane to load a served version Triton does not have "
        "and wait for it. Set by the stack from triton.max_loaded_versions and "
        "triton.idle_unload_s.",
    )
    metrics_federate_url: str | None = Field(
        None,
        description="Prometheus's /federate URL, where GET /tei/{model}/metrics reads the "
        "model's infergate_ series as last scraped (the local stack, chart and Compose file "
        "set theirs); unset: that route answers 404.",
    )
    payloads: PayloadSettings = PayloadSettings()


class ServeSettings(Frozen):
    host: str = Field("127.0.0.1", description="Address of the HTTP ingress.")
    port: int = Field(8000, description="Port of the HTTP ingress.")
    fast_ingress: bool = Field(
        True, description="Use Ray Serve's HAProxy ingress and throughput-optimised mode."
    )
    external: bool = Field(
        False,
        description="Ray Serve runs elsewhere (e.g. a KubeRay RayService that deploys "
        "infergate.serve_app:build_app): join that cluster through RAY_ADDRESS and only "
        "publish traffic tables to it.",
    )
    external_url: str | None = Field(
        None,
        description="With external: the address clients call (the cluster's Serve ingress, "
        "e.g. the RayService's serve Service), which `up` prints; unset, `up` prints none.",
    )
    control_actor_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Ray node labels the ControlState actor (which carries traffic tables to "
        "the replicas) prefers (labels given with `ray start --labels`, e.g. {market: "
        "on-demand}, or Ray's own ray.io/node-id); it runs elsewhere when no such node is up. "
        "Empty: the control plane's own node.",
    )
    max_ongoing_requests: int = Field(256, ge=1, description="Per front-end replica.")
    access_log: bool = Field(
        False,
        description="Ray Serve's access log: a line per request in each replica's log file. "
        "infergate's own metrics count every request; the line costs ~30 us of replica CPU.",
    )
    metrics_export_port: int = Field(8103, description="Port of Ray's metrics exporter.")
    haproxy_stats_port: int = Field(8404, description="HAProxy ingress stats page.")
    haproxy_metrics_port: int = Field(9101, description="HAProxy ingress Prometheus metrics.")
    fallback_proxy_port: int = Field(
        8105,
        description="Ray Serve's own HTTP proxy, where HAProxy sends requests no replica can "
        "take. Ray Serve's fixed default (8500) would make two stacks on one machine share it: "
        "one stack's requests then reached the other's replicas.",
    )
    fallback_proxy_grpc_port: int = Field(8106, description="The same proxy's gRPC port.")
    max_connections: int = Field(
        4096, ge=1, description="Client connections the HAProxy ingress holds at once; more wait."
    )
    client_idle_timeout_s: int = Field(
        60,
        ge=1,
        description="The ingress closes a client connection that sends nothing for this long "
        "(an idle keep-alive connection too); Ray Serve's default is an hour.",
    )
    autoscaling: AutoscalingSettings = AutoscalingSettings()
    ray_num_cpus: int | None = Field(None, description="CPUs Ray may schedule; None = all.")


class PrometheusSettings(Frozen):
    enabled: bool = Field(True, description="Start Prometheus when the binary is installed.")
    port: int = Field(9090)
    binary: str = Field("prometheus", description="Name or path of the Prometheus binary.")


class AdminSettings(Frozen):
    """The control plane's API: MLflow webhooks and the rollout commands."""

    host: str = Field("127.0.0.1", description="Address the admin API binds to.")
    port: int = Field(8104, description="Admin API port (webhooks, canary commands).")
    token: str | None = Field(
        None, description="When set, canary commands need 'Authorization: Bearer TOKEN'."
    )
    webhook_secret: str | None = Field(
        None, description="HMAC secret of MLflow webhooks; a random one per start if unset."
    )
    webhooks: bool = Field(True, description="Register an MLflow webhook on start.")
    public_url: str | None = Field(
        None, description="Where MLflow reaches the admin API, if not at host:port."
    )
    analysis_interval_s: float = Field(2.0, gt=0, description="How often rollouts are analysed.")

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"


class StackConfig(Frozen):
    """The whole local stack of ``infergate up``."""

    state_dir: Path = Field(
        PROJECT_ROOT / ".infergate", description="Logs, pid file, Triton model repository."
    )
    mlflow: MlflowSettings = MlflowSettings()
    triton: TritonSettings = TritonSettings()
    serve: ServeSettings = ServeSettings()
    frontend: FrontendSettings = FrontendSettings()
    prometheus: PrometheusSettings = PrometheusSettings()
    admin: AdminSettings = AdminSettings()
    reconcile_interval_s: float = Field(
        30.0, gt=0, description="How often the served versions are re-read from the registry."
    )

    @property
    def payload_url(self) -> str:
        """Where the payload log is: its setting, else the state dir's ``payloads``."""
        return self.frontend.payloads.url or str(self.state_dir / "payloads")

    def frontend_settings(self) -> FrontendSettings:
        """Front-end settings wired to the addresses of this stack."""
        return self.frontend.model_copy(
            update={
                "triton_grpc_url": self.triton.grpc_url,
                "batch_max_rows": min(self.frontend.batch_max_rows, self.triton.max_batch_size),
                "tracking_uri": self.mlflow.uri,
                "load_on_demand": self.triton.loads_on_demand,
                "artifact_cache_dir": self.state_dir / "artifacts",
                "payloads": self.frontend.payloads.model_copy(update={"url": self.payload_url}),
                "metrics_federate_url": self.frontend.metrics_federate_url
                or (
                    f"http://127.0.0.1:{self.prometheus.port}/federate"
                    if self.prometheus.enabled
                    else None
                ),
            }
        )


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> StackConfig:
    """Read the YAML file, then environment overrides, then explicit overrides.

    A wrong setting raises ``InvalidConfig``, whose one line names the setting, where it
    came from and what it should be: the command line prints that, not pydantic's report
    of many lines and a traceback."""
    environ = os.environ if environ is None else environ
    path = path or Path(environ.get(ENV_PREFIX + "CONFIG", DEFAULT_CONFIG_FILE))
    origins: Origins = {}
    data: dict[str, Any] = read_file(path) if path.exists() else {}
    note(origins, data, Origin(file=path))
    data = merge(data, env_overrides(environ, origins))
    data = merge(data, overrides or {})
    note(origins, overrides or {}, Origin())
    try:
        return StackConfig.model_validate(data)
    except ValidationError as error:
        raise invalid(error, origins, StackConfig) from None


Precision = Literal["int8", "fp16", "fp32"]

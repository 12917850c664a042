"""helm/infergate, checked without a cluster: Helm lints and renders it (helm-python-sdk, the
Helm 4 library), every rendered manifest passes the Kubernetes schema (kubernetes-validate,
strict), the RayService - a CRD those schemas lack - is checked field by field and its Serve
config by Ray's own schema, the front-end and Triton scale apart, the settings handed to the
platform are ones config.py knows, and the monitoring config passes promtool."""

from __future__ import annotations

import base64
import functools
import itertools
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from infergate.config import PROJECT_ROOT, FrontendSettings, load_config
from infergate.errors import InvalidConfig
from prometheus_server import PROMTOOL

CHART = PROJECT_ROOT / "helm" / "infergate"
FILES = CHART / "files"
RELEASE, NAMESPACE = "demo", "ml"
# Oldest Kubernetes the chart's kubeVersion admits, rounded to a release the schemas cover.
KUBE_VERSION = "1.30.0"

PENDING_FRONTEND_ARGS: set[str] = set()

# Value sets the chart is rendered with: the defaults and each toggle.
SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gpu": {
        "triton": {
            "gpu": {"enabled": True, "count": 2},
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        }
    },
    "autoscaling": {
        "frontend": {
            "autoscaling": {"minReplicas": 2, "maxReplicas": 12, "targetOngoingRequests": 16}
        },
        "ray": {"worker": {"minReplicas": 1, "maxReplicas": 6}},
        "triton": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5}},
    },
    "external-postgres-s3": {
        "postgresql": {"enabled": False},
        "mlflow": {
            "backendStore": {"existingSecret": "mlflow-db", "uriKey": "connection"},
            "artifacts": {
                "destination": "s3://models/mlflow",
                "s3": {"endpointUrl": "http://minio:9000", "existingSecret": "minio-keys"},
            },
        },
    },
    "shared-repository": {"modelRepository": {"shared": True}},
    "many-models": {
        "triton": {"maxLoadedVersions": 5, "idleUnloadS": 300},
        "frontend": {"coldStartTimeoutS": 45},
    },
    "no-api-keys": {"frontend": {"apiKeys": {"enabled": False}}},
    "existing-secrets-no-monitoring": {
        "controlPlane": {"auth": {"existingSecret": "infergate-admin"}},
        "mlflow": {"webhookEncryptionKey": {"existingSecret": "mlflow-webhook-key"}},
        "postgresql": {"existingSecret": "postgres-password"},
        "modelRepository": {"shared": True, "existingClaim": "shared-models"},
        "prometheus": {"enabled": False},
        "grafana": {"enabled": False},
        "frontend": {"fastIngress": False, "apiKeys": {"existingSecret": "team-api-keys"}},
    },
}


# -- rendering -------------------------------------------------------------------------------


def render_files(values: dict[str, Any] | None = None, release: str = RELEASE) -> dict[str, str]:
    with helm_python.Chart.load(CHART) as chart:
        return chart.render(values, name=release, namespace=NAMESPACE)


@functools.cache
def _render_cached(key: str) -> tuple[dict[str, Any], ...]:
    return tuple(_manifests(render_files(SCENARIOS[key])))


def _manifests(files: dict[str, str]) -> Iterator[dict[str, Any]]:
    for path, text in sorted(files.items()):
        if path.endswith(".yaml"):
            yield from (doc for doc in yaml.safe_load_all(text) if doc)


def render(values: dict[str, Any] | str | None = None) -> list[dict[str, Any]]:
    """The rendered manifests of a scenario name or of a values dict."""
    if isinstance(values, str):
        return list(_render_cached(values))
    return list(_manifests(render_files(values)))


def find(manifests: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def named(component: str) -> str:
    return f"{RELEASE}-infergate-{component}"


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    """A container's env: plain values as strings, references as their valueFrom."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}


def serve_config(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    rayservice = find(manifests, "RayService")
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


def frontend_app(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (app,) = serve_config(manifests)["applications"]
    return app


def ray_pod_templates(rayservice: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [group["template"] for group in groups]


def pod_templates(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod template: Deployments, StatefulSets and the RayService's node groups."""
    templates = []
    for m in manifests:
        if m["kind"] in ("Deployment", "StatefulSet"):
            templates.append(m["spec"]["template"])
        elif m["kind"] == "RayService":
            templates.extend(ray_pod_templates(m))
    return templates


# -- Helm lint and Kubernetes schemas --------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_chart_lints_without_warnings(scenario):
    report = helm_python.lint(
        CHART, SCENARIOS[scenario], strict=True, namespace=NAMESPACE, kube_version=KUBE_VERSION
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


def documented_helm_install() -> tuple[list[str], dict[str, Any]]:
    """The `helm install` command of docs/beyond-one-machine.md: its words, and the values its
    --set flags give."""
    return documented_helm_command("docs/beyond-one-machine.md", "install")


def documented_helm_command(page: str, verb: str) -> tuple[list[str], dict[str, Any]]:
    """The one `helm VERB` command of a docs page: its words, and the values its --set flags
    give."""
    text = (PROJECT_ROOT / page).read_text()
    (command,) = re.findall(rf"^helm {verb} .*?(?<!\\)$", text, flags=re.M | re.S)
    words = shlex.split(command.replace("\\\n", " "))
    values: dict[str, Any] = {}
    for word, value in itertools.pairwise(words):
        if word == "--set":
            *path, leaf = value.split("=", 1)[0].split(".")
            node = values
            for key in path:
                node = node.setdefault(key, {})
            node[leaf] = value.split("=", 1)[1]
    return words, values


def test_the_documented_helm_install_renders_a_valid_release():
    words, values = documented_helm_install()
    assert words[:4] == ["helm", "install", "infergate", "helm/infergate"]
    assert words[words.index("--namespace") + 1] == NAMESPACE
    manifests = render(values)
    for manifest in manifests:
        if manifest["kind"] != "RayService":
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
    image = container(find(manifests, "Deployment", named("control-plane")))["image"]
    assert image.startswith(values["image"]["repository"] + ":")
    # The page names the Secret holding the generated API key of its release.
    secrets = [
        m for m in _manifests(render_files(values, release=words[2])) if m["kind"] == "Secret"
    ]
    (secret,) = [
        m["metadata"]["name"] for m in secrets if m["metadata"]["name"].endswith("-api-keys")
    ]
    assert f"`{secret}`" in (PROJECT_ROOT / "docs/beyond-one-machine.md").read_text()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_manifest_passes_the_kubernetes_schema(scenario):
    manifests = render(scenario)
    for manifest in manifests:
        if manifest["kind"] == "RayService":
            check_rayservice(manifest)
            continue
        try:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = "/".join(str(p) for p in error.absolute_path)
            pytest.fail(
                f"{manifest['kind']} {manifest['metadata']['name']}: {where}: {error.message}"
            )


def check_rayservice(rayservice: dict[str, Any]) -> None:
    """What KubeRay's ray.io/v1 RayService CRD requires, checked by hand (kubernetes-validate
    has no schema for it): names, a Serve config that Ray's own schema accepts, a head group
    and worker groups with valid pod templates and string rayStartParams."""
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeDeploySchema

    assert rayservice["apiVersion"] == "ray.io/v1"
    name = rayservice["metadata"]["name"]
    # KubeRay names clusters <name>-<5 chars> and pods <cluster>-<group>-worker-<5 chars>.
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 40, name

    spec = rayservice["spec"]
    assert isinstance(spec["serveConfigV2"], str), "serveConfigV2 is a YAML string"
    config = ServeDeploySchema.model_validate(yaml.safe_load(spec["serveConfigV2"]))
    for app in config.applications:
        for deployment in app.deployments:
            autoscaling = deployment.autoscaling_config
            if isinstance(autoscaling, dict):  # Ray keeps it a dict; unknown keys pass there
                assert set(autoscaling) <= set(AutoscalingConfig.model_fields), autoscaling
                AutoscalingConfig.model_validate(autoscaling)

    cluster = spec["rayClusterConfig"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", cluster["rayVersion"])
    assert isinstance(cluster.get("enableInTreeAutoscaling", False), bool)
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        params = group["rayStartParams"]
        assert all(isinstance(v, str) for v in params.values()), f"not all strings: {params}"
    for worker in cluster["workerGroupSpecs"]:
        assert worker["groupName"]
        assert worker["minReplicas"] <= worker["replicas"] <= worker["maxReplicas"], worker
    group_names = [w["groupName"] for w in cluster["workerGroupSpecs"]]
    assert len(group_names) == len(set(group_names))
    for template in ray_pod_templates(rayservice):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "check", **template.get("metadata", {})},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
        assert template["spec"]["containers"][0]["image"]


# -- the front-end: what the platform must accept --------------------------------------------


def test_serve_application_names_match_the_code_and_the_alerts():
    from infergate import serve_app

    app = frontend_app(render("defaults"))
    assert app["name"] == serve_app.APP_NAME
    assert app["import_path"] == "infergate.serve_app:build_app"
    assert app["route_prefix"] == "/"
    (deployment,) = app["deployments"]
    assert deployment["name"] == serve_app.FrontendDeployment.name
    # The alert on healthy replicas names them too.
    alerts = (PROJECT_ROOT / "deployments" / "alerts.yml").read_text()
    assert f'application="{app["name"]}", deployment="{deployment["name"]}"' in alerts


@pytest.mark.parametrize("scenario", ["defaults", "existing-secrets-no-monitoring"])
def test_ray_containers_start_with_the_worker_environment_of_the_local_stack(scenario):
    """What the local stack exports for Ray's workers and is not about the host (the
    niceness is), e.g. tokenizing on the calling thread, every Ray container has too."""
    from infergate.stack.ray_start import WORKER_ENV

    wanted = {k: v for k, v in WORKER_ENV.items() if not k.startswith("RAY_")}
    assert wanted
    for template in ray_pod_templates(find(render(scenario), "RayService")):
        env = env_of(template["spec"]["containers"][0])
        assert {k: env.get(k) for k in wanted} == wanted


def test_access_log_follows_the_values_and_the_settings():
    from infergate.config import ServeSettings
    from infergate.serve_app import replica_options

    (deployment,) = frontend_app(render("defaults"))["deployments"]
    assert deployment["logging_config"] == {"enable_access_log": False}
    (deployment,) = frontend_app(render({"frontend": {"accessLog": True}}))["deployments"]
    assert deployment["logging_config"] == {"enable_access_log": True}
    assert replica_options(ServeSettings())["logging_config"] == {"enable_access_log": False}
    options = replica_options(ServeSettings(access_log=True))
    assert options["logging_config"] == {"enable_access_log": True}


def test_the_import_path_builds_the_front_end_from_the_charts_args():
    import importlib

    app = frontend_app(render({"frontend": {"batchMaxRows": 16}}))
    module, _, name = app["import_path"].partition(":")
    built = getattr(importlib.import_module(module), name)(app["args"])
    deployment = built._bound_deployment  # what `serve run` would deploy
    settings = deployment._deployment_config.user_config["settings"]
    assert deployment.name == "frontend" and settings["batch_max_rows"] == 16


def test_builder_args_are_frontend_settings():
    args = frontend_app(render("defaults"))["args"]
    unknown = set(args) - set(FrontendSettings.model_fields)
    assert unknown == PENDING_FRONTEND_ARGS, (
        "args the front-end does not know (add them to FrontendSettings), or pending ones it "
        f"now knows (drop them from PENDING_FRONTEND_ARGS): {unknown ^ PENDING_FRONTEND_ARGS}"
    )
    known = {k: v for k, v in args.items() if k not in PENDING_FRONTEND_ARGS}
    settings = FrontendSettings.model_validate(known)
    assert settings.triton_grpc_url == f"{named('triton')}:8001"
    assert settings.tracking_uri == f"http://{named('mlflow')}:5000"


def test_teis_metrics_route_reads_the_charts_prometheus():
    args = frontend_app(render("defaults"))["args"]
    assert args["metrics_federate_url"] == f"http://{named('prometheus')}:9090/federate"
    service = find(render("defaults"), "Service", named("prometheus"))
    assert service["spec"]["ports"][0]["port"] == 9090
    off = frontend_app(render({"prometheus": {"enabled": False}, "grafana": {"enabled": False}}))
    assert "metrics_federate_url" not in off["args"]


def test_load_on_demand_values_reach_the_control_plane_and_the_replicas():
    """Off by default, as the platform's settings are; the values docs/many-models.md sets
    turn it on for both sides; a budget of 0 means no limit, as triton.max_loaded_versions."""

    def sides(values: dict[str, Any]) -> tuple[Any, FrontendSettings]:
        manifests = render(values)
        env = as_environ(env_of(container(find(manifests, "Deployment", named("control-plane")))))
        triton = load_config(Path("/nonexistent.yaml"), environ=env).triton
        return triton, FrontendSettings.model_validate(frontend_app(manifests)["args"])

    triton, replicas = sides({})
    assert (triton.budget, triton.idle_unload_s, triton.loads_on_demand) == (None, None, False)
    assert (replicas.load_on_demand, replicas.cold_start_timeout_s) == (False, 30)

    words, values = documented_helm_command("docs/many-models.md", "upgrade")
    assert words[:4] == ["helm", "upgrade", "infergate", "helm/infergate"]
    triton, replicas = sides(values)
    assert (triton.budget, triton.idle_unload_s) == (20, 600)
    assert replicas.load_on_demand and replicas.cold_start_timeout_s == 30

    triton, replicas = sides({"triton": {"maxLoadedVersions": 0}})
    assert not triton.loads_on_demand and not replicas.load_on_demand
    triton, replicas = sides({"triton": {"idleUnloadS": 90}, "frontend": {"coldStartTimeoutS": 5}})
    assert (triton.budget, triton.idle_unload_s) == (None, 90)
    assert replicas.load_on_demand and replicas.cold_start_timeout_s == 5


def test_payload_log_values_reach_the_replicas_as_their_settings():
    from infergate.config import PayloadSettings

    args = frontend_app(render("defaults"))["args"]
    off = PayloadSettings.model_validate(args["payloads"])
    assert off == PayloadSettings(url="/tmp/infergate/payloads")  # the code's defaults
    url = "s3://logs/payloads?endpoint_override=minio:9000&scheme=http"
    values = {"enabled": True, "url": url, "texts": "redact", "redactModel": "ner",
              "maxTotalMb": 64, "sample": {"champion": 0.5},
              "s3ExistingSecret": "payload-store"}  # fmt: skip
    manifests = render({"frontend": {"payloads": values}})
    on = PayloadSettings.model_validate(frontend_app(manifests)["args"]["payloads"])
    assert (on.enabled, on.url, on.max_total_mb) == (True, url, 64)
    assert (on.texts, on.redact_model) == ("redact", "ner")
    assert (on.sample.champion, on.sample.canary) == (0.5, 0.1)
    for template in ray_pod_templates(find(manifests, "RayService")):
        (ray,) = template["spec"]["containers"]
        assert ray["envFrom"] == [{"secretRef": {"name": "payload-store"}}]
    for template in ray_pod_templates(find(render("defaults"), "RayService")):
        assert "envFrom" not in template["spec"]["containers"][0]


def test_the_grpc_ingress_serves_the_open_inference_protocol_on_every_ray_pod():
    from infergate.stack.ray_start import GRPC_SERVICER, grpc_message_limit

    manifests = render("defaults")
    options = serve_config(manifests)["grpc_options"]
    assert options == {"port": 9000, "grpc_servicer_functions": [GRPC_SERVICER]}
    # A message larger than a REST body and its framing is refused before it is read.
    limit = str(grpc_message_limit(frontend_app(manifests)["args"]["max_body_bytes"]))
    for template in ray_pod_templates(find(manifests, "RayService")):
        (ray,) = template["spec"]["containers"]
        assert {p["name"]: p["containerPort"] for p in ray["ports"]}["grpc"] == 9000
        assert env_of(ray)["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"] == limit
    service = next(m for m in manifests if m["metadata"]["name"] == named("grpc"))
    assert service["spec"]["ports"] == [
        {"name": "grpc", "port": 9000, "targetPort": "grpc", "appProtocol": "grpc"}
    ]
    off = render({"frontend": {"grpcPort": 0}})
    assert "grpc_options" not in serve_config(off)
    for template in ray_pod_templates(find(off, "RayService")):
        assert "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE" not in env_of(template["spec"]["containers"][0])
    assert not [m for m in off if m["metadata"]["name"] == named("grpc")]


def test_coalescing_settings_reach_the_replicas_capped_at_tritons_batch():
    args = frontend_app(render("defaults"))["args"]
    assert (args["batch_max_rows"], args["batch_max_in_flight"]) == (64, 4)
    assert args["batch_full_calls_ahead"] == 2
    values = {
        "frontend": {"batchMaxRows": 128, "batchMaxInFlight": 2, "batchFullCallsAhead": 0},
        "triton": {"maxBatchSize": 32},
    }
    args = frontend_app(render(values))["args"]
    settings = FrontendSettings.model_validate(
        {k: v for k, v in args.items() if k not in PENDING_FRONTEND_ARGS}
    )
    # A call of more rows than Triton's max_batch_size would be refused.
    assert (settings.batch_max_rows, settings.batch_max_in_flight) == (32, 2)
    assert settings.batch_full_calls_ahead == 0


def as_environ(env: dict[str, Any]) -> dict[str, str]:
    """The INFERGATE_* variables as the process sees them (secret references: a stand-in)."""
    return {
        name: value if isinstance(value, str) else "stand-in-secret"
        for name, value in env.items()
        if name.startswith("INFERGATE_")
    }


def rejected_settings(env: dict[str, Any]) -> set[str]:
    """The INFERGATE_* variables load_config refuses, each tried alone."""
    rejected = set()
    for name, raw in as_environ(env).items():
        try:
            load_config(Path("/nonexistent.yaml"), environ={name: raw})
        except InvalidConfig:
            rejected.add(name)
    return rejected


def infergate_pods(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod templates that run infergate's code, by name: the control plane and the Ray
    pods (where the front-end replicas run)."""
    control_plane = find(manifests, "Deployment", named("control-plane"))
    pods = {"control-plane": control_plane["spec"]["template"]}
    for template in ray_pod_templates(find(manifests, "RayService")):
        pods[template["spec"]["containers"][0]["name"]] = template
    return pods


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_infergate_setting_of_the_control_plane_and_ray_pods_is_accepted(scenario):
    pods = infergate_pods(render(scenario))
    assert set(pods) == {"control-plane", "ray-head", "ray-worker"}
    for name, template in pods.items():
        env = env_of(template["spec"]["containers"][0])
        rejected = rejected_settings(env)
        assert rejected == set(), f"{name}: settings config.py refuses, add them there: {rejected}"
        load_config(Path("/nonexistent.yaml"), environ=as_environ(env))
    control_plane = as_environ(env_of(pods["control-plane"]["spec"]["containers"][0]))
    assert load_config(Path("/nonexistent.yaml"), environ=control_plane).triton.external_host


def test_control_plane_settings_are_known_to_config():
    manifests = render("defaults")
    env = env_of(container(find(manifests, "Deployment", named("control-plane"))))
    assert env["INFERGATE_MLFLOW__TRACKING_URI"] == f"http://{named('mlflow')}:5000"
    assert env["INFERGATE_TRITON__EXTERNAL_HOST"] == named("triton-pods")
    assert env["INFERGATE_ADMIN__TOKEN"]["secretKeyRef"]["key"] == "admin-token"


# -- scaling: front-end and Triton apart -----------------------------------------------------


def test_frontend_and_triton_are_separate_workloads_with_separate_replica_settings():
    values = {
        "frontend": {"autoscaling": {"minReplicas": 3, "maxReplicas": 9}},
        "triton": {"replicas": 2},
    }
    manifests = render(values)
    autoscaling = frontend_app(manifests)["deployments"][0]["autoscaling_config"]
    assert (autoscaling["min_replicas"], autoscaling["max_replicas"]) == (3, 9)
    triton = find(manifests, "Deployment", named("triton"))
    assert triton["spec"]["replicas"] == 2
    # Triton pods run no Ray, and Ray pods run no Triton.
    assert "tritonserver" in container(triton)["args"]
    for template in ray_pod_templates(find(manifests, "RayService")):
        assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "ray"
        assert "tritonserver" not in str(template["spec"]["containers"])


def test_changing_one_side_leaves_the_other_untouched():
    base = render("defaults")
    frontend_only = render({"frontend": {"autoscaling": {"minReplicas": 4, "maxReplicas": 20}}})
    triton_only = render({"triton": {"replicas": 5}})
    triton_name = named("triton")
    assert find(frontend_only, "Deployment", triton_name) == find(base, "Deployment", triton_name)
    assert find(frontend_only, "RayService") != find(base, "RayService")
    assert find(triton_only, "RayService") == find(base, "RayService")
    assert find(triton_only, "Deployment", triton_name) != find(base, "Deployment", triton_name)


def test_triton_autoscaler_targets_triton_only():
    manifests = render("autoscaling")
    hpa = find(manifests, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": named("triton"),
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    # The HPA owns the replica count.
    assert "replicas" not in find(manifests, "Deployment", named("triton"))["spec"]
    autoscaling = frontend_app(manifests)["deployments"][0]["autoscaling_config"]
    assert autoscaling == {"min_replicas": 2, "max_replicas": 12, "target_ongoing_requests": 16}
    assert "HorizontalPodAutoscaler" not in {m["kind"] for m in render("defaults")}


def test_gpus_go_to_triton_only():
    manifests = render("gpu")
    triton = find(manifests, "Deployment", named("triton"))
    assert container(triton)["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert triton["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "--allow-gpu-metrics=true" in container(triton)["args"]
    control_plane = find(manifests, "Deployment", named("control-plane"))
    assert env_of(container(control_plane))["INFERGATE_TRITON__GPU"] == "true"
    for template in pod_templates(manifests):
        for c in template["spec"]["containers"]:
            if c["name"] != "triton":
                assert "nvidia.com/gpu" not in str(c.get("resources")), c["name"]
    default_triton = find(render("defaults"), "Deployment", named("triton"))
    assert "nvidia.com/gpu" not in str(container(default_triton)["resources"])


# -- MLflow and its database -----------------------------------------------------------------


def test_bundled_postgres_backs_mlflow_by_default():
    manifests = render("defaults")
    postgres = find(manifests, "StatefulSet", named("postgresql"))
    env = env_of(container(find(manifests, "Deployment", named("mlflow"))))
    password = env["POSTGRES_PASSWORD"]["secretKeyRef"]
    assert password == env_of(container(postgres))["POSTGRES_PASSWORD"]["secretKeyRef"]
    assert env["MLFLOW_BACKEND_STORE_URI"] == (
        f"postgresql://mlflow:$(POSTGRES_PASSWORD)@{named('postgresql')}:5432/mlflow"
    )


def test_external_database_and_s3_artifacts():
    manifests = render("external-postgres-s3")
    assert "StatefulSet" not in {m["kind"] for m in manifests}
    mlflow = container(find(manifests, "Deployment", named("mlflow")))
    env = env_of(mlflow)
    assert env["MLFLOW_BACKEND_STORE_URI"] == {
        "secretKeyRef": {"name": "mlflow-db", "key": "connection"}
    }
    assert "POSTGRES_PASSWORD" not in env
    assert "--artifacts-destination=s3://models/mlflow" in mlflow["args"]
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert mlflow["envFrom"] == [{"secretRef": {"name": "minio-keys"}}]
    assert "volumeMounts" not in mlflow


def test_mlflow_without_a_database_is_refused():
    with pytest.raises(helm_python.HelmError, match="MLflow needs a database"):
        render_files({"postgresql": {"enabled": False}})


def test_mlflow_accepts_its_service_name_as_host():
    env = env_of(container(find(render("defaults"), "Deployment", named("mlflow"))))
    allowed = env["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    assert named("mlflow") in allowed and f"{named('mlflow')}:*" in allowed


# -- secrets ---------------------------------------------------------------------------------


def secret_refs(manifests: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(Secret, key) of every env reference and every key a Secret volume projects."""
    refs = set()
    for template in pod_templates(manifests):
        for c in template["spec"]["containers"]:
            for value in env_of(c).values():
                if isinstance(value, dict) and "secretKeyRef" in value:
                    refs.add((value["secretKeyRef"]["name"], value["secretKeyRef"]["key"]))
        for volume in template["spec"].get("volumes", []):
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                refs.update((name, item["key"]) for item in volume["secret"]["items"])
    return refs


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_secret_reference_is_rendered_or_named_in_values(scenario):
    manifests = render(scenario)
    rendered = {
        (m["metadata"]["name"], key)
        for m in manifests
        if m["kind"] == "Secret"
        for key in {**m.get("data", {}), **m.get("stringData", {})}
    }
    # The existing Secrets the scenarios name.
    external = {
        "mlflow-db",
        "infergate-admin",
        "mlflow-webhook-key",
        "postgres-password",
        "team-api-keys",
    }
    for name, key in secret_refs(manifests):
        assert (name, key) in rendered or name in external, (name, key)


def test_generated_webhook_encryption_key_is_a_fernet_key():
    from cryptography.fernet import Fernet

    secret = find(render("defaults"), "Secret", named("mlflow-webhook-key"))
    key = base64.b64decode(secret["data"]["key"])
    Fernet(key).decrypt(Fernet(key).encrypt(b"webhook secret"))


# -- API keys --------------------------------------------------------------------------------

KEYS_DIR = "/etc/infergate/api-keys"


def api_keys_path(manifests: list[dict[str, Any]]) -> Path | None:
    """Where the front-end reads its keys, as the Serve config's builder sees it."""
    return FrontendSettings.model_validate(frontend_app(manifests)["args"]).api_keys_file


def notes(values: dict[str, Any] | None = None) -> str:
    return render_files(values)["infergate/templates/NOTES.txt"]


@pytest.mark.parametrize(
    ("scenario", "secret"),
    [("defaults", named("api-keys")), ("existing-secrets-no-monitoring", "team-api-keys")],
)
def test_api_keys_reach_every_pod_that_runs_infergate(scenario, secret):
    manifests = render(scenario)
    path = api_keys_path(manifests)
    assert path == Path(KEYS_DIR) / "api-keys.yaml"
    for name, template in infergate_pods(manifests).items():
        (c,) = template["spec"]["containers"]
        env = as_environ(env_of(c))
        assert load_config(Path("/nonexistent.yaml"), environ=env).frontend.api_keys_file == path
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "api-keys"]
        # The folder (no subPath): only then does the file follow an update of the Secret.
        assert mount == {"name": "api-keys", "mountPath": str(path.parent), "readOnly": True}
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "api-keys"]
        # The key file alone: a generated key itself is not handed to any pod.
        assert volume["secret"] == {
            "secretName": secret,
            "items": [{"key": "api-keys.yaml", "path": path.name}],
        }, name


def test_the_generated_key_is_in_the_key_file_beside_it(tmp_path):
    from infergate.serving.access import KEY_PREFIX, Access, digest, new_key, read_keys

    secret = find(render("defaults"), "Secret", named("api-keys"))
    data = {name: base64.b64decode(value).decode() for name, value in secret["data"].items()}
    assert set(data) == {"api-key", "api-keys.yaml"}
    key = data["api-key"]
    assert key.startswith(KEY_PREFIX) and len(key) == len(new_key())
    assert re.fullmatch(r"[A-Za-z0-9]+", key.removeprefix(KEY_PREFIX))  # 43 of 62: 256 bits
    (tmp_path / "api-keys.yaml").write_text(data["api-keys.yaml"])
    (entry,) = read_keys(tmp_path / "api-keys.yaml").keys
    assert entry.sha256 == digest(key)
    assert entry.may_use("any-model") and entry.requests_per_s is None
    # The header NOTES.txt tells clients to send opens the front-end with that key file.
    (header,) = set(re.findall(r'-H "(Authorization: [^"]+)"', notes()))
    name, _, value = header.partition(": ")
    access = Access(tmp_path / "api-keys.yaml")
    caller = access.authenticate({name.lower(): value.replace("$INFERGATE_API_KEY", key)})
    assert caller.id == entry.id


def test_each_render_without_a_stored_secret_makes_a_new_key():
    keys = {find(render({}), "Secret", named("api-keys"))["data"]["api-key"] for _ in range(2)}
    assert len(keys) == 2


def chart_with_probe(tmp_path: Path) -> Path:
    """A copy of the chart with a template that calls the key Secret's data helper with
    stand-ins for what lookup finds in a cluster (lookup answers nothing without one)."""
    import shutil

    chart = tmp_path / "infergate"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "probe.yaml").write_text(
        "{{- range $case, $existing := .Values.probe }}\n---\ncase: {{ $case }}\ndata:\n"
        '  {{- include "infergate.apiKeysSecretData" (dict "existing" $existing) '
        "| trim | nindent 2 }}\n{{- end }}\n"
    )
    return chart


def test_a_stored_key_file_and_key_are_kept_across_upgrades(tmp_path):
    edited = base64.b64encode(b"keys: []  # edited by the operator\n").decode()
    key = base64.b64encode(b"ig_stored").decode()
    cases = {
        "both": {"data": {"api-keys.yaml": edited, "api-key": key}},
        # The operator removed the generated key once stored elsewhere: no new one.
        "file-only": {"data": {"api-keys.yaml": edited}},
        "absent": {},
    }
    with helm_python.Chart.load(chart_with_probe(tmp_path)) as chart:
        files = chart.render({"probe": cases}, name=RELEASE, namespace=NAMESPACE)
    found = {
        doc["case"]: doc["data"]
        for doc in yaml.safe_load_all(files["infergate/templates/probe.yaml"])
        if doc
    }
    assert found["both"] == cases["both"]["data"]
    assert found["file-only"] == cases["file-only"]["data"]
    assert set(found["absent"]) == {"api-key", "api-keys.yaml"}
    assert found["absent"]["api-keys.yaml"] != edited
    # The chart's Secret is that helper over what lookup finds under the Secret's own name.
    template = (CHART / "templates" / "secrets.yaml").read_text()
    assert (
        '"infergate.apiKeysSecretData" (dict "existing" (lookup "v1" "Secret" '
        ".Release.Namespace $name))"
    ) in template


def test_an_existing_api_keys_secret_turns_generation_off():
    manifests = render("existing-secrets-no-monitoring")
    secrets = {m["metadata"]["name"] for m in manifests if m["kind"] == "Secret"}
    assert named("api-keys") not in secrets and "team-api-keys" not in secrets
    text = notes(SCENARIOS["existing-secrets-no-monitoring"])
    assert "team-api-keys" in text and "{.data.api-key}" not in text


def test_api_keys_off_leaves_the_front_end_open():
    manifests = render("no-api-keys")
    assert api_keys_path(manifests) is None
    assert named("api-keys") not in {m["metadata"]["name"] for m in manifests}
    for name, template in infergate_pods(manifests).items():
        (c,) = template["spec"]["containers"]
        assert "INFERGATE_FRONTEND__API_KEYS_FILE" not in env_of(c), name
        assert "api-keys" not in str(template["spec"].get("volumes")), name
        assert "api-keys" not in str(c.get("volumeMounts")), name
    assert "Authorization" not in notes(SCENARIOS["no-api-keys"])


def test_notes_tell_how_to_read_the_key_and_add_keys():
    text = notes()
    secret = named("api-keys")
    read_key = (
        f"kubectl -n {NAMESPACE} get secret {secret} -o jsonpath='{{.data.api-key}}' | base64 -d"
    )
    assert read_key in text
    read_file = f"get secret {secret} -o jsonpath='{{.data.api-keys\\.yaml}}' | base64 -d"
    assert read_file + " > api-keys.yaml" in text
    lines = text.replace("\\\n", " ").splitlines()
    commands = [shlex.split(line.split("#")[0]) for line in lines if line.startswith("  ")]
    create = next(c for c in commands if c[:3] == ["infergate", "keys", "create"])
    assert create[create.index("--file") + 1] == "api-keys.yaml"
    apply = next(c for c in commands if c[:4] == ["kubectl", "-n", NAMESPACE, "create"])
    assert apply[4:7] == ["secret", "generic", secret]
    assert "--from-file=api-keys.yaml" in apply and "--dry-run=client" in apply
    assert apply[-7:] == ["|", "kubectl", "-n", NAMESPACE, "apply", "-f", "-"]


# -- Services and volumes --------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_service_selects_pods_that_have_its_ports(scenario):
    manifests = render(scenario)
    templates = [t for t in pod_templates(manifests) if t.get("metadata", {}).get("labels")]
    for service in (m for m in manifests if m["kind"] == "Service"):
        selector = service["spec"]["selector"]
        pods = [t for t in templates if selector.items() <= t["metadata"]["labels"].items()]
        assert pods, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in pods:
                declared = [p for c in pod["spec"]["containers"] for p in c.get("ports", [])]
                assert target in {p.get("name") for p in declared} | {
                    p["containerPort"] for p in declared
                }, (service["metadata"]["name"], target)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_claim_and_config_map_a_pod_uses_exists(scenario):
    manifests = render(scenario)
    claims = {m["metadata"]["name"] for m in manifests if m["kind"] == "PersistentVolumeClaim"}
    config_maps = {m["metadata"]["name"] for m in manifests if m["kind"] == "ConfigMap"}
    for template in pod_templates(manifests):
        for volume in template["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert claim in claims or claim == "shared-models", claim
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps


def test_by_default_versions_reach_triton_pods_with_their_loads_not_through_storage():
    manifests = render("defaults")
    control_plane = find(manifests, "Deployment", named("control-plane"))
    env = env_of(container(control_plane))
    assert "INFERGATE_TRITON__REPOSITORY_DIR" not in env  # files travel with each load
    assert env["INFERGATE_TRITON__BACKEND"] == "onnxruntime"
    assert "models" not in {m["name"] for m in container(control_plane)["volumeMounts"]}
    triton = find(manifests, "Deployment", named("triton"))
    volumes = {v["name"]: v for v in triton["spec"]["template"]["spec"]["volumes"]}
    assert volumes["models"] == {"name": "models", "emptyDir": {}}
    args = container(triton)["args"]
    assert {"--model-repository=/models", "--model-control-mode=explicit"} <= set(args)
    assert "--load-model=*" not in args  # an empty pod: the control plane loads it
    assert not [m for m in manifests if m["kind"] == "PersistentVolumeClaim" and
                m["metadata"]["name"] == named("models")]  # fmt: skip


def test_a_shared_repository_is_mounted_by_the_control_plane_and_triton():
    manifests = render("shared-repository")
    mounts = {}
    for component in ("control-plane", "triton"):
        workload = find(manifests, "Deployment", named(component))
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        (mount,) = [m for m in container(workload)["volumeMounts"] if m["name"] == "models"]
        mounts[component] = (
            volumes["models"]["persistentVolumeClaim"]["claimName"],
            mount["mountPath"],
        )
    assert mounts["control-plane"] == mounts["triton"] == (named("models"), "/models")
    args = container(find(manifests, "Deployment", named("triton")))["args"]
    assert {"--model-repository=/models", "--model-control-mode=explicit"} <= set(args)
    assert "--load-model=*" in args  # a pod that starts loads what the folder holds
    # With a budget the folder holds the versions of every pod, each its own: it starts
    # empty, and the control plane loads back what it held.
    values = {**SCENARIOS["shared-repository"], "triton": {"maxLoadedVersions": 3}}
    args = container(find(render(values), "Deployment", named("triton")))["args"]
    assert "--load-model=*" not in args
    env = env_of(container(find(manifests, "Deployment", named("control-plane"))))
    assert env["INFERGATE_TRITON__REPOSITORY_DIR"] == "/models"
    claim = find(manifests, "PersistentVolumeClaim", named("models"))
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


# -- monitoring ------------------------------------------------------------------------------


def rendered_prometheus(manifests: list[dict[str, Any]]) -> tuple[str, str]:
    data = find(manifests, "ConfigMap", named("prometheus"))["data"]
    return data["prometheus.yml"], data["alerts.yml"]


@pytest.mark.machine(
    "prometheus", None if PROMTOOL else "promtool not installed (Debian package prometheus)"
)
def test_rendered_prometheus_config_passes_promtool(tmp_path):
    config, alerts = rendered_prometheus(render("defaults"))
    (tmp_path / "prometheus.yml").write_text(config)
    (tmp_path / "alerts.yml").write_text(alerts)
    result = subprocess.run(
        [str(PROMTOOL), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sum(len(group["rules"]) for group in yaml.safe_load(alerts)["groups"])
    assert f"SUCCESS: {rules} rules found" in result.stdout


def test_prometheus_keeps_the_repository_jobs_and_finds_their_pods():
    manifests = render("defaults")
    config = yaml.safe_load(rendered_prometheus(manifests)[0])
    original = yaml.safe_load((PROJECT_ROOT / "deployments" / "prometheus.yml").read_text())
    assert config["global"] == original["global"]
    assert config["rule_files"] == original["rule_files"]
    services = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Service"}
    templates = pod_templates(manifests)
    for job, source in zip(config["scrape_configs"], original["scrape_configs"], strict=True):
        kept = {k: v for k, v in job.items() if k != "dns_sd_configs"}
        assert kept == {k: v for k, v in source.items() if k != "static_configs"}
        (discovery,) = job["dns_sd_configs"]
        (name,) = discovery["names"]
        service_name, namespace, _ = name.split(".")
        assert namespace == NAMESPACE and discovery["type"] == "A"
        service = services[service_name]
        # A headless Service: DNS answers with the address of every pod, not one virtual IP.
        assert service["spec"]["clusterIP"] == "None"
        assert discovery["port"] in {p["port"] for p in service["spec"]["ports"]}
        selector = service["spec"]["selector"].items()
        pods = [t for t in templates if selector <= t["metadata"]["labels"].items()]
        for pod in pods:
            ports = {p["containerPort"] for c in pod["spec"]["containers"] for p in c["ports"]}
            assert discovery["port"] in ports, f"{job['job_name']}: a pod lacks the port"


def test_prometheus_drops_the_ingress_job_without_the_haproxy_ingress():
    manifests = render("existing-secrets-no-monitoring")
    assert "ConfigMap" not in {m["kind"] for m in manifests}
    manifests = render({"frontend": {"fastIngress": False}})
    jobs = yaml.safe_load(rendered_prometheus(manifests)[0])["scrape_configs"]
    assert [job["job_name"] for job in jobs] == ["triton", "ray"]


def test_grafana_is_provisioned_with_the_repository_files():
    manifests = render("defaults")
    provisioning = find(manifests, "ConfigMap", named("grafana-provisioning"))["data"]
    source = PROJECT_ROOT / "deployments" / "grafana" / "provisioning"
    assert provisioning["datasources.yml"] == (source / "datasources/infergate.yml").read_text()
    assert provisioning["dashboards.yml"] == (source / "dashboards/infergate.yml").read_text()
    dashboards = find(manifests, "ConfigMap", named("grafana-dashboards"))["data"]
    originals = {p.name: p.read_text() for p in (PROJECT_ROOT / "dashboards").glob("*.json")}
    assert dashboards == originals
    grafana = container(find(manifests, "Deployment", named("grafana")))
    env = env_of(grafana)
    assert env["INFERGATE_PROMETHEUS_URL"] == f"http://{named('prometheus')}:9090"
    mounts = {m["mountPath"] for m in grafana["volumeMounts"]}
    assert env["INFERGATE_DASHBOARDS_DIR"] in mounts
    assert "/etc/grafana/provisioning/datasources/infergate.yml" in mounts


def test_grafana_needs_a_prometheus():
    with pytest.raises(helm_python.HelmError, match=r"grafana\.enabled needs prometheus"):
        render_files({"prometheus": {"enabled": False}})
    manifests = render({"prometheus": {"enabled": False}, "grafana": {"prometheusUrl": "http://p"}})
    env = env_of(container(find(manifests, "Deployment", named("grafana"))))
    assert env["INFERGATE_PROMETHEUS_URL"] == "http://p"


# -- the chart's copies of repository files --------------------------------------------------

COPIES = {
    "prometheus.yml": "deployments/prometheus.yml",
    "alerts.yml": "deployments/alerts.yml",
    "grafana/provisioning/datasources/infergate.yml": (
        "deployments/grafana/provisioning/datasources/infergate.yml"
    ),
    "grafana/provisioning/dashboards/infergate.yml": (
        "deployments/grafana/provisioning/dashboards/infergate.yml"
    ),
}


def test_copied_files_equal_their_originals():
    """Helm reads only files inside the chart; files/README.md says how to refresh them."""
    copies = dict(COPIES)
    dashboards = sorted((PROJECT_ROOT / "dashboards").glob("*.json"))
    copies.update({f"dashboards/{p.name}": f"dashboards/{p.name}" for p in dashboards})
    stale = [
        copy
        for copy, original in copies.items()
        if not (FILES / copy).is_file()
        or (FILES / copy).read_bytes() != (PROJECT_ROOT / original).read_bytes()
    ]
    extra = sorted(
        str(p.relative_to(FILES))
        for p in FILES.rglob("*")
        if p.is_file() and p.name != "README.md" and str(p.relative_to(FILES)) not in copies
    )
    assert not stale and not extra, (
        f"helm/infergate/files/ differs from the repository: stale {stale}, extra {extra}; "
        "refresh it as helm/infergate/files/README.md says"
    )


def test_mlflow_runs_its_auth_app_and_the_platform_signs_in():
    manifests = render("defaults")
    mlflow = container(find(manifests, "Deployment", named("mlflow")))
    assert mlflow["command"][:2] == ["sh", "-c"] and "--app-name=basic-auth" in mlflow["command"][2]
    env = env_of(mlflow)
    auth_secret = named("mlflow-auth")
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"]["secretKeyRef"] == {
        "name": auth_secret,
        "key": "admin-password",
    }
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"]["secretKeyRef"]["key"] == "secret-key"
    secret = find(manifests, "Secret", auth_secret)
    assert set(secret["data"]) == {"admin-password", "secret-key"}
    control_plane = env_of(container(find(manifests, "Deployment", named("control-plane"))))
    assert control_plane["MLFLOW_TRACKING_USERNAME"] == "admin"
    assert control_plane["MLFLOW_TRACKING_PASSWORD"]["secretKeyRef"]["name"] == auth_secret
    spec = find(manifests, "RayService")["spec"]["rayClusterConfig"]
    pods = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for pod in pods:
        ray_env = env_of(pod["template"]["spec"]["containers"][0])
        assert ray_env["MLFLOW_TRACKING_USERNAME"] == "admin"  # replicas download artifacts
    off = render({"mlflow": {"auth": {"enabled": False}}})
    plain = container(find(off, "Deployment", named("mlflow")))
    assert plain["command"] == ["mlflow", "server"] and "MLFLOW_AUTH_ADMIN_PASSWORD" not in (
        env_of(plain)
    )
    assert "MLFLOW_TRACKING_USERNAME" not in env_of(
        container(find(off, "Deployment", named("control-plane")))
    )

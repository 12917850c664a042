"""deployments/compose.yaml, checked without Docker: it parses and interpolates as Compose
would, every service has an image or a build, everything it references exists, host ports are
unique, its Prometheus config is deployments/prometheus.yml with the services' addresses (and
passes promtool), its Serve config matches the Helm chart's, and the control plane's settings
are ones config.py knows. Where a Docker Compose binary is installed, it validates the file too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python
import pytest
import yaml

from infergate.config import PROJECT_ROOT, FrontendSettings, load_config
from infergate.errors import InvalidConfig
from infergate.stack.ray_start import grpc_message_limit
from prometheus_server import PROMTOOL

DEPLOYMENTS = PROJECT_ROOT / "deployments"
COMPOSE_FILE = DEPLOYMENTS / "compose.yaml"
REQUIRED = {"INFERGATE_ADMIN_TOKEN": "test-token", "MLFLOW_ADMIN_PASSWORD": "test-password"}

PENDING_FRONTEND_ARGS: set[str] = set()


# -- Compose's variable interpolation (https://docs.docker.com/compose/how-tos/environment-
# variables/variable-interpolation/): $$ is a literal $, ${VAR}, ${VAR:-default},
# ${VAR-default}, ${VAR:?error}, ${VAR?error} and $VAR.

_REFERENCE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_]\w*))")
_BRACED = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>.*))?", re.DOTALL)


class MissingVariable(Exception):
    pass


def interpolate_text(text: str, env: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["named"]:
            return env.get(match["named"], "")
        braced = _BRACED.fullmatch(match["braced"])
        assert braced, f"malformed reference {match[0]!r}"
        name, op, arg = braced["name"], braced["op"], braced["arg"]
        value = env.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in (":-", "-"):
            return arg if unset else value
        if op in (":?", "?") and unset:
            raise MissingVariable(f"{name}: {arg}")
        return value or ""

    return _REFERENCE.sub(replace, text)


def interpolate(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate_text(node, env)
    if isinstance(node, list):
        return [interpolate(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    return node


def variables(node: Any) -> set[str]:
    """Names of the variables the file reads."""
    if isinstance(node, str):
        names = set()
        for match in _REFERENCE.finditer(node):
            if match["named"]:
                names.add(match["named"])
            elif match["braced"] is not None:
                names.add(_BRACED.fullmatch(match["braced"])["name"])
        return names
    if isinstance(node, list):
        return set().union(*(variables(item) for item in node))
    if isinstance(node, dict):
        return set().union(*(variables(value) for value in node.values()))
    return set()


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def compose(raw) -> dict[str, Any]:
    """The file as Compose sees it with only the required variables set."""
    return interpolate(raw, dict(REQUIRED))


def env_of(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {key: str(value) for key, value in environment.items()}


def config_content(compose: dict[str, Any], name: str) -> dict[str, Any]:
    return yaml.safe_load(compose["configs"][name]["content"])


# -- the file itself -------------------------------------------------------------------------


def test_every_service_has_an_image_or_a_build(compose):
    assert compose["services"]
    for name, service in compose["services"].items():
        assert "image" in service or "build" in service, name
    expected = {"postgres", "mlflow", "triton", "ray-head", "control-plane", "prometheus"}
    assert expected | {"grafana"} == set(compose["services"])


def test_the_only_required_variables_are_the_two_secrets_and_all_are_documented(raw):
    for missing in REQUIRED:  # each one alone stops Compose with a line that names it
        others = {name: value for name, value in REQUIRED.items() if name != missing}
        with pytest.raises(MissingVariable, match=missing):
            interpolate(raw, others)
    interpolate(raw, dict(REQUIRED))
    header = "".join(
        line for line in COMPOSE_FILE.read_text().splitlines(True) if line.startswith("#")
    )
    # $$-escaped shell variables are not Compose's.
    undocumented = {name for name in variables(raw) if name not in header}
    assert not undocumented, f"variables the header comment does not explain: {undocumented}"


def test_referenced_files_exist(compose):
    for name, service in compose["services"].items():
        build = service.get("build")
        if build:
            context = (DEPLOYMENTS / build["context"]).resolve()
            assert context.is_dir(), f"{name}: build context {context}"
            dockerfile = build.get("dockerfile_inline", "")
            for line in dockerfile.splitlines():
                words = line.split()
                if words[:1] == ["COPY"]:
                    sources = [w for w in words[1:-1] if not w.startswith("--")]
                    for source in sources:
                        assert (context / source).exists(), f"{name}: COPY {source}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (DEPLOYMENTS / source).exists(), f"{name}: mounts missing {source}"
    for name, config in compose["configs"].items():
        if "file" in config:
            assert (DEPLOYMENTS / config["file"]).is_file(), f"config {name}: {config['file']}"
        else:
            yaml.safe_load(config["content"])


def published_ports(service: dict[str, Any]) -> list[tuple[str, int]]:
    ports = []
    for port in service.get("ports", []):
        parts = str(port).split(":")
        host_ip = parts[0] if len(parts) == 3 else "0.0.0.0"
        ports.append((host_ip, int(parts[-2])))
    return ports


def test_published_host_ports_are_unique(compose):
    published = [p for service in compose["services"].values() for p in published_ports(service)]
    numbers = [port for _, port in published]
    assert len(numbers) == len(set(numbers)), sorted(numbers)
    # Only the inference endpoints (HTTP and gRPC) listen beyond the machine itself.
    assert [p for p in published if p[0] != "127.0.0.1"] == [("0.0.0.0", 8000), ("0.0.0.0", 9000)]


def test_volumes_configs_and_dependencies_are_declared(compose):
    services = compose["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
        for config in service.get("configs", []):
            assert config["source"] in compose["configs"], f"{name}: {config['source']}"
        depends_on = service.get("depends_on", {})
        if isinstance(depends_on, list):
            depends_on = {dependency: {} for dependency in depends_on}
        for dependency, condition in depends_on.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition.get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


def test_versions_reach_triton_with_their_loads_not_through_a_shared_volume(compose):
    triton, control_plane = compose["services"]["triton"], compose["services"]["control-plane"]
    assert triton["tmpfs"] == ["/models"] and "volumes" not in triton
    assert "--model-repository=/models" in triton["command"]
    assert "--model-control-mode=explicit" in triton["command"]
    assert "--load-model=*" not in triton["command"]
    # Its only volume holds the API keys.
    assert [v.split(":")[0] for v in control_plane["volumes"]] == ["api-keys"]
    env = env_of(control_plane)
    assert "INFERGATE_TRITON__REPOSITORY_DIR" not in env
    assert (env["INFERGATE_TRITON__EXTERNAL_HOST"], env["INFERGATE_TRITON__BACKEND"]) == (
        "triton",
        "onnxruntime",
    )


def test_triton_runs_on_cpu_unless_asked_for_gpus(raw):
    default = interpolate(raw, dict(REQUIRED))["services"]
    assert default["triton"]["runtime"] == "runc"
    assert "--allow-gpu-metrics=false" in default["triton"]["command"]
    assert env_of(default["control-plane"])["INFERGATE_TRITON__GPU"] == "false"
    gpu = interpolate(raw, {**REQUIRED, "TRITON_RUNTIME": "nvidia", "TRITON_GPU": "true"})
    assert gpu["services"]["triton"]["runtime"] == "nvidia"
    assert env_of(gpu["services"]["control-plane"])["INFERGATE_TRITON__GPU"] == "true"


# -- what the platform must accept -----------------------------------------------------------


def infergate_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the infergate image (built by this file)."""
    return {name: s for name, s in compose["services"].items() if "build" in s}


def test_every_infergate_setting_is_known_to_config(compose):
    services = infergate_services(compose)
    assert {"control-plane", "ray-head"} <= set(services)
    for service_name, service in services.items():
        rejected = set()
        for name, value in env_of(service).items():
            if name.startswith("INFERGATE_"):
                try:
                    load_config(Path("/nonexistent.yaml"), environ={name: value})
                except InvalidConfig:
                    rejected.add(name)
        assert rejected == set(), f"{service_name}: settings config.py refuses: add them there"
    env = env_of(services["control-plane"])
    config = load_config(Path("/nonexistent.yaml"), environ={k: str(v) for k, v in env.items()})
    assert config.triton.grpc_url == "triton:8001"
    assert env["INFERGATE_MLFLOW__TRACKING_URI"] == "http://mlflow:5000"
    assert env["INFERGATE_TRITON__EXTERNAL_HOST"] in compose["services"]


def test_replicas_send_no_call_larger_than_tritons_batch(compose):
    # The control plane writes Triton's model configs from deployments/local.yaml and its
    # environment; Triton refuses a call of more rows than their max_batch_size.
    env = env_of(compose["services"]["control-plane"])
    known = {k: v for k, v in env.items() if k.startswith("INFERGATE_")}
    triton = load_config(environ=known).triton
    args = config_content(compose, "serve")["applications"][0]["args"]
    assert args["batch_max_rows"] <= triton.max_batch_size


def helm_serve_config() -> dict[str, Any]:
    with helm_python.Chart.load(PROJECT_ROOT / "helm" / "infergate") as chart:
        files = chart.render(None, name="demo", namespace="ml")
    rayservice = yaml.safe_load(files["infergate/templates/rayservice.yaml"].split("\n---")[0])
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


def test_serve_config_is_valid_and_matches_the_helm_chart(compose):
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeDeploySchema

    config = config_content(compose, "serve")
    ServeDeploySchema.model_validate(config)
    (app,) = config["applications"]
    chart_config = helm_serve_config()
    (chart_app,) = chart_config["applications"]
    # The gRPC ingress as the chart's, published, and its message limit as the local stack's.
    assert config["grpc_options"] == chart_config["grpc_options"]
    assert (
        f"{config['grpc_options']['port']}:{config['grpc_options']['port']}"
        in (compose["services"]["ray-head"]["ports"])
    )
    limit = grpc_message_limit(app["args"]["max_body_bytes"])
    assert env_of(compose["services"]["ray-head"])["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"] == str(limit)
    for key in ("name", "import_path", "route_prefix"):
        assert app[key] == chart_app[key], key
    assert set(app["args"]) == set(chart_app["args"])
    (deployment,) = app["deployments"]
    (chart_deployment,) = chart_app["deployments"]
    assert deployment["name"] == chart_deployment["name"]
    assert set(deployment) == set(chart_deployment)
    assert deployment["logging_config"] == chart_deployment["logging_config"]
    AutoscalingConfig.model_validate(deployment["autoscaling_config"])
    # The args name services of this file.
    args = app["args"]
    services = compose["services"]
    assert args["triton_grpc_url"].split(":")[0] in services
    assert urlsplit(args["tracking_uri"]).hostname in services
    assert urlsplit(args["metrics_federate_url"]).hostname in services
    # The control plane publishes traffic tables into the Ray cluster as a Ray client.
    ray_address = services["control-plane"]["environment"]["RAY_ADDRESS"]
    assert urlsplit(ray_address).hostname == "ray-head"
    assert set(args) - set(FrontendSettings.model_fields) == PENDING_FRONTEND_ARGS
    ray_head = services["ray-head"]
    assert env_of(ray_head)["TOKENIZERS_PARALLELISM"] == "false"  # as the local stack's workers
    assert {"source": "serve", "target": "/etc/infergate/serve.yaml"} in ray_head["configs"]
    assert "/etc/infergate/serve.yaml" in ray_head["command"][-1]


# -- API keys --------------------------------------------------------------------------------

KEYS_VOLUME = "api-keys"


def one_line(text: str) -> str:
    """Commands as a shell reads them: line continuations (in comments too) and runs of
    spaces gone."""
    return re.sub(r" +", " ", re.sub(r"\\\n#?\s*", " ", text))


def test_api_keys_are_on_for_the_replicas_and_the_control_plane(compose):
    args = config_content(compose, "serve")["applications"][0]["args"]
    path = FrontendSettings.model_validate(args).api_keys_file
    assert path is not None and path.name == "api-keys.yaml"
    services = compose["services"]
    mounts = {}
    for name in ("ray-head", "control-plane"):
        env = env_of(services[name])
        assert load_config(Path("/nonexistent.yaml"), environ=env).frontend.api_keys_file == path
        (mount,) = [v for v in services[name]["volumes"] if v.startswith(f"{KEYS_VOLUME}:")]
        # The folder: a single-file mount would not see `infergate keys` replace the file.
        mounts[name] = mount.split(":")[1:]
    assert mounts == {"ray-head": [str(path.parent), "ro"], "control-plane": [str(path.parent)]}
    assert KEYS_VOLUME in compose["volumes"]
    # A new named volume takes the owner of the image's folder: the image's user "ray" then
    # writes the file with `keys create` (mode 0600) and reads it in every container.
    dockerfile = compose["x-infergate"]["build"]["dockerfile_inline"]
    assert re.search(rf"mkdir -p [^\n]*{path.parent}", dockerfile)
    assert re.search(rf"chown ray:users [^\n]*{path.parent}", one_line(dockerfile))


def test_the_command_that_makes_the_first_key_is_documented_and_checked(compose):
    create = (
        "docker compose -f deployments/compose.yaml run --rm --no-deps control-plane "
        "infergate keys create admin"
    )
    header = "".join(
        line for line in COMPOSE_FILE.read_text().splitlines(True) if line.startswith("#")
    )
    assert create in one_line(header)
    assert create in one_line((PROJECT_ROOT / "docs/beyond-one-machine.md").read_text())
    # The Ray head refuses to start without the file, saying how to make it.
    ray_head = compose["services"]["ray-head"]
    script = ray_head["command"][-1]
    assert '[ ! -s "$INFERGATE_FRONTEND__API_KEYS_FILE" ]' in script and create in script
    # The key create writes goes where the replicas read: the command needs no --file.
    from infergate.cli import build_parser

    args = build_parser().parse_args(create.split("control-plane ", 1)[1].split()[1:])
    assert args.file is None and args.id == "admin"


# -- monitoring ------------------------------------------------------------------------------


def scrape_addresses(compose: dict[str, Any]) -> dict[str, str]:
    """The placeholders of deployments/prometheus.yml, as this file's services answer them."""
    ray_head = compose["services"]["ray-head"]
    metrics_port = re.search(r"--metrics-export-port=(\d+)", ray_head["command"][-1])[1]
    haproxy_port = env_of(ray_head)["RAY_SERVE_HAPROXY_METRICS_PORT"]
    return {
        "TRITON_METRICS": "triton:8002",  # Triton's default metrics port
        "RAY_METRICS": f"ray-head:{metrics_port}",
        "HAPROXY_METRICS": f"ray-head:{haproxy_port}",
    }


def test_prometheus_config_is_the_repository_one_with_service_addresses(compose):
    text = (DEPLOYMENTS / "prometheus.yml").read_text()
    for name, address in scrape_addresses(compose).items():
        text = text.replace("${" + name + "}", address)
    assert config_content(compose, "prometheus") == yaml.safe_load(text), (
        "the prometheus config in compose.yaml drifted from deployments/prometheus.yml"
    )
    prometheus = compose["services"]["prometheus"]
    targets = {c["source"]: c["target"] for c in prometheus["configs"]}
    assert targets == {
        "prometheus": "/etc/prometheus/prometheus.yml",
        "alerts": "/etc/prometheus/alerts.yml",
    }
    assert compose["configs"]["alerts"]["file"] == "./alerts.yml"


@pytest.mark.machine(
    "prometheus", None if PROMTOOL else "promtool not installed (Debian package prometheus)"
)
def test_prometheus_config_passes_promtool(compose, tmp_path):
    (tmp_path / "prometheus.yml").write_text(compose["configs"]["prometheus"]["content"])
    shutil.copy(DEPLOYMENTS / "alerts.yml", tmp_path / "alerts.yml")
    result = subprocess.run(
        [str(PROMTOOL), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = yaml.safe_load((DEPLOYMENTS / "alerts.yml").read_text())
    rules = sum(len(group["rules"]) for group in alerts["groups"])
    assert f"SUCCESS: {rules} rules found" in result.stdout


def test_grafana_is_provisioned_from_the_repository(compose):
    grafana = compose["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    env = env_of(grafana)
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["../dashboards"] == env["INFERGATE_DASHBOARDS_DIR"]
    assert sorted((DEPLOYMENTS / "../dashboards").glob("*.json"))
    assert env["INFERGATE_PROMETHEUS_URL"] == "http://prometheus:9090"
    assert "--web.listen-address" not in str(compose["services"]["prometheus"]["command"])


# -- Docker Compose itself, where installed --------------------------------------------------


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


COMPOSE = compose_command()


@pytest.mark.machine(
    "compose", None if COMPOSE else "neither `docker compose` nor docker-compose is installed"
)
def test_docker_compose_accepts_the_file():
    assert COMPOSE is not None
    env = {**os.environ, **REQUIRED}
    command = [*COMPOSE, "-f", str(COMPOSE_FILE), "config", "--quiet"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    del env["INFERGATE_ADMIN_TOKEN"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0 and "INFERGATE_ADMIN_TOKEN" in result.stderr

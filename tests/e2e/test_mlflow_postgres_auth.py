"""The registry as production runs it: MLflow on PostgreSQL with its own authentication.

PostgreSQL is started as an operator would (Debian's binaries, its own user); `infergate
up` starts MLflow on it with mlflow.auth. The platform signs in as the admin; MLflow's own
clients prove that nobody else moves an alias: anonymous calls get 401, a user with the
default READ permission 403, and what the admin sets is served."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import Stack, running_stack, stack_env, wait_for
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException
from mlflow.server import get_app_client

from postgres_server import Postgres, running_postgres, unavailable
from tiny_models import tiny_bert

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.machine("postgres", unavailable()),
]
MODEL = "guarded"
ADMIN_PASSWORD = "admin-test-password-1"
READER_PASSWORD = "reader-password-1"  # MLflow asks for 12 characters at least
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def stack(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state_dir = tmp_path_factory.mktemp("registry-stack")
    env = stack_env(state_dir)
    # A URI with "%" in it (a quoted space), which the users' store must take as given.
    env["INFERGATE_MLFLOW__BACKEND_STORE_URI"] = (
        postgres.create_database("mlflow", "mlflow", "mlflow-db-password")
        + "?application_name=infergate%20registry"
    )
    env["PGPASSWORD"] = "mlflow-db-password"
    env["INFERGATE_MLFLOW__AUTH"] = "true"
    env["MLFLOW_AUTH_ADMIN_PASSWORD"] = ADMIN_PASSWORD
    env["INFERGATE_PROMETHEUS__ENABLED"] = "false"
    for name in CREDENTIALS:  # the platform signs in as the admin by default
        env.pop(name, None)
    with running_stack(state_dir, env) as running:
        yield running


def as_user(monkeypatch: pytest.MonkeyPatch, user: str | None, password: str = "") -> None:
    """MLflow's clients read their credentials from these variables at each call."""
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    if user is not None:
        monkeypatch.setenv(CREDENTIALS[0], user)
        monkeypatch.setenv(CREDENTIALS[1], password)


def test_a_model_registered_by_the_admin_is_stored_in_postgres_and_served(
    postgres, stack, tmp_path
):
    folder = tiny_bert(tmp_path / "source", "text-classification")
    env = {**stack.env, CREDENTIALS[0]: "admin", CREDENTIALS[1]: ADMIN_PASSWORD}
    register = [stack.infergate, "register", str(folder), "--name", MODEL, "--task",
                "text-classification", "--alias", "champion", "--quiet",
                "--tracking-uri", stack.mlflow]  # fmt: skip
    done = subprocess.run(register, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert postgres.sql("SELECT name FROM registered_models", database="mlflow") == MODEL
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        url = f"/v1/models/{MODEL}/predict"
        answered = wait_for(
            lambda: (r := http.post(url, json={"inputs": "good film"})).status_code == 200 and r,
            90, "the registered model served",
        )  # fmt: skip
    assert answered.headers["x-model-version"] == "1"


def test_nobody_without_the_permission_moves_an_alias(postgres, stack, monkeypatch):
    as_user(monkeypatch, None)
    with pytest.raises((MlflowException, RestException), match=r"401|nauthori|credentials"):
        MlflowClient(stack.mlflow).set_registered_model_alias(MODEL, "champion", "1")
    as_user(monkeypatch, "admin", ADMIN_PASSWORD)
    users = get_app_client("basic-auth", tracking_uri=stack.mlflow)
    users.create_user("reader", READER_PASSWORD)
    # The users live in the registry's own database, beside the models (no local file).
    stored = postgres.sql("SELECT username FROM users ORDER BY username", database="mlflow")
    assert stored.split() == ["admin", "reader"], stored
    assert not list(stack.state_dir.rglob("basic_auth.db"))
    as_user(monkeypatch, "reader", READER_PASSWORD)
    reader = MlflowClient(stack.mlflow)
    assert reader.get_registered_model(MODEL).aliases == {"champion": "1"}  # READ: yes
    with pytest.raises((MlflowException, RestException), match=r"403|ermission"):
        reader.set_registered_model_alias(MODEL, "canary", "1")


def test_the_admins_alias_change_reaches_the_platform(stack, monkeypatch, tmp_path):
    as_user(monkeypatch, "admin", ADMIN_PASSWORD)
    client = MlflowClient(stack.mlflow)
    first = client.get_model_version(MODEL, "1")  # a new version of the same files
    version = client.create_model_version(
        MODEL, first.source, run_id=first.run_id, tags=first.tags
    ).version
    client.set_registered_model_alias(MODEL, "canary", version)
    with httpx.Client(base_url=stack.url, timeout=30) as http:

        def canary_served() -> bool:
            versions = http.get(f"/v1/models/{MODEL}").json().get("versions", [])
            return any(v["version"] == version and v["role"] == "canary" for v in versions)

        wait_for(canary_served, 60, "the canary set by the admin served")


def test_the_helm_charts_mlflow_command_runs_its_auth_app_on_postgres(
    postgres, tmp_path, monkeypatch
):
    """The chart's MLflow container, run here as Kubernetes would run it: its command,
    arguments and environment as rendered, with the secrets' values and this machine's
    port filled in."""
    import helm_python

    from infergate.config import PROJECT_ROOT
    from infergate.stack.processes import free_ports, http_ok, spawn, wait_until

    values = {"postgresql": {"enabled": False},
              "mlflow": {"backendStore": {"existingSecret": "db", "uriKey": "uri"}}}  # fmt: skip
    with helm_python.Chart.load(PROJECT_ROOT / "helm" / "infergate") as chart:
        files = chart.render(values, name="demo", namespace="ml")
    (deployment,) = [
        doc
        for doc in yaml.safe_load_all(files["infergate/templates/mlflow.yaml"])
        if doc and doc["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    [port] = free_ports(1)
    secrets = {
        # A password with "%", URL-quoted in the URI as an operator would write it.
        "MLFLOW_BACKEND_STORE_URI": postgres.create_database(
            "chart", "chart", "chart-db%pw-1"
        ).replace("chart@", "chart:chart-db%25pw-1@"),
        "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "a-test-secret-key",
    }
    env = {**os.environ}
    for entry in container["env"]:
        env[entry["name"]] = secrets.get(entry["name"], entry.get("value", ""))
    env["MLFLOW_AUTH_CONFIG_PATH"] = str(tmp_path / "basic_auth.ini")
    args = [
        a.replace("0.0.0.0", "127.0.0.1")
        .replace("--port=5000", f"--port={port}")
        .replace("/mlflow/artifacts", str(tmp_path / "artifacts"))
        for a in container["args"]
    ]
    bindir = str(Path(sys.executable).parent)  # the image's PATH has mlflow: here, the venv's
    env["PATH"] = f"{bindir}:{env['PATH']}"
    server = spawn("chart-mlflow", [*container["command"], *args], tmp_path, env)
    try:
        uri = f"http://127.0.0.1:{port}"
        wait_until(server, lambda: http_ok(f"{uri}/health"), 90, "the chart's MLflow")
        as_user(monkeypatch, None)
        with pytest.raises((MlflowException, RestException), match=r"401|nauthori|credentials"):
            MlflowClient(uri).create_registered_model("chart-model")
        as_user(monkeypatch, "admin", ADMIN_PASSWORD)
        MlflowClient(uri).create_registered_model("chart-model")
    finally:
        server.stop()
    tables = postgres.sql("SELECT tablename FROM pg_tables WHERE schemaname='public'", "chart")
    assert {"registered_models", "users", "alembic_version_auth"} <= set(tables.split())

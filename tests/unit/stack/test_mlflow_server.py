"""How `infergate up` runs MLflow: backend store, authentication, the platform's own
credentials. Started for real, on PostgreSQL with auth: tests/e2e/test_mlflow_postgres_auth.py."""

import configparser
from pathlib import Path

import pytest

from infergate.config import MlflowSettings
from infergate.errors import StackError
from infergate.stack import mlflow_server


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_sqlite_in_the_store_folder_unless_another_backend_store_is_named(tmp_path):
    local = mlflow_server.server_command(MlflowSettings(store_dir=tmp_path))
    assert option(local, "--backend-store-uri") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert option(local, "--artifacts-destination") == str(tmp_path / "artifacts")
    assert "--app-name" not in local
    uri = "postgresql://mlflow@db.internal:5432/mlflow"
    remote = mlflow_server.server_command(
        MlflowSettings(store_dir=tmp_path, backend_store_uri=uri, auth=True)
    )
    assert option(remote, "--backend-store-uri") == uri
    assert option(remote, "--app-name") == "basic-auth"


def test_auth_keeps_its_users_in_the_store_and_needs_a_first_admin_password(tmp_path):
    settings = MlflowSettings(store_dir=tmp_path, auth=True)
    with pytest.raises(StackError, match="MLFLOW_AUTH_ADMIN_PASSWORD"):
        mlflow_server.server_environment(settings, {})
    env = mlflow_server.server_environment(settings, {"MLFLOW_AUTH_ADMIN_PASSWORD": "pw"})
    ini = configparser.ConfigParser()
    ini.read(env["MLFLOW_AUTH_CONFIG_PATH"])
    assert ini["mlflow"]["database_uri"] == f"sqlite:///{tmp_path / 'basic_auth.db'}"
    assert ini["mlflow"]["default_permission"] == "READ"
    assert ini["mlflow"]["admin_username"] == "admin"
    (tmp_path / "basic_auth.db").touch()  # the admin exists: no password needed again
    assert mlflow_server.server_environment(settings, {})["MLFLOW_AUTH_CONFIG_PATH"]


def test_auth_keeps_its_users_in_the_backend_store_database_when_one_is_named(tmp_path):
    uri = "postgresql://mlflow:p%40ss%25w@db.internal:5432/mlflow"  # "p@ss%w", URL-quoted
    settings = MlflowSettings(store_dir=tmp_path, backend_store_uri=uri, auth=True)
    env = mlflow_server.server_environment(settings, {})  # MLflow checks the admin there
    ini = configparser.ConfigParser()  # as MLflow reads it, interpolation included
    ini.read(env["MLFLOW_AUTH_CONFIG_PATH"])
    assert ini["mlflow"]["database_uri"] == uri
    assert Path(env["MLFLOW_AUTH_CONFIG_PATH"]).stat().st_mode & 0o077 == 0
    assert not (tmp_path / "basic_auth.db").exists()


def test_without_auth_the_environment_only_allows_local_webhooks(tmp_path):
    env = mlflow_server.server_environment(MlflowSettings(store_dir=tmp_path), {"A": "b"})
    assert env["A"] == "b" and env["MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS"] == "true"
    assert "MLFLOW_AUTH_CONFIG_PATH" not in env
    key = env["MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"]
    assert (
        mlflow_server.server_environment(MlflowSettings(store_dir=tmp_path), {})[
            "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"
        ]
        == key
    )  # kept across restarts


def test_the_platform_signs_in_as_the_admin_unless_told_otherwise():
    auth = MlflowSettings(auth=True)
    environ = {"MLFLOW_AUTH_ADMIN_PASSWORD": "pw"}
    mlflow_server.client_credentials(auth, environ)
    assert environ["MLFLOW_TRACKING_USERNAME"] == "admin"
    assert environ["MLFLOW_TRACKING_PASSWORD"] == "pw"
    own = {"MLFLOW_TRACKING_USERNAME": "platform", "MLFLOW_TRACKING_PASSWORD": "secret"}
    mlflow_server.client_credentials(auth, own)
    assert own == {"MLFLOW_TRACKING_USERNAME": "platform", "MLFLOW_TRACKING_PASSWORD": "secret"}
    untouched: dict[str, str] = {}
    mlflow_server.client_credentials(MlflowSettings(), untouched)
    assert untouched == {}

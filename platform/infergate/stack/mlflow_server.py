"""How `infergate up` runs the MLflow server: its command line and environment.

The backend store is SQLite in ``mlflow.store_dir`` unless ``mlflow.backend_store_uri``
names another (PostgreSQL for a production registry: webhooks need a SQL store either
way). Artifacts live in ``store_dir/artifacts``, served through the server. With
``mlflow.auth`` the server runs MLflow's basic-auth app: nobody without a password reads
or moves an alias. Its users live in the backend store's database when
``mlflow.backend_store_uri`` names one (MLflow keeps them in tables of their own, with a
migration table of their own), as in the Helm chart, so that every MLflow server on that
database knows them; else in ``store_dir/basic_auth.db``.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path

from infergate.config import MlflowSettings
from infergate.errors import StackError

ADMIN_USERNAME = "admin"
ENVIRONMENT = {
    # Webhooks to a platform on localhost need both (MLflow blocks private hosts by default).
    "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
    "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
    # The job runner's worker processes are not needed and cost a lot on a small machine.
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}


def server_command(settings: MlflowSettings) -> list[str]:
    """``mlflow server`` on the settings' backend store, local artifacts, one worker."""
    store_dir = settings.store_dir.resolve()
    backend = settings.backend_store_uri or f"sqlite:///{store_dir / 'mlflow.db'}"
    command = [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        "--backend-store-uri",
        backend,
        "--artifacts-destination",
        str(store_dir / "artifacts"),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--workers",
        "1",
    ]
    if settings.auth:
        command += ["--app-name", "basic-auth"]
    return command


def server_environment(settings: MlflowSettings, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` plus what the server needs: webhooks to this machine, the key of its stored
    webhook secrets, and with auth the config of its user store.

    Raises:
        StackError: auth asked for, but no admin password to create the admin with.
    """
    settings.store_dir.mkdir(parents=True, exist_ok=True)
    env = {**base, **ENVIRONMENT}
    env["MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"] = _webhook_encryption_key(settings.store_dir)
    if settings.auth:
        users = settings.backend_store_uri
        if users is None:
            users_file = settings.store_dir / "basic_auth.db"
            users = f"sqlite:///{users_file.resolve()}"
            # (A database's users cannot be looked at from here: MLflow itself refuses to
            # start there without the password of an admin it has yet to create.)
            if not users_file.exists() and not base.get("MLFLOW_AUTH_ADMIN_PASSWORD"):
                raise StackError(
                    "mlflow.auth is on and the user store is new: set "
                    "MLFLOW_AUTH_ADMIN_PASSWORD to the password of the MLflow user "
                    f"{ADMIN_USERNAME!r} it creates"
                )
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(_auth_config(settings.store_dir, users))
        # Signs the auth app's CSRF tokens; kept so that a restart does not void them.
        if not base.get("MLFLOW_FLASK_SERVER_SECRET_KEY"):
            env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = _kept_secret(
                settings.store_dir / "flask-secret.key", lambda: secrets.token_urlsafe(32)
            )
    return env


def client_credentials(settings: MlflowSettings, environ: MutableMapping[str, str]) -> None:
    """With auth, the platform's own MLflow clients (this process, the Ray workers and
    commands it starts) sign in as MLFLOW_TRACKING_USERNAME, by default the admin."""
    if not settings.auth:
        return
    environ.setdefault("MLFLOW_TRACKING_USERNAME", ADMIN_USERNAME)
    password = environ.get("MLFLOW_AUTH_ADMIN_PASSWORD")
    if environ["MLFLOW_TRACKING_USERNAME"] == ADMIN_USERNAME and password:
        environ.setdefault("MLFLOW_TRACKING_PASSWORD", password)


def _auth_config(store_dir: Path, users: str) -> Path:
    """MLflow's basic-auth settings: users in the database ``users``; a user may read what
    it was not given more of; the admin's password comes from MLFLOW_AUTH_ADMIN_PASSWORD."""
    path = store_dir / "basic_auth.ini"
    path.write_text(
        "[mlflow]\n"
        "default_permission = READ\n"
        # MLflow reads it with configparser, where "%" starts an interpolation.
        f"database_uri = {users.replace('%', '%%')}\n"
        f"admin_username = {ADMIN_USERNAME}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    path.chmod(0o600)  # the database's URI may hold its password
    return path


def _webhook_encryption_key(store_dir: Path) -> str:
    """MLflow encrypts webhook secrets with this key. Without one it draws a new key per
    server process and cannot read the webhooks it stored before a restart (HTTP 500)."""

    def fernet_key() -> str:
        from cryptography.fernet import Fernet

        return Fernet.generate_key().decode()

    return _kept_secret(store_dir / "webhook-encryption.key", fernet_key)


def _kept_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret kept in ``path``, made (and written, readable by us only) the first time."""
    if not path.exists():
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()

"""Whatever a client sends the admin API, it gets a 4xx in the one JSON error shape, never
a 500: webhook headers and bodies from anyone who can reach the port, commands with any
token."""

import orjson
import pytest
from starlette.testclient import TestClient

from infergate.control.admin import AdminApi
from infergate.control.webhooks import sign, verify
from infergate.errors import Unauthorized

WEBHOOK = "/admin/webhooks/mlflow"
BODY = orjson.dumps({"entity": "model_version", "action": "created",
                     "data": {"name": "m", "version": "3"}})  # fmt: skip


class Rollouts:
    """Answers a status and takes a new version; what the commands do to the registry is
    tested elsewhere (test_admin_fuzz.py runs them against a registry in memory)."""

    def status(self, name: str):
        return type("Status", (), {"to_dict": lambda self: {"model": name}})()

    def on_version_created(self, name: str, version: str) -> None:
        pass


@pytest.fixture
def client():
    admin = AdminApi(Rollouts(), lambda: None, token="t0k", webhook_secret="s",
                     clock=lambda: 1000.0)  # fmt: skip
    return TestClient(admin.app, raise_server_exceptions=False)


def signed(body: bytes = BODY, delivery_id: str = "d1") -> dict[str, bytes]:
    return {
        "x-mlflow-signature": sign("s", delivery_id, "1000", body).encode(),
        "x-mlflow-delivery-id": delivery_id.encode(),
        "x-mlflow-timestamp": b"1000",
    }


@pytest.mark.parametrize("signature", ["v1,\xe9t\xe9", "\u00ff" * 44, "v1,AAAA\x80"])
def test_a_non_ascii_signature_is_refused_like_any_bad_one(signature):
    headers = {"x-mlflow-signature": signature, "x-mlflow-delivery-id": "d1",
               "x-mlflow-timestamp": "1000"}  # fmt: skip
    with pytest.raises(Unauthorized, match="signature does not match"):
        verify("s", headers, BODY, now=1000)


def test_a_signature_header_of_non_ascii_bytes_gets_a_401(client):
    headers = {**signed(), "x-mlflow-signature": "v1,sïgné".encode()}
    answer = client.post(WEBHOOK, content=BODY, headers=headers)
    assert answer.status_code == 401
    assert answer.json() == {"error": "webhook signature does not match", "type": "unauthorized"}


def test_an_authorization_header_of_non_ascii_bytes_gets_a_401(client):
    answer = client.get("/admin/models/m/rollout", headers={"authorization": "Bearer tök".encode()})
    assert answer.status_code == 401 and answer.json()["type"] == "unauthorized"


def test_a_non_ascii_admin_token_works():
    admin = AdminApi(Rollouts(), lambda: None, token="tök", webhook_secret="s")
    client = TestClient(admin.app)
    answer = client.get("/admin/models/m/rollout", headers={"authorization": "Bearer tök".encode()})
    assert answer.json() == {"model": "m"}


def test_a_timestamp_past_any_float_gets_a_401(client):
    headers = {**signed(), "x-mlflow-timestamp": b"1" + b"0" * 400}
    answer = client.post(WEBHOOK, content=BODY, headers=headers)
    assert answer.status_code == 401 and "is not a Unix time" in answer.json()["error"]


@pytest.mark.parametrize(
    "event",
    [
        {"entity": "model_version", "action": "created", "data": []},
        {"entity": "model_version", "action": "created", "data": None},
        {"entity": ["model_version"], "action": "created"},
        {"entity": "model_version", "action": 1},
    ],
)
def test_a_signed_body_that_is_no_mlflow_event_gets_a_400(client, event):
    body = orjson.dumps(event)
    answer = client.post(WEBHOOK, content=body, headers=signed(body))
    assert answer.status_code == 400
    assert answer.json() == {"error": "webhook body is not an MLflow event",
                             "type": "malformed_body"}  # fmt: skip

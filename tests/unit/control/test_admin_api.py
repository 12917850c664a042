"""The admin API's own rules: tokens, webhook signatures, duplicate deliveries, bodies.

The rollout manager behind it is replaced by a recorder: what it does with the registry
is covered end to end in tests/e2e/test_canary.py.
"""

import orjson
import pytest
from starlette.testclient import TestClient

from fakes import FakeClock
from infergate.config import AdminSettings
from infergate.control.admin import MAX_BODY_BYTES, AdminApi, check_exposure
from infergate.control.webhooks import sign
from infergate.errors import StackError


class Rollouts:
    """Stands in for the rollout manager: records the commands it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def status(self, name):
        self.calls.append(("status", name))
        return type("S", (), {"to_dict": lambda self: {"model": name}})()

    def on_version_created(self, name, version):
        self.calls.append(("created", name, version))


@pytest.fixture
def api():
    recorder, reconciles = Rollouts(), []
    admin = AdminApi(recorder, lambda: reconciles.append(1), token="t0k", webhook_secret="s",
                     clock=FakeClock())  # fmt: skip
    return TestClient(admin.app), recorder, reconciles


def test_commands_need_the_token(api):
    client, recorder, _ = api
    assert client.get("/admin/models/m/rollout").status_code == 401
    bad = client.get("/admin/models/m/rollout", headers={"authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["type"] == "unauthorized"
    good = client.get("/admin/models/m/rollout", headers={"authorization": "Bearer t0k"})
    assert good.json() == {"model": "m"} and recorder.calls == [("status", "m")]


def test_bodies_are_checked(api):
    client, _, _ = api
    auth = {"authorization": "Bearer t0k"}
    broken = client.post("/admin/models/m/canary", content=b"{", headers=auth)
    assert broken.status_code == 400
    unknown = client.post("/admin/models/m/canary", json={"versoin": "2"}, headers=auth)
    assert unknown.status_code == 422 and "unknown field" in unknown.json()["error"]
    wrong = client.post("/admin/models/m/canary/weight", json={"weight": "50"}, headers=auth)
    assert wrong.status_code == 422


def delivery(body: bytes, delivery_id: str = "d1", secret: str = "s") -> dict:
    return {
        "x-mlflow-signature": sign(secret, delivery_id, "1000", body),
        "x-mlflow-delivery-id": delivery_id,
        "x-mlflow-timestamp": "1000",
        "content-type": "application/json",
    }


def test_webhooks_are_verified_deduplicated_and_reconcile(api):
    client, recorder, reconciles = api
    body = orjson.dumps({"entity": "model_version", "action": "created",
                         "data": {"name": "m", "version": "3"}})  # fmt: skip
    forged = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body, secret="x"))
    assert forged.status_code == 401 and reconciles == []
    first = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body))
    assert first.json() == {"status": "accepted", "event": "model_version.created"}
    again = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body))
    assert again.json()["status"] == "duplicate"
    assert recorder.calls == [("created", "m", "3")] and reconciles == [1]


def test_a_delivery_that_failed_is_handled_when_mlflow_retries_it(api):
    client, recorder, reconciles = api
    body = orjson.dumps({"entity": "model_version", "action": "created",
                         "data": {"name": "m", "version": "4"}})  # fmt: skip
    handled = recorder.on_version_created

    def registry_down(name, version):
        raise ConnectionError("MLflow is restarting")

    recorder.on_version_created = registry_down
    failed = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body, "d2"))
    assert failed.status_code == 500 and reconciles == []
    recorder.on_version_created = handled
    retried = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body, "d2"))
    assert retried.json()["status"] == "accepted"
    assert recorder.calls == [("created", "m", "4")] and reconciles == [1]


def test_a_retry_of_a_delivery_still_under_way_is_asked_to_come_back(api):
    """MLflow retries a delivery that timed out, maybe while the first attempt still waits
    for the control plane's lock; that attempt may yet fail, so the retry is not told
    'duplicate' (which would end MLflow's retries) but 503."""
    client, recorder, reconciles = api
    body = orjson.dumps({"entity": "model_version", "action": "created",
                         "data": {"name": "m", "version": "5"}})  # fmt: skip
    answers = []

    def slow_then_failing(name, version):
        # The retry arrives while this attempt is under way.
        retry = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body, "d3"))
        answers.append((retry.status_code, retry.json()["type"]))
        raise ConnectionError("MLflow is restarting")

    handled = recorder.on_version_created
    recorder.on_version_created = slow_then_failing
    first = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body, "d3"))
    assert first.status_code == 500 and answers == [(503, "delivery_under_way")]
    recorder.on_version_created = handled
    later = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body, "d3"))
    assert later.json()["status"] == "accepted"
    after = client.post("/admin/webhooks/mlflow", content=body, headers=delivery(body, "d3"))
    assert after.json()["status"] == "duplicate"
    assert recorder.calls == [("created", "m", "5")] and reconciles == [1]


def test_unknown_routes_and_methods_answer_in_the_one_error_shape(api):
    client, _, _ = api
    missing = client.get("/admin/nothing-here")
    assert missing.status_code == 404 and missing.json()["type"] == "not_found"
    wrong = client.get("/admin/webhooks/mlflow")
    assert wrong.status_code == 405 and wrong.json()["type"] == "method_not_allowed"


def test_a_huge_webhook_is_refused_before_it_is_read_or_verified(api):
    client, recorder, reconciles = api
    body = b"x" * (MAX_BODY_BYTES + 1)
    headers = {"x-mlflow-delivery-id": "d9", "x-mlflow-timestamp": "1000",
               "x-mlflow-signature": sign("s", "d9", "1000", body)}  # fmt: skip
    declared = client.post("/admin/webhooks/mlflow", content=body, headers=headers)
    assert declared.status_code == 413 and declared.json()["type"] == "payload_too_large"

    def chunks():  # no content-length: the limit holds while streaming
        yield body[: MAX_BODY_BYTES // 2]
        yield body[MAX_BODY_BYTES // 2 :]

    streamed = client.post("/admin/webhooks/mlflow", content=chunks(), headers=headers)
    assert streamed.status_code == 413
    assert recorder.calls == [] and reconciles == []


@pytest.mark.parametrize("host, token, refused", [
    ("127.0.0.1", None, False), ("localhost", None, False), ("::1", None, False),
    ("0.0.0.0", None, True), ("10.1.2.3", None, True), ("control-plane", None, True),
    ("0.0.0.0", "t0k", False),
])  # fmt: skip
def test_the_admin_api_needs_a_token_beyond_loopback(host, token, refused):
    settings = AdminSettings(host=host, token=token)
    if refused:
        with pytest.raises(StackError, match="INFERGATE_ADMIN__TOKEN"):
            check_exposure(settings)
    else:
        check_exposure(settings)

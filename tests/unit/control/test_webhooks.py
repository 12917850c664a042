import orjson
import pytest

from fakes import FakeClock
from infergate.control.webhooks import TIMESTAMP_TOLERANCE_S, SeenDeliveries, sign, verify
from infergate.errors import MalformedBody, Unauthorized

BODY = orjson.dumps({"entity": "model_version_alias", "action": "created",
                     "data": {"name": "m", "alias": "canary", "version": "2"}})  # fmt: skip


def headers(secret="s3cret", delivery="d-1", timestamp="1000", body=BODY):
    return {
        "x-mlflow-signature": sign(secret, delivery, timestamp, body),
        "x-mlflow-delivery-id": delivery,
        "x-mlflow-timestamp": timestamp,
    }


def test_signature_matches_mlflows_scheme():
    # HMAC-SHA256 of "d-1.1000.{}" with key "k", base64, prefixed "v1," as MLflow does.
    import base64
    import hashlib
    import hmac

    digest = hmac.new(b"k", b"d-1.1000.{}", hashlib.sha256).digest()
    assert sign("k", "d-1", "1000", b"{}") == "v1," + base64.b64encode(digest).decode()


def test_a_good_delivery_gives_its_event():
    event = verify("s3cret", headers(), BODY, now=1010)
    assert event.name == "model_version_alias.created"
    assert event.data["version"] == "2"


@pytest.mark.parametrize(
    "bad",
    [
        {"x-mlflow-signature": ""},
        {"x-mlflow-signature": "v1,AAAA"},
        {"x-mlflow-timestamp": "not-a-time"},
    ],
)
def test_bad_signatures_are_refused(bad):
    with pytest.raises(Unauthorized):
        verify("s3cret", {**headers(), **bad}, BODY, now=1000)


def test_wrong_secret_and_tampered_body_are_refused():
    with pytest.raises(Unauthorized):
        verify("other", headers(), BODY, now=1000)
    with pytest.raises(Unauthorized):
        verify("s3cret", headers(), BODY.replace(b'"2"', b'"3"'), now=1000)


def test_stale_deliveries_are_refused():
    with pytest.raises(Unauthorized, match="stale"):
        verify("s3cret", headers(), BODY, now=1000 + 301)


def test_signed_garbage_is_malformed():
    with pytest.raises(MalformedBody):
        verify("s3cret", headers(body=b"[1]"), b"[1]", now=1000)


def test_repeated_deliveries_are_seen_once_and_memory_is_bounded():
    seen = SeenDeliveries(size=2)
    assert seen.first_time("a") and not seen.first_time("a")
    assert seen.first_time("b") and seen.first_time("c")
    assert seen.first_time("a")  # forgotten after two newer ids


def test_handled_deliveries_outlive_a_restart_for_as_long_as_their_signature(tmp_path):
    journal = tmp_path / "deliveries.log"
    clock = FakeClock(1_000_000.0)
    seen = SeenDeliveries(journal=journal, clock=clock)
    assert seen.first_time("d1")
    seen.handled("d1")
    assert seen.first_time("d2")  # under way when the process died: not handled
    clock.advance(100)
    restarted = SeenDeliveries(journal=journal, clock=clock)
    assert not restarted.first_time("d1")  # a replay is still refused
    assert restarted.first_time("d2")
    clock.advance(TIMESTAMP_TOLERANCE_S)  # d1's signature is stale now: no need to keep it
    again = SeenDeliveries(journal=journal, clock=clock)
    assert again.first_time("d1")
    assert journal.read_text() == ""


def test_a_journal_line_cut_short_by_a_crash_is_skipped(tmp_path):
    journal = tmp_path / "deliveries.log"
    journal.write_text("1000.0 good\n10")
    seen = SeenDeliveries(journal=journal, clock=FakeClock(1001.0))
    assert not seen.first_time("good")
    assert seen.first_time("10")

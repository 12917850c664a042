import os

import pytest

from fakes import FakeClock
from infergate.errors import Forbidden, InvalidConfig, RateLimited, Unauthorized
from infergate.serving.access import (
    OPEN,
    Access,
    KeyEntry,
    KeyFile,
    TokenBucket,
    digest,
    new_key,
    read_keys,
    write_keys,
)


def key_file(tmp_path, **limits):
    """A key file with one key for model 'embed' and one for every model; the keys."""
    scoped, anything = new_key(), new_key()
    path = tmp_path / "keys.yaml"
    entries = [
        KeyEntry(id="search", sha256=digest(scoped), models=("embed",), **limits),
        KeyEntry(id="admin", sha256=digest(anything), models=("*",)),
    ]
    write_keys(path, KeyFile(keys=entries))
    return path, scoped, anything


def test_the_file_keeps_digests_only_and_is_private(tmp_path):
    path, scoped, anything = key_file(tmp_path)
    text = path.read_text()
    assert scoped not in text and anything not in text
    assert digest(scoped) in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [k.id for k in read_keys(path).keys] == ["search", "admin"]


def test_keys_are_long_and_fresh():
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100
    assert all(len(key) > 40 and key.startswith("ig_") for key in keys)


def test_bearer_and_x_api_key_both_authenticate(tmp_path):
    path, scoped, _ = key_file(tmp_path)
    access = Access(path)
    assert access.authenticate({"authorization": f"Bearer {scoped}"}).id == "search"
    assert access.authenticate({"authorization": f"bearer  {scoped} "}).id == "search"
    assert access.authenticate({"x-api-key": scoped}).id == "search"


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer "}, {"authorization": "Basic dXNlcjpwYXNz"}, {"x-api-key": " "}],
)
def test_no_key_is_a_401_that_says_how_to_send_one(tmp_path, headers):
    access = Access(key_file(tmp_path)[0])
    with pytest.raises(Unauthorized, match="Authorization: Bearer") as caught:
        access.authenticate(headers)
    assert caught.value.headers() == {"WWW-Authenticate": "Bearer"}


def test_an_unknown_key_is_a_401(tmp_path):
    access = Access(key_file(tmp_path)[0])
    with pytest.raises(Unauthorized, match="not valid"):
        access.authenticate({"authorization": f"Bearer {new_key()}"})


def test_a_key_calls_only_its_models(tmp_path):
    path, scoped, anything = key_file(tmp_path)
    access = Access(path)
    caller = access.authenticate({"x-api-key": scoped})
    caller.check_model("embed")
    with pytest.raises(Forbidden, match="'search' may not call model 'sentiment'"):
        caller.check_model("sentiment")
    access.authenticate({"x-api-key": anything}).check_model("sentiment")


def test_without_a_key_file_everyone_may_call_everything():
    access = Access(None)
    assert not access.enabled
    caller = access.authenticate({})
    assert caller is OPEN
    caller.check_model("anything")
    for _ in range(1000):
        access.admit(caller, 64)


def test_a_revoked_key_is_refused_once_the_file_changes(tmp_path):
    clock = FakeClock(100.0)
    path, scoped, _ = key_file(tmp_path)
    access = Access(path, clock=clock)
    access.authenticate({"x-api-key": scoped})
    keys = read_keys(path)
    keys.keys = [k for k in keys.keys if k.id != "search"]
    write_keys(path, keys)
    access.authenticate({"x-api-key": scoped})  # not looked at again yet
    clock.now += 2.5
    with pytest.raises(Unauthorized):
        access.authenticate({"x-api-key": scoped})


def test_a_broken_file_on_reload_keeps_the_keys_read_before(tmp_path, caplog):
    clock = FakeClock(100.0)
    path, scoped, _ = key_file(tmp_path)
    access = Access(path, clock=clock)
    path.write_text("keys: [{id: x}]\n")
    clock.now += 2.5
    assert access.authenticate({"x-api-key": scoped}).id == "search"
    assert "not valid" in caplog.text


def test_a_broken_file_at_start_is_refused(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n  - id: a\n    sha256: 'not hex'\n    models: [m]\n")
    with pytest.raises(InvalidConfig, match="not valid"):
        Access(path)


def test_ids_and_digests_must_be_unique(tmp_path):
    entry = KeyEntry(id="a", sha256="0" * 64, models=("m",))
    with pytest.raises(ValueError, match="unique"):
        KeyFile(keys=[entry, entry.model_copy(update={"sha256": "1" * 64})])


def test_requests_over_the_rate_get_a_429_with_when_to_come_back(tmp_path):
    clock = FakeClock(100.0)
    path, scoped, _ = key_file(tmp_path, requests_per_s=2)
    access = Access(path, clock=clock)
    caller = access.authenticate({"x-api-key": scoped})
    access.admit(caller, 1)
    access.admit(caller, 1)  # a burst of one second's worth
    with pytest.raises(RateLimited) as caught:
        access.admit(caller, 1)
    assert caught.value.status == 429
    assert caught.value.headers() == {"Retry-After": "1"}
    assert 0.4 < caught.value.retry_after_s <= 0.5
    clock.now += 0.5
    access.admit(caller, 1)


def test_texts_are_limited_apart_from_requests_and_a_refusal_takes_nothing(tmp_path):
    clock = FakeClock(100.0)
    path, scoped, _ = key_file(tmp_path, requests_per_s=100, texts_per_s=10)
    access = Access(path, clock=clock)
    caller = access.authenticate({"x-api-key": scoped})
    access.admit(caller, 8)
    with pytest.raises(RateLimited, match="10 texts/s"):
        access.admit(caller, 8)
    access.admit(caller, 2)  # the refused 8 took nothing: 2 were left


def test_a_request_larger_than_the_burst_passes_on_a_full_bucket():
    bucket = TokenBucket(rate=10, capacity=10, now=0)
    assert bucket.wait_s(64) == 0
    bucket.tokens -= 64
    bucket.refill(1.0)
    assert bucket.wait_s(1) == pytest.approx(4.5)  # -54 + 10, one wanted


def test_each_replica_enforces_its_share_of_a_keys_rate(tmp_path):
    clock = FakeClock(100.0)
    path, scoped, _ = key_file(tmp_path, requests_per_s=10)
    access = Access(path, clock=clock)
    access.set_replicas(5)  # 2 requests/s here
    caller = access.authenticate({"x-api-key": scoped})
    access.admit(caller, 1)
    access.admit(caller, 1)
    with pytest.raises(RateLimited):
        access.admit(caller, 1)
    access.set_replicas(1)
    for _ in range(10):
        access.admit(caller, 1)

"""The one error path of every infergate server (infergate.http)."""

import asyncio
import logging

import orjson
import pytest
from starlette.requests import Request

from infergate.errors import (
    ModelNotFound,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
)
from infergate.http import SlowUploads, answer, error_response, read_body


def test_an_overload_asks_the_client_to_come_back_in_whole_seconds():
    response = error_response(Overloaded("too many requests for model 'm'", retry_after_s=1.2))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"
    assert orjson.loads(response.body) == {
        "error": "too many requests for model 'm'",
        "type": "overloaded",
    }
    assert error_response(Overloaded("busy", retry_after_s=0.01)).headers["retry-after"] == "1"


def test_errors_without_headers_send_none():
    response = error_response(ModelNotFound("model 'x' is not served"))
    assert response.status_code == 404 and "retry-after" not in response.headers


def test_an_unforeseen_failure_is_logged_and_answered_without_internals(caplog):
    async def broken():
        raise KeyError("/secret/path/model.onnx")

    with caplog.at_level(logging.ERROR, logger="infergate.http"):
        response = asyncio.run(answer(broken, "POST /predict"))
    assert response.status_code == 500
    assert orjson.loads(response.body) == {"error": "internal error", "type": "internal_error"}
    assert "unhandled error on POST /predict" in caplog.text and "secret" in caplog.text


def test_a_typed_failure_keeps_its_status_and_message():
    async def unknown():
        raise ModelNotFound("model 'x' is not served; served models: a, b")

    response = asyncio.run(answer(unknown, "POST /v1/models/x/predict"))
    assert response.status_code == 404
    assert orjson.loads(response.body)["error"].startswith("model 'x' is not served")


# -- reading a body within its time (read_body) -----------------------------------------------


def _request(
    chunks: list[bytes], stall: asyncio.Event | None = None, headers: list | None = None
) -> Request:
    """A request whose body comes in ``chunks``; with ``stall``, the rest never comes
    until the event is set (a client that dribbles)."""
    pending = list(chunks)

    async def receive() -> dict:
        if not pending and stall is not None:
            await stall.wait()
        body = pending.pop(0) if pending else b""
        return {
            "type": "http.request",
            "body": body,
            "more_body": bool(pending) or stall is not None,
        }

    scope = {"type": "http", "method": "POST", "path": "/predict", "headers": headers or []}
    return Request(scope, receive)


@pytest.mark.parametrize("encoding", [b"gzip", b"br", b" Deflate ", b"identity, gzip"])
def test_a_compressed_body_is_refused_rather_than_read_as_broken_text(encoding):
    """Every endpoint reads its body here, and none decompresses: a gzip body on /predict
    was once answered "not valid UTF-8" (400) where V2 said 415."""
    request = _request([b"\x1f\x8b\x08\x00"], headers=[(b"content-encoding", encoding)])
    with pytest.raises(UnsupportedMediaType) as info:
        asyncio.run(read_body(request, 1024))
    assert info.value.status == 415
    assert info.value.message == (
        f"content-encoding {encoding.decode()!r} is not supported; send the body uncompressed"
    )


@pytest.mark.parametrize("encoding", [b"identity", b" IDENTITY "])
def test_an_identity_encoding_is_read_as_usual(encoding):
    request = _request([b'{"inputs": "a"}'], headers=[(b"content-encoding", encoding)])
    assert asyncio.run(read_body(request, 1024)) == b'{"inputs": "a"}'


@pytest.mark.parametrize("declared", [b"\xb2", b"\xb9\xb2", b"-1", b"1e3", b" 7"])
def test_a_content_length_that_is_no_ascii_number_is_not_trusted(declared):
    # Latin-1 b"\xb2" is "²", which Python's str.isdigit() takes for a digit and int()
    # refuses: the fuzz test once found a 500 there. The body read is what counts.
    request = _request([b'{"inputs": "a"}'], headers=[(b"content-length", declared)])
    assert asyncio.run(read_body(request, 100)) == b'{"inputs": "a"}'


@pytest.mark.parametrize("declared", [b"9" * 5000, b"0" * 5000 + b"101"])
def test_a_content_length_of_thousands_of_digits_is_compared_not_converted(declared):
    # int() refuses a string of more than 4,300 digits.
    request = _request([b"x"], headers=[(b"content-length", declared)])
    with pytest.raises(PayloadTooLarge, match="the limit is 100 bytes"):
        asyncio.run(read_body(request, 100))


def test_a_body_sent_at_once_is_read_whole_and_counts_as_no_slow_upload():
    slow = SlowUploads(limit=1, grace_s=0.01)

    async def read() -> bytes:
        return await read_body(_request([b'{"inputs":', b' "a"}']), 100, timeout_s=1.0, slow=slow)

    assert asyncio.run(read()) == b'{"inputs": "a"}'
    assert slow.active == 0


def test_a_body_that_never_ends_times_out_and_frees_its_slow_upload_slot():
    slow = SlowUploads(limit=1, grace_s=0.01)
    seen: list[int] = []

    async def read() -> None:
        async def watch() -> None:  # the read counts as a slow upload after its grace
            await asyncio.sleep(0.03)
            seen.append(slow.active)

        watcher = asyncio.create_task(watch())
        try:
            await read_body(_request([b"{"], asyncio.Event()), 100, timeout_s=0.06, slow=slow)
        finally:
            await watcher

    with pytest.raises(RequestTimeout, match=r"did not arrive within 0\.06 s"):
        asyncio.run(read())
    assert seen == [1] and slow.active == 0


def test_past_the_slow_upload_limit_a_dribbling_body_is_refused_at_its_grace():
    slow = SlowUploads(limit=1, grace_s=0.01)
    slow.active = 1  # another slow upload holds the only slot

    async def read() -> None:
        await read_body(_request([b"{"], asyncio.Event()), 100, timeout_s=5.0, slow=slow)

    with pytest.raises(RequestTimeout, match="while 1 other slow uploads are under way"):
        asyncio.run(asyncio.wait_for(read(), 1.0))
    assert slow.active == 1


def test_a_read_cancelled_from_outside_stays_cancelled():
    slow = SlowUploads(limit=1, grace_s=5.0)

    async def read() -> None:
        reading = asyncio.create_task(
            read_body(_request([b"{"], asyncio.Event()), 100, timeout_s=10.0, slow=slow)
        )
        await asyncio.sleep(0.01)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading

    asyncio.run(read())
    assert slow.active == 0

"""The one error path of every infergate server (infergate.http)."""

import asyncio
import logging

import orjson

from infergate.errors import ModelNotFound, Overloaded
from infergate.http import answer, error_response


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

import orjson
import pytest

from infergate.errors import InvalidInput, MalformedBody, PayloadTooLarge, UnsupportedMediaType
from infergate.protocols.wire import Limits, check_content_type, parse_predict

LIMITS = Limits(max_body_bytes=1000, max_texts=4, max_chars_per_text=50)


def body(value) -> bytes:
    return orjson.dumps(value)


def test_single_text_becomes_a_list_of_one():
    assert parse_predict(body({"inputs": "hello"}), LIMITS).texts == ["hello"]


def test_list_and_parameters():
    parsed = parse_predict(body({"inputs": ["a", "b"], "parameters": {"normalize": False}}), LIMITS)
    assert parsed.texts == ["a", "b"]
    assert parsed.parameters == {"normalize": False}


def test_unicode_text_is_kept():
    assert parse_predict(body({"inputs": "café ☕ 東京"}), LIMITS).texts == ["café ☕ 東京"]


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        (b"", MalformedBody, "empty"),
        (b"   ", MalformedBody, "empty"),
        (b'{"inputs": ', MalformedBody, "not valid JSON"),
        (b'{"inputs": "\xff\xfe"}', MalformedBody, "UTF-8"),
        (b"[1, 2]", InvalidInput, "JSON object"),
        (b'"text"', InvalidInput, "JSON object"),
        (b"{}", InvalidInput, "'inputs' is missing"),
        (b'{"inputs": 3}', InvalidInput, "got a number"),
        (b'{"inputs": null}', InvalidInput, "got null"),
        (b'{"inputs": []}', InvalidInput, "empty list"),
        (b'{"inputs": [1]}', InvalidInput, "'inputs[0]' must be a string"),
        (b'{"inputs": ["a", ["b"]]}', InvalidInput, "'inputs[1]' must be a string, got a list"),
        (b'{"inputs": ""}', InvalidInput, "'inputs' is empty"),
        (
            b'{"inputs": ["a", " \\t\\n\\u3000"]}',
            InvalidInput,
            "'inputs[1]' is empty or only whitespace",
        ),
        (b'{"inputs": "\\u0000"}', InvalidInput, "'inputs' holds only control characters"),
        (
            b'{"inputs": ["a", "\\u0000 \\u001b\\n\\u007f"]}',
            InvalidInput,
            "'inputs[1]' holds only control characters (such as NUL) and whitespace",
        ),
        (b'{"inputs": "a", "extra": 1}', InvalidInput, "unknown field"),
        (b'{"inputs": "a", "parameters": []}', InvalidInput, "must be an object"),
        (b'{"inputs": "a", "parameters": {"x": 1}}', InvalidInput, "unknown parameter"),
        (b'{"inputs": "a", "parameters": {"normalize": 1}}', InvalidInput, "must be bool"),
        (b'{"inputs": ["a", "b", "c", "d", "e"]}', PayloadTooLarge, "limit is 4"),
        (body({"inputs": "x" * 51}), PayloadTooLarge, "51 characters"),
        (body({"inputs": "x" * 2000}), PayloadTooLarge, "bytes"),
    ],
)
def test_bad_bodies_get_typed_errors(raw, error, fragment):
    with pytest.raises(error) as info:
        parse_predict(raw, LIMITS)
    assert fragment in info.value.message


def test_error_statuses():
    assert MalformedBody("x").status == 400
    assert InvalidInput("x").status == 422
    assert PayloadTooLarge("x").status == 413
    assert UnsupportedMediaType("x").to_body() == {"error": "x", "type": "unsupported_media_type"}


@pytest.mark.parametrize(
    "value",
    [None, "application/json", "application/json; charset=utf-8", "application/vnd.api+json",
     'Application/JSON; Charset="UTF8"', "application/json; charset=us-ascii"],
)  # fmt: skip
def test_json_content_types_pass(value):
    check_content_type(value)


@pytest.mark.parametrize("charset", ["utf-16", "iso-8859-1"])
def test_json_in_another_charset_is_refused(charset):
    with pytest.raises(UnsupportedMediaType, match=f"charset '{charset}' is not supported"):
        check_content_type(f"application/json; charset={charset}")


@pytest.mark.parametrize("value", ["text/plain", "application/x-www-form-urlencoded"])
def test_other_content_types_are_refused(value):
    with pytest.raises(UnsupportedMediaType, match="application/json"):
        check_content_type(value)


def test_a_control_character_beside_some_text_is_kept():
    """Only a text with nothing else is refused; the tokenizer drops what it does not read."""
    assert parse_predict(b'{"inputs": ["a\\u0000b", "\\u0007 bell"]}', LIMITS).texts == [
        "a\x00b",
        "\x07 bell",
    ]

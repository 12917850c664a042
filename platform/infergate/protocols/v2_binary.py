"""The binary tensor data extension of the Open Inference Protocol, which
``tritonclient.http`` uses by default: a body is a JSON header (its length in bytes in
the ``Inference-Header-Content-Length`` header), then each binary tensor's raw bytes in
order; FP32 values little-endian, each BYTES element a 4-byte little-endian length and
then its bytes. Described in Triton's docs/protocol/extension_binary_data.md.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np

from infergate.errors import MalformedBody

HEADER_LENGTH = "Inference-Header-Content-Length"
DIGITS = re.compile(r"[0-9]+")
LENGTH = struct.Struct("<I")  # a BYTES element's length: 4 bytes, little-endian


def split(body: bytes, header_length: str | None) -> tuple[bytes, bytes | None]:
    """The JSON header and the binary tensors after it (None: the body is all JSON)."""
    if header_length is None:
        return body, None
    if not DIGITS.fullmatch(header_length.strip()):
        raise MalformedBody(
            f"Inference-Header-Content-Length is {header_length!r}; expected the length "
            "in bytes of the JSON header at the start of the body"
        )
    length = int(header_length)
    if length > len(body):
        raise MalformedBody(
            f"Inference-Header-Content-Length is {length} bytes but the body has only "
            f"{len(body)}; it must give the length of the JSON header at the body's start"
        )
    return body[:length], body[length:]


def binary_elements(raw: bytes, limit: int, where: str) -> list[str]:
    """BYTES elements: each a 4-byte little-endian length, then that many bytes of UTF-8;
    at most ``limit`` + 1 are decoded."""
    texts: list[str] = []
    offset = 0
    while offset < len(raw) and len(texts) <= limit:
        index = len(texts)
        if offset + LENGTH.size > len(raw):
            raise MalformedBody(
                f"{where} element {index} is cut short: {len(raw) - offset} byte(s) where a "
                "4-byte length was expected"
            )
        (size,) = LENGTH.unpack_from(raw, offset)
        offset += LENGTH.size
        if offset + size > len(raw):
            raise MalformedBody(
                f"{where} element {index} declares {size} bytes but only "
                f"{len(raw) - offset} remain in the binary data"
            )
        try:
            texts.append(raw[offset : offset + size].decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise MalformedBody(
                f"{where} element {index} is not valid UTF-8 (bad byte at offset "
                f"{exc.start}); texts must be UTF-8"
            ) from None
        offset += size
    return texts


def to_binary(datatype: str, values: Any) -> bytes:
    if datatype == "BYTES":
        encoded = [value.encode("utf-8") for value in values]
        return b"".join(LENGTH.pack(len(value)) + value for value in encoded)
    return np.ascontiguousarray(values, dtype="<f4").tobytes()

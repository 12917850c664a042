"""The error pages of Ray Serve's HAProxy ingress, in the platform's JSON shape.

HAProxy answers by itself when no front-end replica can take a request: every replica
down or restarting (503), or one dying with the request (502). Ray Serve has it send the
same plain-text "500 Internal Server Error" page for all three, which a client cannot tell
from a bug and will not retry. infergate points Ray Serve's HAProxy files at a folder of
its own (``RAY_SERVE_HAPROXY_CONFIG_FILE_LOC``) and writes a JSON 503 with ``Retry-After``
over that page; HAProxy reads it on each reload, which Ray Serve does whenever replicas
come or go. Ray Serve writes its page again when its proxy restarts, so the stack's
supervisor puts ours back (``write_error_pages`` is cheap to call every few seconds).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from infergate.errors import BackendUnavailable
from infergate.files import write_atomically
from infergate.http import json_response

PAGE_NAME = "500.http"  # Ray Serve's page for HAProxy's 502, 503 and 504
RETRY_AFTER_S = 1


@cache
def error_page() -> bytes:
    """A whole HTTP response, as HAProxy's ``errorfile`` wants it."""
    error = BackendUnavailable("no front-end replica can take the request now; retry shortly")
    body = json_response(error.to_body()).body
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Retry-After: {RETRY_AFTER_S}\r\n"
        "Cache-Control: no-cache\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + bytes(body)


def write_error_pages(folder: Path) -> int:
    """Put the JSON page in place of Ray Serve's in every node's folder under ``folder``;
    how many were replaced."""
    page = error_page()
    replaced = 0
    for path in folder.glob(f"*/{PAGE_NAME}"):
        try:
            if path.read_bytes() == page:
                continue
            write_atomically(path, page)  # HAProxy never reads half a page
            replaced += 1
        except OSError:  # the node's folder went away under us: the next round sees
            continue
    return replaced

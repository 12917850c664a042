"""MLflow webhooks: registering the platform's, and verifying its deliveries.

MLflow signs ``"{delivery_id}.{timestamp}.{body}"`` with HMAC-SHA256 and sends
``X-MLflow-Signature: v1,<base64>`` with ``X-MLflow-Delivery-Id`` and
``X-MLflow-Timestamp`` (mlflow/webhooks/delivery.py). A delivery with a bad or missing
signature, or a timestamp outside the tolerance, is refused; one already seen is ignored
(MLflow retries failed deliveries).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from infergate.errors import MalformedBody, Unauthorized
from infergate.files import write_atomically

if TYPE_CHECKING:
    from infergate.registry import Registry

SIGNATURE = "x-mlflow-signature"
TIMESTAMP = "x-mlflow-timestamp"
DELIVERY_ID = "x-mlflow-delivery-id"
# A delivery signed longer ago than this is refused, so ids need remembering this long.
TIMESTAMP_TOLERANCE_S = 300.0


@dataclass(frozen=True)
class Event:
    delivery_id: str
    entity: str
    action: str
    data: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.entity}.{self.action}"


def sign(secret: str, delivery_id: str, timestamp: str, body: bytes) -> str:
    content = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    tolerance_s: float = TIMESTAMP_TOLERANCE_S,
) -> Event:
    """The delivery's event, or ``Unauthorized`` / ``MalformedBody``."""
    signature, delivery_id = headers.get(SIGNATURE), headers.get(DELIVERY_ID)
    timestamp = headers.get(TIMESTAMP)
    if not signature or not delivery_id or not timestamp:
        raise Unauthorized("missing X-MLflow-Signature, -Delivery-Id or -Timestamp header")
    try:
        age = abs(now - int(timestamp))
    except (ValueError, OverflowError):  # OverflowError: an integer past any float
        raise Unauthorized(f"X-MLflow-Timestamp {timestamp!r} is not a Unix time") from None
    if age > tolerance_s:
        raise Unauthorized(f"delivery timestamp is {age:.0f} s off; refusing a stale delivery")
    expected = sign(secret, delivery_id, timestamp, body)
    # compare_digest refuses non-ASCII text (a TypeError), and a signature is base64.
    if not signature.isascii() or not hmac.compare_digest(expected, signature):
        raise Unauthorized("webhook signature does not match")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = None
    if not _is_event(payload):
        raise MalformedBody("webhook body is not an MLflow event")
    return Event(delivery_id, payload["entity"], payload["action"], payload.get("data", {}))


def _is_event(payload: Any) -> bool:
    """An object naming its entity and action, with a data object: what the handlers read
    (a signed ``"data": []`` failed in them with a 500, which MLflow retries)."""
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("entity"), str)
        and isinstance(payload.get("action"), str)
        and isinstance(payload.get("data", {}), dict)
    )


class SeenDeliveries:
    """The last ``size`` delivery ids, handled or being handled, for MLflow's retries.

    MLflow retries a delivery that timed out (30 s by default) with the same id. A retry of
    one handled is ignored; a retry of one still being handled (waiting for the control
    plane's lock, say) is asked to come back, since the original may yet fail. Handlers run
    on several threads.

    With a ``journal`` file the handled ids outlive the process: a control plane restarted
    still refuses a replay of a delivery it handled, for as long as the delivery's
    signature is valid (``keep_s``, the timestamp tolerance); older ids are dropped when
    the file is read.
    """

    def __init__(
        self,
        size: int = 10_000,
        *,
        journal: Path | None = None,
        keep_s: float = TIMESTAMP_TOLERANCE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.size = size
        self._ids: OrderedDict[str, bool] = OrderedDict()  # id -> handled (False: under way)
        self._lock = threading.Lock()
        self._journal = journal
        self._clock = clock
        if journal is not None:
            self._replay(journal, keep_s)

    def _replay(self, journal: Path, keep_s: float) -> None:
        """Take the ids handled within ``keep_s``; write the file again with only those."""
        recent: list[tuple[float, str]] = []
        try:
            lines = journal.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        oldest = self._clock() - keep_s
        for line in lines:
            stamp, _, delivery_id = line.partition(" ")
            try:
                handled_at = float(stamp)
            except ValueError:  # a line cut short by a crash
                continue
            if delivery_id and handled_at >= oldest:
                recent.append((handled_at, delivery_id))
        for _, delivery_id in recent[-self.size :]:
            self._ids[delivery_id] = True
        journal.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(journal, "".join(f"{t} {d}\n" for t, d in recent[-self.size :]))

    def first_time(self, delivery_id: str) -> bool:
        """Whether ``delivery_id`` is new; if so it is now under way."""
        with self._lock:
            if delivery_id in self._ids:
                return False
            self._ids[delivery_id] = False
            if len(self._ids) > self.size:
                self._ids.popitem(last=False)
            return True

    def under_way(self, delivery_id: str) -> bool:
        with self._lock:
            return self._ids.get(delivery_id) is False

    def handled(self, delivery_id: str) -> None:
        with self._lock:
            if delivery_id in self._ids:
                self._ids[delivery_id] = True
                if self._journal is not None:
                    with self._journal.open("a", encoding="utf-8") as journal:
                        journal.write(f"{self._clock()} {delivery_id}\n")

    def forget(self, delivery_id: str) -> None:
        """A delivery that failed: MLflow's retry of it must be handled, not dropped."""
        with self._lock:
            self._ids.pop(delivery_id, None)


WEBHOOK_NAME = "infergate"
WEBHOOK_EVENTS = [
    "model_version.created",
    "model_version_alias.created",
    "model_version_alias.deleted",
]


def register_webhook(registry: Registry, url: str, secret: str) -> None:
    """Create the platform's MLflow webhook, or point the existing one here (idempotent)."""
    client = registry.client
    existing = [w for w in client.list_webhooks() if w.name == WEBHOOK_NAME]
    if existing:
        client.update_webhook(
            existing[0].webhook_id, url=url, events=WEBHOOK_EVENTS, secret=secret, status="ACTIVE"
        )
        for duplicate in existing[1:]:
            client.delete_webhook(duplicate.webhook_id)
    else:
        client.create_webhook(WEBHOOK_NAME, url, WEBHOOK_EVENTS, secret=secret)

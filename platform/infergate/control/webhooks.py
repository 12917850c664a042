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
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from infergate.errors import MalformedBody, Unauthorized

if TYPE_CHECKING:
    from infergate.registry import Registry

SIGNATURE = "x-mlflow-signature"
TIMESTAMP = "x-mlflow-timestamp"
DELIVERY_ID = "x-mlflow-delivery-id"


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
    tolerance_s: float = 300.0,
) -> Event:
    """The delivery's event, or ``Unauthorized`` / ``MalformedBody``."""
    signature, delivery_id = headers.get(SIGNATURE), headers.get(DELIVERY_ID)
    timestamp = headers.get(TIMESTAMP)
    if not signature or not delivery_id or not timestamp:
        raise Unauthorized("missing X-MLflow-Signature, -Delivery-Id or -Timestamp header")
    try:
        age = abs(now - int(timestamp))
    except ValueError:
        raise Unauthorized(f"X-MLflow-Timestamp {timestamp!r} is not a Unix time") from None
    if age > tolerance_s:
        raise Unauthorized(f"delivery timestamp is {age:.0f} s off; refusing a stale delivery")
    expected = sign(secret, delivery_id, timestamp, body)
    if not hmac.compare_digest(expected, signature):
        raise Unauthorized("webhook signature does not match")
    try:
        payload = orjson.loads(body)
        return Event(delivery_id, payload["entity"], payload["action"], payload.get("data", {}))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise MalformedBody("webhook body is not an MLflow event") from None


class SeenDeliveries:
    """The last ``size`` delivery ids, handled or being handled, for MLflow's retries.

    MLflow retries a delivery that timed out (30 s by default) with the same id. A retry of
    one handled is ignored; a retry of one still being handled (waiting for the control
    plane's lock, say) is asked to come back, since the original may yet fail. Handlers run
    on several threads.
    """

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._ids: OrderedDict[str, bool] = OrderedDict()  # id -> handled (False: under way)
        self._lock = threading.Lock()

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

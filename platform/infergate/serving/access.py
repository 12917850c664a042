"""Who may call the inference endpoints, which models, and how fast.

API keys live in a YAML file (on Kubernetes: a mounted Secret) that stores only each
key's SHA-256 digest, the models it may call and its limits; ``infergate keys create``
adds one and prints the key once. A replica reads the file at start and again whenever it
changes, so a key revoked is refused within ``RELOAD_INTERVAL_S`` without a restart.

Limits are token buckets per key, requests and texts per second, each holding at most
``burst_s`` seconds of its rate. Every replica keeps its own buckets at its share of the
rate (the rate divided by the front-end replicas the control plane hears from), so the
sum over replicas is the key's limit however many replicas autoscaling runs.

Pure: no Ray. Off (everyone may call everything) when no key file is configured.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from infergate.errors import Forbidden, InvalidConfig, RateLimited, Unauthorized
from infergate.files import write_atomically

log = logging.getLogger(__name__)
KEY_PREFIX = "ig_"
ALL_MODELS = "*"
RELOAD_INTERVAL_S = 2.0  # how often a replica looks whether the key file changed


class KeyEntry(BaseModel):
    """One API key as the key file stores it: never the key itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Shown on metrics and logs.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the key, hex.")
    models: tuple[str, ...] = Field(
        min_length=1, description=f"Models the key may call; {ALL_MODELS!r} for all."
    )
    requests_per_s: float | None = Field(None, gt=0, description="Unset: no limit.")
    texts_per_s: float | None = Field(None, gt=0, description="Unset: no limit.")

    def may_use(self, model: str) -> bool:
        return ALL_MODELS in self.models or model in self.models


class KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[KeyEntry] = Field(default_factory=list)

    @field_validator("keys")
    @classmethod
    def _unique(cls, keys: list[KeyEntry]) -> list[KeyEntry]:
        for attribute in ("id", "sha256"):
            values = [getattr(key, attribute) for key in keys]
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(f"key {attribute}s must be unique; repeated: {repeated}")
        return keys


def new_key() -> str:
    """A fresh API key: 256 random bits, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    # One SHA-256 is enough for a random 256-bit key (no dictionary to guess from), and
    # cheap enough to run on every request.
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def read_keys(path: Path) -> KeyFile:
    """The key file at ``path``; an absent file holds no keys."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return KeyFile()
    except OSError as exc:
        raise InvalidConfig(f"cannot read the API key file {path}: {exc}") from None
    try:
        return KeyFile.model_validate(yaml.safe_load(text) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise InvalidConfig(f"the API key file {path} is not valid: {exc}") from None


def write_keys(path: Path, keys: KeyFile) -> None:
    """Replace the file at once (readers never see half of it), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump(keys.model_dump(mode="json", exclude_none=True), sort_keys=False)
    header = "# infergate API keys: digests only; `infergate keys create` adds one.\n"
    write_atomically(path, header + body, mode=0o600)


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved up."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.updated = now

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` tokens are there (0: now). More than the bucket holds
        is allowed once it is full, so a single request larger than the burst is not
        refused for ever: it is let through and leaves the bucket in debt."""
        needed = min(amount, self.capacity) - self.tokens
        return max(0.0, needed / self.rate)


@dataclass(frozen=True)
class Caller:
    """Who is calling: the key's entry; ``None`` fields when access control is off."""

    key: KeyEntry | None

    @property
    def id(self) -> str:
        return self.key.id if self.key is not None else ""

    def check_model(self, model: str) -> None:
        if self.key is not None and not self.key.may_use(model):
            raise Forbidden(f"API key {self.key.id!r} may not call model {model!r}")


OPEN = Caller(None)


class Access:
    """One replica's view of the key file and its rate buckets."""

    def __init__(
        self,
        path: Path | None,
        *,
        burst_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.burst_s = burst_s
        self._clock = clock
        self._by_digest: dict[str, KeyEntry] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked_at = float("-inf")
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self.share = 1.0  # of each key's rate this replica enforces
        if path is not None:
            self._load(path)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def set_replicas(self, replicas: int) -> None:
        """Front-end replicas sharing the limits (the control plane counts them)."""
        share = 1.0 / max(1, replicas)
        if share != self.share:
            self.share = share
            self._buckets.clear()  # rebuilt at the new rate on the next request

    def authenticate(self, headers: Mapping[str, str]) -> Caller:
        """The caller the request's key names; ``OPEN`` when access control is off."""
        if self.path is None:
            return OPEN
        self._reload_if_changed(self.path)
        key = _presented_key(headers)
        if key is None:
            raise Unauthorized(
                "an API key is required: send 'Authorization: Bearer <key>' or 'x-api-key'"
            )
        entry = self._by_digest.get(digest(key))
        if entry is None:
            raise Unauthorized("the API key is not valid (unknown or revoked)")
        return Caller(entry)

    def admit(self, caller: Caller, texts: int) -> None:
        """Take one request and ``texts`` texts from the caller's buckets, or refuse with
        429 and when to come back. Nothing is taken from either bucket on a refusal."""
        key = caller.key
        if key is None:
            return
        now = self._clock()
        wanted = [
            (bucket, amount)
            for bucket, amount in (
                (self._bucket(key.id, "requests", key.requests_per_s, now), 1),
                (self._bucket(key.id, "texts", key.texts_per_s, now), texts),
            )
            if bucket is not None
        ]
        wait_s = max((bucket.wait_s(amount) for bucket, amount in wanted), default=0.0)
        if wait_s > 0:
            raise RateLimited(
                f"API key {key.id!r} is over its limit ({_limits(key)}); retry in {wait_s:.2f} s",
                retry_after_s=wait_s,
            )
        for bucket, amount in wanted:
            bucket.tokens -= amount

    def _bucket(self, key_id: str, what: str, rate: float | None, now: float) -> TokenBucket | None:
        if rate is None:
            return None
        rate *= self.share
        bucket = self._buckets.get((key_id, what))
        if bucket is None or bucket.rate != rate:
            bucket = TokenBucket(rate, max(1.0, rate * self.burst_s), now)
            self._buckets[(key_id, what)] = bucket
        bucket.refill(now)
        return bucket

    def _reload_if_changed(self, path: Path) -> None:
        now = self._clock()
        if now - self._checked_at < RELOAD_INTERVAL_S:
            return
        self._checked_at = now
        if _stamp(path) != self._stamp:
            try:
                self._load(path)
            except InvalidConfig as error:  # keep serving the keys known to be good
                log.error("%s; keeping the %d keys read before", error, len(self._by_digest))

    def _load(self, path: Path) -> None:
        stamp = _stamp(path)
        keys = read_keys(path).keys
        self._by_digest = {key.sha256: key for key in keys}
        self._stamp, self._checked_at = stamp, self._clock()
        known = {key.id for key in keys}
        self._buckets = {k: b for k, b in self._buckets.items() if k[0] in known}
        log.info("API keys: %d read from %s", len(keys), path)


def _stamp(path: Path) -> tuple[int, int] | None:
    """What changes when the file does (a Secret's update swaps the file)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _presented_key(headers: Mapping[str, str]) -> str | None:
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            return credentials.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def _limits(key: KeyEntry) -> str:
    parts = []
    if key.requests_per_s is not None:
        parts.append(f"{key.requests_per_s:g} requests/s")
    if key.texts_per_s is not None:
        parts.append(f"{key.texts_per_s:g} texts/s")
    return ", ".join(parts)

"""A closed-loop load generator on asyncio, for loopback servers only.

``concurrency`` workers each send the next request as soon as the previous answer is read,
for a duration, after a warm-up whose requests are not counted. What a worker sends over
is its target's (a ``LoadTarget``): here HTTP/1.1, a keep-alive connection per worker
(``HttpTarget``); gRPC in ``infergate.bench.grpc_load``. Requests are prepared as bytes
once, and answers are parsed just enough to find their end: on a 2-core box the generator
shares the CPU with the server it measures, so it should spend as little as it can (its
own CPU time is reported with every result). uvloop is used when installed.

Counting: a request counts when its answer arrives inside the measuring window, which
opens when the warm-up ends and closes at the first answer after the duration, but not
before every worker could answer about twice, so that a cell whose
requests take longer than the duration is still measured rather than empty. Throughput is
counted answers over the window's length. Requests in flight when the window closes are
awaited (so that they do not load the next measurement) and not counted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

LOOPBACK_NAMES = frozenset({"localhost"})
MAX_CONCURRENCY = 1024
MAX_DURATION_S = 600.0
ERROR_PAUSE_S = 0.005  # after a failed connection, so a dead server is not hammered in a loop
T = TypeVar("T")


def check_loopback(host: str) -> None:
    """Refuse anything but this machine: the generator is for local benchmarks only."""
    if host in LOOPBACK_NAMES:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"host {host!r} is not a loopback address; use 127.0.0.1 or ::1")


# One call's outcome: None or the failure's kind (counted as an error), and whether the
# worker should pause before its next call (its connection failed: no tight loop on a
# dead server).
Outcome = tuple[str | None, bool]


class LoadClient(Protocol):
    """What one worker sends its requests through."""

    async def call(self, request: bytes, timeout_s: float) -> Outcome:
        """Send one prepared request and wait for its whole answer."""
        ...

    async def close(self) -> None: ...


class LoadTarget(Protocol):
    """Where load goes: its requests, prepared once, and a client per worker."""

    def prepared(self) -> list[bytes]:
        """The requests as sent, cycled through by the workers."""
        ...

    def clients(self, count: int) -> list[LoadClient]:
        """``count`` clients, one per worker; made inside the running event loop."""
        ...


@dataclass(frozen=True)
class HttpTarget:
    """Where to send requests and the request bodies to cycle through."""

    host: str
    port: int
    path: str
    bodies: tuple[bytes, ...]

    def __post_init__(self) -> None:
        check_loopback(self.host)
        if not self.bodies:
            raise ValueError("a target needs at least one request body")
        if not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r} must start with '/'")

    def request_bytes(self, body: bytes) -> bytes:
        """One complete HTTP/1.1 POST request."""
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n"
        )
        return head.encode("ascii") + body

    def prepared(self) -> list[bytes]:
        return [self.request_bytes(body) for body in self.bodies]

    def clients(self, count: int) -> list[LoadClient]:
        return [HttpConnection(self.host, self.port) for _ in range(count)]


class HttpConnection:
    """A worker's keep-alive connection, opened on its first call and again after the
    server closed it or a call failed."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def call(self, request: bytes, timeout_s: float) -> Outcome:
        failure: str | None = None
        try:
            if self.reader is None or self.writer is None:
                self.reader, self.writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), timeout_s
                )
            reader, writer = self.reader, self.writer
            assert reader is not None and writer is not None
            writer.write(request)
            status, _, keep_alive = await asyncio.wait_for(read_response(reader), timeout_s)
            if status >= 400:
                failure = f"HTTP {status}"
        except asyncio.TimeoutError:
            failure, keep_alive = "timeout", False
        except (
            OSError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ) as exc:
            failure, keep_alive = type(exc).__name__, False
        if not keep_alive:
            await self.close()
        return failure, failure is not None and not keep_alive

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers of a response head (status line + headers)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = parts[1] if len(parts) >= 2 else ""
    if not (parts[0].startswith("HTTP/") and status.isascii() and status.isdigit()):
        raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Read one response; returns (status, body, connection reusable)."""
    status, headers = parse_head(await reader.readuntil(b"\r\n\r\n"))
    keep_alive = headers.get("connection", "").lower() != "close"
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)  # the data and its CRLF
            if size == 0:
                break
            chunks.append(chunk[:-2])
        body = b"".join(chunks)
    else:  # no length: the body ends with the connection
        body, keep_alive = await reader.read(), False
    return status, body, keep_alive


async def send_once(target: HttpTarget, body: bytes, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """One request on a fresh connection: for probes and readiness checks."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(target.host, target.port), timeout_s
    )
    try:
        writer.write(target.request_bytes(body))
        status, answer, _ = await asyncio.wait_for(read_response(reader), timeout_s)
        return status, answer
    finally:
        writer.close()


@dataclass
class LoadResult:
    """What one load run measured. Latencies are in milliseconds, in completion order."""

    concurrency: int
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    warmup_requests: int = 0
    window_s: float = 0.0
    elapsed_s: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies_ms) + sum(self.errors.values())

    @property
    def ok(self) -> int:
        return len(self.latencies_ms)

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.window_s if self.window_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """Figures for the report (successful requests only in the latencies)."""
        ordered = sorted(self.latencies_ms)
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "ok": self.ok,
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors),
            "window_s": round(self.window_s, 4),
            "elapsed_s": round(self.elapsed_s, 4),  # warm-up and the last answers too
            "requests_per_s": self.requests_per_s,
            "p50_ms": percentile(ordered, 50),
            "p95_ms": percentile(ordered, 95),
            "p99_ms": percentile(ordered, 99),
            "mean_ms": sum(ordered) / len(ordered) if ordered else math.nan,
            "max_ms": ordered[-1] if ordered else math.nan,
            # The generator's share of one core over the whole run, warm-up included.
            "client_cpu_percent": 100 * self.client_cpu_s / self.elapsed_s if self.elapsed_s else 0,
            "warmup_requests": self.warmup_requests,
        }


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of sorted values, interpolated linearly between the closest
    ranks (numpy's default method); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"q is {q}; expected 0..100")
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _check_bounds(concurrency: int, duration_s: float, warmup_s: float, timeout_s: float) -> None:
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency is {concurrency}; expected 1..{MAX_CONCURRENCY}")
    if not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"duration_s is {duration_s}; expected (0, {MAX_DURATION_S}]")
    if not 0 <= warmup_s <= MAX_DURATION_S:
        raise ValueError(f"warmup_s is {warmup_s}; expected 0..{MAX_DURATION_S}")
    if not 0 < timeout_s <= MAX_DURATION_S:
        raise ValueError(f"timeout_s is {timeout_s}; expected (0, {MAX_DURATION_S}]")


async def run_load(
    target: LoadTarget,
    *,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.0,
    timeout_s: float = 30.0,
) -> LoadResult:
    """Drive ``target`` with ``concurrency`` closed-loop workers (see the module docstring).

    The window closes at the first answer after ``duration_s`` once at least two answers
    per worker were counted. Bounded in time whatever the server does: the window closes
    after ``MAX_DURATION_S`` at the latest, and each request is abandoned after
    ``timeout_s`` (counted as an error, ``timeout``).
    """
    _check_bounds(concurrency, duration_s, warmup_s, timeout_s)
    floor = 2 * concurrency
    prepared = target.prepared()
    result = LoadResult(concurrency)
    cpu_start = time.process_time()
    start = time.perf_counter()
    window_start = start + warmup_s
    hard_stop = window_start + MAX_DURATION_S
    soft_stop = window_start + duration_s
    window_end: list[float] = []  # set once, by the answer that closes the window

    def count(ended: float, latency_ms: float, failure: str | None) -> None:
        if ended < window_start:
            result.warmup_requests += 1
            return
        if window_end:  # answered after the window closed: not counted
            return
        if failure is None:
            result.latencies_ms.append(latency_ms)
        else:
            result.errors[failure] += 1
        counted = result.requests
        if (ended >= soft_stop and counted >= floor) or ended >= hard_stop:
            window_end.append(ended)

    async def worker(index: int, client: LoadClient) -> None:
        position = index
        while not window_end:
            request = prepared[position % len(prepared)]
            position += concurrency
            began = time.perf_counter()
            failure, pause = await client.call(request, timeout_s)
            ended = time.perf_counter()
            count(ended, (ended - began) * 1e3, failure)
            if pause:
                await asyncio.sleep(ERROR_PAUSE_S)

    clients = target.clients(concurrency)
    try:
        await asyncio.gather(*(worker(i, client) for i, client in enumerate(clients)))
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    result.window_s = (window_end[0] if window_end else time.perf_counter()) - window_start
    result.client_cpu_s = time.process_time() - cpu_start
    result.elapsed_s = time.perf_counter() - start
    return result


def run_sync(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a fresh event loop, uvloop's when installed."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop comes with ray[serve]/uvicorn[standard]
        factory = None
    loop = factory() if factory is not None else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(make())
    finally:
        # After an interruption, end the workers still waiting so closing the loop is quiet.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

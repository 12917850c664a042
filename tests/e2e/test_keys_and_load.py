"""API keys, rate limits, load shedding and hostile clients on the real ingress: a stack
with `frontend.api_keys_file` set, keys made with `infergate keys create`, two tiny
models, and clients that send too much, too fast or too slowly."""

from __future__ import annotations

import contextlib
import math
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import Stack, running_stack, stack_env, wait_for

from tiny_models import tiny_bert

pytestmark = pytest.mark.e2e
BODY_TIMEOUT_S = 4
MAX_QUEUED_ROWS = 16
IDLE_TIMEOUT_S = 5


@dataclass(frozen=True)
class Keys:
    search: str  # model "alpha" only
    ops: str  # every model
    limited: str  # every model, 5 requests/s
    file: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Keys]]:
    state_dir = tmp_path_factory.mktemp("access-stack")
    env = stack_env(state_dir)
    keys_file = state_dir / "keys.yaml"
    env["INFERGATE_FRONTEND__API_KEYS_FILE"] = str(keys_file)
    env["INFERGATE_FRONTEND__BODY_TIMEOUT_S"] = str(BODY_TIMEOUT_S)
    env["INFERGATE_FRONTEND__MAX_QUEUED_ROWS"] = str(MAX_QUEUED_ROWS)
    env["INFERGATE_SERVE__CLIENT_IDLE_TIMEOUT_S"] = str(IDLE_TIMEOUT_S)
    env["INFERGATE_PROMETHEUS__ENABLED"] = "false"
    infergate = Stack.infergate

    def create(*args: str) -> str:
        made = subprocess_run(infergate, "keys", "create", *args, "--file", str(keys_file), env=env)
        return made.strip()

    keys = Keys(
        create("search", "--models", "alpha"),
        create("ops"),
        create("limited", "--requests-per-s", "5"),
        keys_file,
    )
    with running_stack(state_dir, env) as running:
        for name, task in (("alpha", "text-classification"), ("beta", "feature-extraction")):
            running.register(tiny_bert(state_dir / name, task), name, task, "--alias", "champion")
        with httpx.Client(base_url=running.url, timeout=30) as client:
            for name in ("alpha", "beta"):
                wait_for(
                    lambda n=name: predict(client, n, keys.ops).status_code == 200,
                    120,
                    f"{name} served",
                )
        yield running, keys


def subprocess_run(*command: str, env: dict[str, str]) -> str:
    import subprocess

    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def predict(client: httpx.Client, model: str, key: str | None, texts=("a fine day",)):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return client.post(f"/v1/models/{model}/predict", json={"inputs": list(texts)}, headers=headers)


@pytest.fixture
def http(stack) -> Iterator[httpx.Client]:
    running, _ = stack
    with httpx.Client(base_url=running.url, timeout=30) as client:
        yield client


def test_no_key_401_a_key_outside_its_scope_403(stack, http):
    _, keys = stack
    refused = predict(http, "alpha", None)
    assert refused.status_code == 401 and refused.json()["type"] == "unauthorized"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert predict(http, "alpha", "ig_not-a-key").status_code == 401
    assert http.get("/v1/models").status_code == 401
    assert http.get("/healthz").status_code == 200  # probes need no key
    assert predict(http, "alpha", keys.search).status_code == 200
    outside = predict(http, "beta", keys.search)
    assert outside.status_code == 403 and "may not call model 'beta'" in outside.json()["error"]
    listed = http.get("/v1/models", headers={"x-api-key": keys.search}).json()["models"]
    assert [m["name"] for m in listed] == ["alpha"]
    assert predict(http, "beta", keys.ops).status_code == 200


def test_grpc_calls_want_the_same_keys(stack):
    # tritonclient.grpc, unchanged: the key travels as the call's metadata.
    import numpy as np
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    running, keys = stack
    url = f"127.0.0.1:{running.env['INFERGATE_FRONTEND__GRPC_PORT']}"
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array(["a fine day"], dtype=object))
    with triton_grpc.InferenceServerClient(url=url) as client:
        assert client.is_server_live()  # probes need no key
        ops = {"authorization": f"Bearer {keys.ops}"}

        def answers() -> bool:
            # The stack's fixture waits for HTTP answers; HAProxy's gRPC backend checks
            # the replica's gRPC server on its own, and may not have it up yet.
            try:
                return client.infer("alpha", [text], headers=ops) is not None
            except InferenceServerException as error:
                # not up in the backend yet, or its replica without the table yet
                assert error.status() in ("StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND")
                return False

        wait_for(answers, 60, "gRPC answers")

        def refused(model: str, key: str | None) -> InferenceServerException:
            headers = {"authorization": f"Bearer {key}"} if key else None
            with pytest.raises(InferenceServerException) as info:
                client.infer(model, [text], headers=headers)
            return info.value

        assert refused("alpha", None).status() == "StatusCode.UNAUTHENTICATED"
        outside = refused("beta", keys.search)
        assert outside.status() == "StatusCode.PERMISSION_DENIED"
        assert "may not call model 'beta'" in outside.message()
        answered = client.infer("alpha", [text], headers={"authorization": f"Bearer {keys.search}"})
        assert answered.as_numpy("label").shape == (1,)


def test_the_key_id_is_on_the_metrics_and_the_key_nowhere(stack, http):
    running, keys = stack
    for _ in range(3):
        predict(http, "alpha", keys.search)
    predict(http, "beta", keys.search)
    metrics_url = f"http://127.0.0.1:{running.env['INFERGATE_SERVE__METRICS_EXPORT_PORT']}/metrics"

    def scraped() -> str | None:
        text = httpx.get(metrics_url, timeout=10).text
        wanted = ('key="search"', 'status="403"', 'model="beta"')
        # Ray's exporter names them ray_infergate_...; Prometheus's scrape drops the prefix.
        lines = [line for line in text.splitlines() if line.startswith("ray_infergate_api_key")]
        return text if any(all(w in line for w in wanted) for line in lines) else None

    text = wait_for(scraped, 60, "the key's requests on the metrics")
    for key in (keys.search, keys.ops, keys.limited):
        assert key not in text
        assert key not in keys.file.read_text()
    # Every Ray session's, not "session_latest": another worker's stack may have started
    # since this one.
    ray_temp = Path(tempfile.gettempdir()) / "ray"
    for log in ray_temp.glob("session_*/logs/serve/replica_infergate_frontend_*.log"):
        assert keys.search not in log.read_text(errors="replace"), log


def test_a_revoked_key_is_refused_within_seconds(stack, http):
    running, _ = stack
    keys_file = Path(running.env["INFERGATE_FRONTEND__API_KEYS_FILE"])
    key = subprocess_run(
        running.infergate, "keys", "create", "temporary", "--file", str(keys_file),
        env=running.env,
    ).strip()  # fmt: skip
    wait_for(lambda: predict(http, "alpha", key).status_code == 200, 15, "a new key taken")
    subprocess_run(running.infergate, "keys", "revoke", "temporary", "--file", str(keys_file),
                   env=running.env)  # fmt: skip
    revoked_at = time.monotonic()
    wait_for(lambda: predict(http, "alpha", key).status_code == 401, 15, "the key refused")
    assert time.monotonic() - revoked_at < 10


def test_a_key_over_its_rate_gets_429_and_the_others_do_not(stack, http):
    _, keys = stack
    started = time.monotonic()
    statuses = [predict(http, "alpha", keys.limited).status_code for _ in range(40)]
    elapsed = time.monotonic() - started
    passed = statuses.count(200)
    assert set(statuses) == {200, 429}, statuses
    # 5 requests/s and a second's burst, shared by the replicas: no more passes.
    assert passed <= 5 * elapsed + 5 + 1, (passed, elapsed)
    limited = predict(http, "alpha", keys.limited)
    if limited.status_code == 429:
        assert limited.json()["type"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
    assert all(predict(http, "alpha", keys.ops).status_code == 200 for _ in range(10))


def test_a_flood_is_shed_at_once_rather_than_queued(stack):
    running, keys = stack
    texts = [f"text number {i} of a long batch of words" for i in range(MAX_QUEUED_ROWS)]

    def one(_: int) -> tuple[int, float]:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            sent = time.monotonic()
            status = predict(client, "alpha", keys.ops, texts).status_code
            return status, time.monotonic() - sent

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(one, range(256)))
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert statuses.count(429) > 0, "nothing was shed"
    shed = [seconds for status, seconds in answers if status == 429]
    served = [seconds for status, seconds in answers if status == 200]
    # Nothing waits behind more than MAX_QUEUED_ROWS texts of its model: latency stays
    # bounded however many arrive (the ingress and the event loop still queue a little).
    # A refusal is answered at once. Bounded is said of 99 % of the answers: the slowest
    # alone is one outlier of 256 on a busy 2-core box (one CI run: 5.02 s, not traced;
    # a quiet run's slowest is about 0.8 s).
    times = sorted(seconds for _, seconds in answers)
    p99, slowest = times[math.ceil(0.99 * len(times)) - 1], times[-1]
    assert statistics.median(shed) < 1.0, statistics.median(shed)
    assert p99 < 5.0, (p99, slowest)
    print(f"\nflood: {len(served)} answered (median {statistics.median(served):.2f} s), "
          f"{len(shed)} shed (median {statistics.median(shed):.3f} s), "
          f"p99 {p99:.2f} s, slowest {slowest:.2f} s")  # fmt: skip


class SlowClients:
    """``count`` connections that send the request line and headers, then ``body`` one
    byte every ``every_s`` (or, ``headers_only``, the headers themselves a byte at a time)."""

    def __init__(
        self, url: str, key: str, count: int, every_s: float, headers_only: bool = False
    ) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))
        self.key = key
        self.count = count
        self.every_s = every_s
        self.headers_only = headers_only
        self.sockets: list[socket.socket] = []
        self.answers: dict[int, bytes] = {}  # socket index -> the first bytes it got
        self._stop = threading.Event()

    def __enter__(self) -> SlowClients:
        body = b'{"inputs": "' + b"x" * 64 + b'"}'
        head = (
            b"POST /v1/models/alpha/predict HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            + f"Authorization: Bearer {self.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        for _ in range(self.count):
            sock = socket.create_connection(self.address, timeout=60)
            if not self.headers_only:
                sock.sendall(head)
            self.sockets.append(sock)
        trickle = head if self.headers_only else body
        self._thread = threading.Thread(target=self._dribble, args=(trickle,), daemon=True)
        self._thread.start()
        return self

    def _dribble(self, data: bytes) -> None:
        for index in range(len(data) - 1):  # never the last byte
            if self._stop.wait(self.every_s):
                return
            for sock in self.sockets:
                with contextlib.suppress(OSError):  # closed by the server: refused
                    sock.send(data[index : index + 1])

    def closed_or_answered(self) -> int:
        """Connections the server answered (408) or closed so far; keeps each first answer."""
        for index, sock in enumerate(self.sockets):
            if index in self.answers:
                continue
            sock.settimeout(0.01)
            try:
                self.answers[index] = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                self.answers[index] = b""
        return len(self.answers)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self.sockets:
            sock.close()


def latencies(running: Stack, key: str, count: int) -> list[float]:
    seconds = []
    with httpx.Client(base_url=running.url, timeout=30) as client:
        for _ in range(count):
            sent = time.monotonic()
            assert predict(client, "alpha", key).status_code == 200
            seconds.append(time.monotonic() - sent)
    return seconds


@pytest.mark.quiet
@pytest.mark.parametrize("headers_only", [False, True], ids=["slow-bodies", "slow-headers"])
def test_slow_clients_do_not_stop_the_endpoint_answering_others(stack, headers_only):
    running, keys = stack
    with SlowClients(running.url, keys.ops, 400, every_s=1.0, headers_only=headers_only) as slow:
        time.sleep(1.5)  # every slow request has reached wherever it waits
        seconds = latencies(running, keys.ops, 30)
        what = "headers" if headers_only else "bodies"
        median_ms = statistics.median(seconds) * 1e3
        print(f"\n{what} of 400 slow clients: 30 answers, median {median_ms:.0f} ms, "
              f"max {max(seconds):.2f} s")  # fmt: skip
        assert max(seconds) < 2.0, seconds
        if not headers_only:
            wait_for(lambda: slow.closed_or_answered() == 400, BODY_TIMEOUT_S + 20,
                     "every slow upload refused")  # fmt: skip
            status_lines = {answer.split(b"\r\n")[0] for answer in slow.answers.values()}
            assert status_lines == {b"HTTP/1.1 408 Request Timeout"}, status_lines


def test_the_openai_and_triton_clients_carry_keys(stack):
    import numpy as np
    import openai
    import tritonclient.http as triton_http
    from tritonclient.utils import InferenceServerException

    running, keys = stack

    def client(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{running.url}/openai/v1", api_key=key, max_retries=0)

    vectors = client(keys.ops).embeddings.create(model="beta", input=["a", "b"])
    assert len(vectors.data) == 2
    with pytest.raises(openai.AuthenticationError):
        client("ig_wrong").embeddings.create(model="beta", input="a")
    with pytest.raises(openai.PermissionDeniedError):
        client(keys.search).embeddings.create(model="beta", input="a")
    assert [m.id for m in client(keys.search).models.list()] == ["alpha"]
    with pytest.raises(openai.RateLimitError):
        for _ in range(40):
            client(keys.limited).embeddings.create(model="beta", input="a")

    triton = triton_http.InferenceServerClient(running.url.removeprefix("http://"))
    text = triton_http.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array(["a fine day"], dtype=object))
    assert triton.is_server_ready()  # a probe: no key
    answer = triton.infer("alpha", [text], headers={"authorization": f"Bearer {keys.search}"})
    assert answer.as_numpy("probabilities").shape == (1, 2)
    with pytest.raises(InferenceServerException, match="API key is required"):
        triton.infer("alpha", [text])


def test_an_idle_connection_is_closed_by_the_ingress(stack):
    running, _ = stack
    host, port = running.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=IDLE_TIMEOUT_S + 30) as idle:
        opened = time.monotonic()
        answer = idle.recv(4096)  # blocks until the ingress answers or closes
        waited = time.monotonic() - opened
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert IDLE_TIMEOUT_S - 1 < waited < IDLE_TIMEOUT_S + 10, waited

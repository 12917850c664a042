"""Two Tritons the platform did not start, each on a "host" of its own (a network
namespace running `infergate triton`), behind one name that resolves to both addresses,
as a Kubernetes headless Service resolves to its pods. With a budget of one loaded
version per Triton and three models, each Triton holds a version of its own: a version
is hot on one Triton and cold on the other, and the front-end replicas send its
requests to the Triton that holds it.

The name is listed in an /etc/hosts of the stack's own (its CLI runs in a mount
namespace where a copy with both addresses lies over the file). Checked with the
user's clients: httpx for the stack, tritonclient for what each Triton holds and ran.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import mlflow
import pytest
import tritonclient.http as triton_http
from conftest import Stack, running_stack, stack_env, wait_for
from triton_hosts import TritonHost, running_triton_host

from infergate.registry import Registry
from network_hosts import unavailable
from tiny_models import tiny_bert

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.machine("netns", unavailable()),
]
FLEET = "triton-fleet"  # the name both Tritons' addresses are listed under
MODELS = ["left", "right", "third"]  # three versions, room for two in the fleet
TASK = "text-classification"
TEXTS = ["i love this film", "the service was slow"]
PORTS = ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT")


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet-stack")


@pytest.fixture(scope="module")
def tritons(
    stack_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[TritonHost]]:
    """Two Tritons, on the same ports of two addresses (a fleet's settings name one port)."""
    ports = stack_env(stack_dir)
    with ExitStack() as started:
        hosts = []
        for side in "ab":
            state_dir = tmp_path_factory.mktemp(f"fleet-triton-{side}")
            env = stack_env(state_dir)
            env.update({f"INFERGATE_TRITON__{p}": ports[f"INFERGATE_TRITON__{p}"] for p in PORTS})
            name = f"igf{os.getpid() % 10000}{side}"
            hosts.append(
                started.enter_context(running_triton_host(name, env, state_dir, stack_dir))
            )
        yield hosts


@pytest.fixture(scope="module")
def stack(tritons: list[TritonHost], stack_dir: Path) -> Iterator[Stack]:
    """The platform on this machine, with a budget of one version per Triton."""
    hosts = stack_dir.parent / f"{stack_dir.name}-hosts"
    listed = "".join(f"{t.host.address} {FLEET}\n" for t in tritons)
    hosts.write_text(Path("/etc/hosts").read_text() + listed)
    in_own_hosts = (
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts),
    )  # fmt: skip
    env = stack_env(stack_dir)
    env.update({f"INFERGATE_TRITON__{p}": tritons[0].env[f"INFERGATE_TRITON__{p}"] for p in PORTS})
    env["INFERGATE_TRITON__EXTERNAL_HOST"] = FLEET
    env["INFERGATE_TRITON__BACKEND"] = "auto"  # the wheel's Triton: the Python backend
    env["INFERGATE_TRITON__MAX_LOADED_VERSIONS"] = "1"
    env["INFERGATE_PROMETHEUS__ENABLED"] = "false"
    with running_stack(stack_dir, env, prefix=in_own_hosts) as running:
        folder = tiny_bert(stack_dir / "source", TASK)
        running.register(folder, MODELS[0], TASK, "--alias", "champion")
        registry = Registry(running.mlflow)
        files = Path(
            mlflow.artifacts.download_artifacts(
                registry.version_source(MODELS[0], "1"),
                dst_path=str(stack_dir / "files"),
                tracking_uri=running.mlflow,
            )
        )
        for name in MODELS[1:]:  # the same files under other names: MLflow calls only
            registry.register(name, TASK, files, metrics={}, params={}, tags={}, alias="champion")
        yield running


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        wait_for(lambda: set(MODELS) <= _served(client), 300, "the three models served")
        yield client


def _served(client: httpx.Client) -> set[str]:
    answer = client.get("/v1/models")
    return {m["name"] for m in answer.json()["models"]} if answer.status_code == 200 else set()


def _holdings(tritons: list[TritonHost]) -> list[set[str]]:
    """Which of the models each Triton has ready, as its operator's client sees it."""
    held = []
    for triton in tritons:
        client = triton_http.InferenceServerClient(triton.http_url)
        held.append({name for name in MODELS if client.is_model_ready(f"{name}__v1")})
    return held


def _successes(triton: TritonHost, name: str) -> int:
    client = triton_http.InferenceServerClient(triton.http_url)
    stats = client.get_inference_statistics(f"{name}__v1")["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def _counted(triton: TritonHost, name: str, at_least: int) -> bool:
    return _successes(triton, name) >= at_least


def test_each_triton_holds_versions_of_its_own_and_requests_go_where_they_are(tritons, http):
    cold_starts = 0
    holders: set[str] = set()  # the Tritons that answered a rotating version
    for _round in range(2):
        for name in MODELS:
            response = http.post(f"/v1/models/{name}/predict", json={"inputs": TEXTS})
            assert response.status_code == 200, response.text
            cold_starts += "x-cold-start" in response.headers
            held = _holdings(tritons)
            # The budget holds per Triton, the version just answered is hot on one Triton
            # and cold on the other, and the third version is on neither.
            assert all(len(h) <= 1 for h in held), held
            assert [name in h for h in held].count(True) == 1, (name, held)
            assert len(held[0] | held[1]) == 2, held
            # Hot requests now: each is answered by the Triton that holds the version,
            # which the replicas call at its own address (the name resolves to both).
            holder = tritons[[name in h for h in held].index(True)]
            holders.add(holder.host.address)
            before = _successes(holder, name)
            for _ in range(4):
                again = http.post(f"/v1/models/{name}/predict", json={"inputs": TEXTS})
                assert again.status_code == 200 and "x-cold-start" not in again.headers
            # A backend reports a request's statistics after it has sent the answer, so
            # the last count may land a moment after the client has it.
            wait_for(
                functools.partial(_counted, holder, name, before + 4),
                10,
                f"{holder.host.address} counting the four requests for {name}",
            )
    # Three versions in two slots, asked for in turn: the one asked for is the one
    # unloaded longest ago, so most requests load their version (and the first may find
    # its version still loaded by the registration).
    assert cold_starts >= 4, cold_starts
    # Both Tritons answered: the replicas' calls do not all go to one address of the name.
    assert holders == {t.host.address for t in tritons}, holders
    print(f"\n{cold_starts} cold starts in 6 rotating requests over two Tritons")

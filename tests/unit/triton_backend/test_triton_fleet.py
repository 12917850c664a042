"""The Tritons the control plane keeps loaded, with their control API replaced by fakes:
every address a host resolves to gets every version, through a shared folder or with the
load request, and one that lost its versions (restarted empty, or new) is found.

A real Triton in another network namespace, empty, loaded over its API: tests/e2e/
test_external_triton.py."""

import json

import pytest

from fakes import FakePods as Pods
from infergate.config import TritonSettings
from infergate.errors import BackendUnavailable
from infergate.triton.fleet import PROBE_MODEL, resolve
from infergate.triton.repository import model_files


@pytest.fixture
def version_files(tmp_path):
    onnx_path = tmp_path / "model.onnx"
    onnx_path.write_bytes(b"onnx bytes")
    return model_files(
        "m__v1", onnx_path, output_name="logits", output_dim=2, settings=TritonSettings()
    )


def test_every_pod_gets_the_files_with_the_load_when_no_folder_is_shared(version_files):
    pods = Pods("10.1.0.5", "10.1.0.6")
    fleet = pods.fleet()
    fleet.load(version_files)
    assert sorted(pods.tritons) == ["10.1.0.5:8101", "10.1.0.6:8101"]
    for triton in pods.tritons.values():
        ((model, request),) = triton.requests
        assert model == "m__v1" and json.loads(request["config"])["name"] == "m__v1"
        assert request["files"]["file:1/model.onnx"] == b"onnx bytes"


def test_a_shared_folder_is_written_once_and_loaded_by_name(version_files, tmp_path):
    pods = Pods("10.1.0.5", "10.1.0.6")
    fleet = pods.fleet(repository=tmp_path / "shared")
    fleet.load(version_files)
    assert (tmp_path / "shared" / "m__v1" / "config.pbtxt").is_file()
    assert [t.requests for t in pods.tritons.values()] == [
        [("m__v1", {"config": None, "files": None})]
    ] * 2
    fleet.unload("m__v1")
    assert not (tmp_path / "shared" / "m__v1").exists()
    assert [t.unloaded for t in pods.tritons.values()] == [["m__v1"]] * 2


def test_a_pod_that_lost_its_versions_is_found_and_only_it_is_loaded_again(version_files):
    pods = Pods("10.1.0.5", "10.1.0.6")
    fleet = pods.fleet()
    fleet.load(version_files)
    assert fleet.missing(lambda triton: ["m__v1"]) == {}
    pods.tritons["10.1.0.6:8101"].ready.clear()  # it restarted, empty
    pods.addresses.append("10.1.0.7")  # and a new pod came up
    assert fleet.missing(lambda triton: ["m__v1"]) == {"m__v1": ["10.1.0.6:8101", "10.1.0.7:8101"]}
    fleet.load(version_files, only=["10.1.0.6:8101", "10.1.0.7:8101"])
    assert [len(pods.tritons[u].requests) for u in sorted(pods.tritons)] == [1, 2, 1]
    assert fleet.missing(lambda triton: ["m__v1"]) == {}


def test_a_triton_that_does_not_answer_is_not_counted_as_lacking(version_files):
    """Nothing can be loaded into it now; once it answers again, empty, it is."""
    pods = Pods("10.1.0.5", "10.1.0.6")
    fleet = pods.fleet()
    fleet.load(version_files)
    away = pods.tritons["10.1.0.6:8101"]
    away.up, away.ready = False, set()
    assert fleet.missing(lambda triton: ["m__v1"]) == {} and not fleet.ready()
    away.up = True
    assert fleet.missing(lambda triton: ["m__v1"]) == {"m__v1": ["10.1.0.6:8101"]} and fleet.ready()


def test_a_pod_that_went_away_is_let_go(version_files):
    pods = Pods("10.1.0.5", "10.1.0.6")
    fleet = pods.fleet()
    fleet.load(version_files)
    gone = pods.tritons["10.1.0.6:8101"]
    pods.addresses.remove("10.1.0.6")
    assert list(fleet.endpoints()) == ["10.1.0.5:8101"] and gone.closed


def test_no_triton_behind_the_name_is_an_unavailable_backend(version_files):
    fleet = Pods().fleet()
    with pytest.raises(BackendUnavailable, match="no Triton answers at triton-headless"):
        fleet.load(version_files)
    assert not fleet.ready()


@pytest.mark.parametrize("native, backend", [(True, "onnxruntime"), (False, "python")])
def test_auto_asks_the_server_which_backend_it_can_load(native, backend):
    pods = Pods("10.1.0.5", native=native)
    fleet = pods.fleet(backend="auto")
    assert fleet.model_settings().backend == backend
    triton = pods.tritons["10.1.0.5:8101"]
    assert triton.ready == set()  # the probe is not left behind
    assert triton.unloaded == ([PROBE_MODEL] if native else [])
    fleet.model_settings()  # asked once
    assert len(triton.requests) == (1 if native else 0)


def test_names_and_addresses_resolve():
    assert resolve("127.0.0.1") == ["127.0.0.1"]
    assert "127.0.0.1" in resolve("localhost")
    assert resolve("no-such-host.invalid") == []


def test_a_triton_away_during_the_probe_decides_no_backend():
    """Only a refused probe means "no native backend"; an unreachable Triton is asked
    again at the next load."""
    pods = Pods("10.1.0.5", native=True)
    fleet = pods.fleet(backend="auto")
    fleet.endpoints()
    pods.tritons["10.1.0.5:8101"].load = _unreachable  # type: ignore[method-assign]
    with pytest.raises(BackendUnavailable):
        fleet.model_settings()
    del pods.tritons["10.1.0.5:8101"].load  # back to the fake's own
    assert fleet.model_settings().backend == "onnxruntime"


def _unreachable(*args, **kwargs) -> None:
    raise BackendUnavailable("Triton at 10.1.0.5:8101 is not reachable.")


def test_a_host_with_ipv4_and_ipv6_is_one_triton_and_dns_away_is_no_empty_fleet(monkeypatch):
    import socket

    from infergate.errors import BackendUnavailable
    from infergate.triton import fleet

    def both(host, port, type=0):
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]  # fmt: skip

    monkeypatch.setattr(socket, "getaddrinfo", both)
    assert fleet.resolve("localhost") == ["127.0.0.1"]

    def again(host, port, type=0):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", again)
    with pytest.raises(BackendUnavailable, match="cannot look up"):
        fleet.resolve("triton.infergate.svc")

    def unknown(host, port, type=0):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    assert fleet.resolve("triton.infergate.svc") == []  # no ready pod: no address


def test_a_new_version_one_pod_refuses_is_taken_back_from_the_pods_that_loaded_it(
    version_files,
):
    from infergate.errors import RegistrationError

    pods = Pods("10.1.0.5", "10.1.0.6")
    fleet = pods.fleet()
    fleet.endpoints()
    pods.tritons["10.1.0.6:8101"].refuse = "out of memory"
    with pytest.raises(RegistrationError, match="out of memory"):
        fleet.load(version_files)
    first = pods.tritons["10.1.0.5:8101"]
    assert first.loaded == ["m__v1"] and first.unloaded == ["m__v1"]
    assert not first.is_ready("m__v1")


def test_an_unload_from_one_triton_keeps_the_shared_files_the_others_load(version_files, tmp_path):
    pods = Pods("10.1.0.5", "10.1.0.6")
    fleet = pods.fleet(repository=tmp_path / "shared")
    fleet.load(version_files)
    fleet.unload("m__v1", only=["10.1.0.6:8101"])
    assert [t.unloaded for t in pods.tritons.values()] == [[], ["m__v1"]]
    assert (tmp_path / "shared" / "m__v1" / "config.pbtxt").is_file()
    assert fleet.missing(lambda triton: ["m__v1"] if triton == "10.1.0.5:8101" else []) == {}
    fleet.unload("m__v1", only=["10.1.0.5:8101", "10.1.0.6:8101"])
    assert not (tmp_path / "shared" / "m__v1").exists()


def test_a_load_into_tritons_that_no_longer_resolve_fails_rather_than_doing_nothing(
    version_files,
):
    pods = Pods("10.1.0.5")
    fleet = pods.fleet()
    with pytest.raises(BackendUnavailable, match="resolves"):
        fleet.load(version_files, only=["10.1.0.9:8101"])

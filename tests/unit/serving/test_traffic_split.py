"""The front-end's choice of version: weights, sticky routing keys, pinning."""

from dataclasses import dataclass, field

import pytest

from infergate.errors import ModelNotFound
from infergate.serving.routing import ServedModel
from infergate.versions import ServedVersion


@dataclass
class FakeRuntime:
    """Only what ServedModel.pick reads of a ModelRuntime."""

    served: ServedVersion
    spec: object = field(default=None)


def model(champion_weight: int, canary_weight: int) -> ServedModel:
    versions = (
        FakeRuntime(ServedVersion("m", "1", "t", "s", "champion", champion_weight)),
        FakeRuntime(ServedVersion("m", "2", "t", "s", "canary", canary_weight)),
    )
    return ServedModel("m", "t", versions)  # type: ignore[arg-type]


def test_random_split_follows_the_weights():
    served = model(75, 25)
    draws = iter(i / 1000 for i in range(1000))
    picks = [served.pick(draw=lambda: next(draws)).served.version for _ in range(1000)]
    assert picks.count("2") == 250


def test_routing_keys_split_by_weight_and_stick():
    served = model(70, 30)
    picks = {f"user-{i}": served.pick(f"user-{i}").served.version for i in range(2000)}
    share = sum(v == "2" for v in picks.values()) / len(picks)
    assert share == pytest.approx(0.30, abs=0.03)
    assert all(served.pick(key).served.version == v for key, v in list(picks.items())[:200])


def test_keys_on_the_canary_stay_there_as_its_weight_grows():
    small, large = model(90, 10), model(50, 50)
    keys = [f"k{i}" for i in range(1000)]
    on_canary = {k for k in keys if small.pick(k).served.version == "2"}
    assert on_canary and all(large.pick(k).served.version == "2" for k in on_canary)


def test_pinning_and_unknown_versions():
    served = model(100, 0)
    assert served.pick(pinned="2").served.version == "2"
    with pytest.raises(ModelNotFound, match=r"version '9' .* served: 1, 2"):
        served.pick(pinned="9")


@pytest.mark.parametrize(("champion", "canary", "only"), [(100, 0, "1"), (0, 100, "2")])
def test_a_version_at_weight_0_gets_only_pinned_requests(champion, canary, only):
    served = model(champion, canary)
    draws = [0.0, 0.5, 0.999999, 1.0 - 1e-12]
    assert {served.pick(draw=lambda d=d: d).served.version for d in draws} == {only}
    assert {served.pick(f"user-{i}").served.version for i in range(500)} == {only}
    assert {served.pick(pinned=v).served.version for v in "12"} == {"1", "2"}

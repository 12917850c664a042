import numpy as np

from infergate.control.windows import StepWindows
from infergate.observe.counters import VersionCounters

STEP = ("m", "2", 1000.0)


def served(n: int) -> VersionCounters:
    counters = VersionCounters()
    for _ in range(n):
        counters.add(200, 0.01, np.array([[1.0, 0.0]]), ["a", "b"])
    return counters


def test_a_step_counts_what_the_counters_gained_since_it_was_first_seen():
    windows = StepWindows()
    assert windows.advance(STEP, {"m/2": served(50)}) == {}
    window = windows.advance(STEP, {"m/2": served(80), "m/1": served(5)})
    assert window["m/2"].requests == 30 and window["m/1"].requests == 5
    windows.keep_only(set())
    assert windows.advance(STEP, {"m/2": served(90)}) == {}  # forgotten: starts afresh


def test_a_broken_file_starts_afresh(tmp_path, caplog):
    path = tmp_path / "windows.json"
    path.write_text('{"steps": [{"step": ["m"]}]}')
    windows = StepWindows(path)
    assert windows.advance(STEP, {"m/2": served(3)}) == {}
    assert "cannot be read" in caplog.text
    windows.save()
    assert StepWindows(path).advance(STEP, {"m/2": served(4)})["m/2"].requests == 1

"""What each rollout step has seen so far, kept on disk.

Canary analysis compares a canary with its champion over the current step: the front-end
replicas' counters since the step began. The counters are cumulative and live in the
replicas, so a step's window is built up tick by tick from what they gained, and written
to a file: a control plane restarted mid-step goes on with the step's figures rather than
waiting for a new window's worth of traffic (and, at the 100 % step, where the champion
gets no traffic, with the champion's figures from the step before). Counters that went
down mean front-end replicas started afresh; what they hold then is all new.

Pure: a JSON file, no Ray.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from infergate.files import write_atomically
from infergate.observe.counters import VersionCounters, VersionWindow

log = logging.getLogger(__name__)
Step = tuple[str, str, float]  # model, canary version, when the step began
Rollout = tuple[int, str, str]  # model's creation, canary, champion


class StepWindows:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._seen: dict[Step, dict[str, VersionCounters]] = {}  # cumulative, last tick
        self._windows: dict[Step, dict[str, VersionCounters]] = {}  # since the step began
        # Per model: the champion's latest window with enough requests to judge the 100 %
        # step by, and the rollout it was taken in.
        self.champions: dict[str, tuple[Rollout, VersionWindow]] = {}
        self._saved: str | None = None  # what the file holds, as last written
        if path is not None:
            self._read(path)

    def advance(
        self, step: Step, counters: dict[str, VersionCounters]
    ) -> dict[str, VersionCounters]:
        """The window of ``step`` once what ``counters`` (cumulative, per ``model/version``)
        gained since the last call is added. A step first seen starts empty."""
        seen = self._seen.get(step)
        window = self._windows.setdefault(step, {})
        if seen is not None:
            for key, now in counters.items():
                before = seen.get(key)
                # None: new since; fewer: the replicas started afresh, all they hold is new
                restarted = before is not None and (
                    now.requests < before.requests or now.shadow.requests < before.shadow.requests
                )
                gained = now if before is None or restarted else now.minus(before)
                window[key] = window[key].merged(gained) if key in window else gained
        self._seen[step] = dict(counters)
        return window

    def keep_only(self, running: set[Step]) -> None:
        """Forget steps no longer running (advanced, promoted, rolled back)."""
        for step in set(self._windows) - running:
            self._windows.pop(step, None)
            self._seen.pop(step, None)

    def save(self) -> None:
        if self.path is None:
            return
        data = {
            "steps": [
                {
                    "step": list(step),
                    "seen": _dump(self._seen.get(step, {})),
                    "window": _dump(window),
                }
                for step, window in self._windows.items()
            ],
            "champions": {
                model: {"rollout": list(rollout), "window": list(_window_fields(window))}
                for model, (rollout, window) in self.champions.items()
            },
        }
        text = json.dumps(data)
        if text == self._saved:  # most rounds, and every round while no rollout runs
            return
        write_atomically(self.path, text)
        self._saved = text

    def _read(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
            for entry in data["steps"]:
                model, canary, started = entry["step"]
                step = (str(model), str(canary), float(started))
                self._seen[step] = _load(entry["seen"])
                self._windows[step] = _load(entry["window"])
            for model, entry in data["champions"].items():
                created, canary, champion = entry["rollout"]
                requests, errors, p95, shares, latency, classes = entry["window"]
                window = VersionWindow(
                    requests, errors, p95, tuple(shares), tuple(latency), tuple(classes)
                )
                self.champions[model] = ((int(created), str(canary), str(champion)), window)
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError) as exc:  # analysis starts the steps afresh
            log.warning("the rollout windows in %s cannot be read (%s); starting afresh", path, exc)
            self._seen.clear()
            self._windows.clear()
            self.champions.clear()


def _dump(counters: dict[str, VersionCounters]) -> dict[str, dict]:
    return {key: value.to_dict() for key, value in counters.items()}


def _load(data: dict[str, dict]) -> dict[str, VersionCounters]:
    return {key: VersionCounters.from_dict(value) for key, value in data.items()}


def _window_fields(window: VersionWindow) -> tuple:
    return (
        window.requests, window.errors, window.p95_ms, list(window.output_shares),
        list(window.latency_counts), list(window.classes),
    )  # fmt: skip

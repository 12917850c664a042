"""Where a front-end replica's CPU goes, from a py-spy profile: shares by part of the path.

Record a running replica (the pid of ``ray::ServeReplica:infergate:frontend``) under load,
with native frames so that time in C (uvloop, gRPC's core, the tokenizer) is seen, then
read it here::

    py-spy record -p PID -d 20 -r 100 --native --format speedscope -o replica.json
    python -m infergate.bench.profile_shares replica.json

Each sample goes to the part of its innermost frame that one of ``PARTS`` names (numpy
called by the platform's statistics counts as statistics). Samples whose innermost frame
waits (``epoll_wait``, a lock or condition variable) are idle and left out: py-spy keeps threads
that wait in C as active, and without native frames the event loop's wait shows as
``Thread.run``. Pure: a speedscope document in, shares out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

# (part, substrings of "file:function"), tried in order on each frame from the innermost.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tokenization", ("tokenizers", "infergate/serving/tokenization.py")),
    ("JSON parse/render", ("orjson", "infergate/protocols/wire.py", "http.py:json_")),
    (
        "gRPC client and protobuf",
        ("tritonclient", "/grpc/", "cygrpc", "google/protobuf", "infergate/triton/client.py"),
    ),
    ("platform metrics, drift, counters", ("infergate/observe/",)),
    ("prometheus_client", ("prometheus_client",)),
    ("platform request path (rest)", ("infergate/",)),
    ("Starlette, uvicorn (ASGI)", ("starlette/", "uvicorn/", "httptools", "llhttp")),
    ("Ray Serve request path", ("ray/serve/",)),
    ("Ray core", ("ray/", "_raylet")),
    ("asyncio event loop", ("asyncio", "uvloop", "loop.c", "threading.py", "libuv")),
)
# Innermost frames of a thread that waits rather than works.
IDLE = (
    "epoll_wait", "epoll_pwait", "pthread_cond_wait", "pthread_cond_timedwait", "futex",
    "sem_wait", "sem_timedwait", "nanosleep", ":poll", ":select",
    "PyThread_acquire_lock", "take_gil", "threading.py:Thread.run", "threading.py:wait",
    "thread.py:_worker", "worker.py:main_loop",
)  # fmt: skip
OTHER = "other (interpreter, libc)"


def _key(frame: dict[str, Any]) -> str:
    return f"{frame.get('file', '')}:{frame.get('name', '')}"


def part_of(key: str) -> str | None:
    """The part a frame (``file:function``) belongs to; None when no part names it."""
    for part, needles in PARTS:
        if any(needle in key for needle in needles):
            return part
    return None


def _idle(keys: list[str]) -> bool:
    """Whether a stack (innermost last) waits: its innermost frame with a symbol (libc's
    inner frames often have none) is one of ``IDLE``."""
    for key in reversed(keys):
        file, _, name = key.rpartition(":")
        if name.startswith("0x"):
            continue
        short = f"{file.rsplit('/', 1)[-1]}:{name}"
        return any(marker in key or marker == short for marker in IDLE)
    return False


def shares(document: dict[str, Any]) -> dict[str, Any]:
    """Busy seconds sampled, idle seconds left out, and each part's share of the busy ones
    (largest first), from a speedscope document written by ``py-spy --format speedscope``."""
    keys = [_key(frame) for frame in document["shared"]["frames"]]
    parts = [part_of(key) for key in keys]
    busy: Counter[str] = Counter()
    idle = 0.0
    for profile in document["profiles"]:
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            if not stack or _idle([keys[i] for i in stack[-4:]]):
                idle += weight
                continue
            part = next((parts[i] for i in reversed(stack) if parts[i] is not None), OTHER)
            busy[part] += weight
    total = sum(busy.values())
    return {
        "busy_s": round(total, 3),
        "idle_s": round(idle, 3),
        "shares": {part: round(s / total, 4) for part, s in busy.most_common()} if total else {},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", nargs="+", type=Path, help="speedscope JSON files")
    args = parser.parse_args(argv)
    for path in args.profiles:
        result = shares(json.loads(path.read_text()))
        print(f"{path}: {result['busy_s']:.2f} s busy, {result['idle_s']:.2f} s idle")
        for part, share in result["shares"].items():
            print(f"  {100 * share:5.1f} %  {part}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

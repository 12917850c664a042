"""Reading a py-spy profile of a replica into shares by part (infergate.bench.profile_shares)."""

from __future__ import annotations

import pytest

from infergate.bench.profile_shares import OTHER, part_of, shares

FRAMES = [
    {"name": "run_forever", "file": "uvloop/loop.c"},  # 0
    {"name": "serve_inference", "file": "/x/infergate/protocols/frontend.py"},  # 1
    {"name": "__call__", "file": "/x/infergate/serving/tokenization.py"},  # 2
    {"name": "encode_batch_fast", "file": "/venv/tokenizers/tokenizers.abi3.so"},  # 3
    {"name": "count", "file": "/x/infergate/observe/counters.py"},  # 4
    {"name": "_sum", "file": "/venv/numpy/core/_methods.py"},  # 5: numpy, no part of its own
    {"name": "epoll_pwait", "file": "/usr/lib/libc.so.6"},  # 6
    {"name": "PyThread_acquire_lock_timed", "file": "/lib/libpython3.11.so"},  # 7
    {"name": "0x7fed234a3f16", "file": "/usr/lib/libc.so.6"},  # 8: no symbol
    {"name": "_invoke", "file": "/venv/grpc/aio/_call.py"},  # 9
    {"name": "malloc", "file": "/usr/lib/libc.so.6"},  # 10
]


def document(samples: list[tuple[list[int], float]]) -> dict:
    return {
        "shared": {"frames": FRAMES},
        "profiles": [
            {
                "name": "AsyncIO Thread",
                "samples": [stack for stack, _ in samples],
                "weights": [weight for _, weight in samples],
            }
        ],
    }


def test_frames_fall_into_parts_by_file():
    assert part_of("/venv/tokenizers/tokenizers.abi3.so:encode") == "tokenization"
    assert part_of("/venv/grpc/aio/_call.py:_invoke") == "gRPC client and protobuf"
    assert part_of("/x/infergate/observe/drift.py:add") == "platform metrics, drift, counters"
    assert part_of("/venv/ray/serve/_private/replica.py:call") == "Ray Serve request path"
    assert part_of("/venv/numpy/core/_methods.py:_sum") is None


def test_each_busy_sample_goes_to_its_innermost_part_and_waits_are_left_out():
    result = shares(
        document(
            [
                ([0, 1, 2, 3], 0.04),  # in the tokenizer's Rust code
                ([0, 1, 4, 5], 0.02),  # numpy called by the counters: the counters'
                ([0, 1, 9, 10], 0.02),  # libc under gRPC's call: gRPC's
                ([0, 1], 0.01),
                ([0], 0.01),
                ([10], 0.01),  # no part names it
                ([0, 6], 0.5),  # the event loop waiting for sockets
                ([0, 7, 8], 0.3),  # a lock wait, its innermost libc frame without a symbol
            ]
        )
    )
    assert result["busy_s"] == pytest.approx(0.11) and result["idle_s"] == pytest.approx(0.8)
    assert result["shares"] == pytest.approx(
        {
            "tokenization": 0.04 / 0.11,
            "platform metrics, drift, counters": 0.02 / 0.11,
            "gRPC client and protobuf": 0.02 / 0.11,
            "platform request path (rest)": 0.01 / 0.11,
            "asyncio event loop": 0.01 / 0.11,
            OTHER: 0.01 / 0.11,
        },
        abs=1e-4,  # shares are rounded to four digits
    )
    assert next(iter(result["shares"])) == "tokenization"  # largest first


def test_a_profile_of_waiting_only_has_no_shares():
    assert shares(document([([0, 6], 1.0)])) == {"busy_s": 0.0, "idle_s": 1.0, "shares": {}}

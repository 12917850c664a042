"""Pieces of the front-end deployment that need no running Ray."""

import asyncio

from infergate.serve_app import FrontendDeployment


class Backend:
    timeout_s = 0.05

    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def test_a_replaced_triton_channel_is_closed_once_its_calls_can_be_over():
    replica = object.__new__(FrontendDeployment.func_or_class)
    replica._closing = set()
    replaced = Backend()

    async def scenario() -> tuple[bool, bool]:
        replica._close_later(replaced)
        await asyncio.sleep(0.01)
        early = replaced.closed  # a call still out may finish on it
        await asyncio.sleep(0.1)
        return early, replaced.closed

    assert asyncio.run(scenario()) == (False, True)
    assert replica._closing == set()

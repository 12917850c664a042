"""The replica's request coalescing, against a backend that answers when told to."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from infergate.errors import BackendUnavailable, InfergateError, Overloaded
from infergate.serving.batching import BatchingBackend


class HeldBackend:
    """Records every call and answers it only when the test releases it.

    Each row's output is ``[sum of its ids, number of unmasked tokens]``, so a test can
    tell which rows came back to which caller and that padding changed nothing."""

    def __init__(self, fail_when: int | None = None, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, np.ndarray, np.ndarray]] = []
        self.release = asyncio.Event()
        self.fail_when = fail_when  # a row whose first id is this fails the whole call
        self.error = error

    async def infer(
        self, model: str, input_ids: np.ndarray, attention_mask: np.ndarray, output_name: str
    ) -> np.ndarray:
        self.calls.append((model, input_ids, attention_mask))
        await self.release.wait()
        if self.error is not None:
            raise self.error
        if self.fail_when is not None and (input_ids[:, 0] == self.fail_when).any():
            raise InfergateError("the model failed on this batch")
        masked = input_ids * attention_mask
        return np.stack([masked.sum(axis=1), attention_mask.sum(axis=1)], axis=1).astype(np.float32)


def tokens(*rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    longest = max(len(row) for row in rows)
    ids = np.zeros((len(rows), longest), dtype=np.int64)
    mask = np.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return ids, mask


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def held(**backend_options) -> tuple[HeldBackend, BatchingBackend]:
    """A held backend behind a batcher with the platform's row cap, one call in flight."""
    backend = HeldBackend(**backend_options)
    return backend, BatchingBackend(backend, max_rows=64, max_in_flight=1)


def send(batching: BatchingBackend, *rows: list[int], model: str = "m") -> asyncio.Task:
    """One request of ``rows`` (token ids), in flight as a task."""
    return asyncio.create_task(batching.infer(model, *tokens(*rows), "logits"))


def test_a_lone_request_goes_out_at_once() -> None:
    async def scenario() -> None:
        backend, batching = held()
        call = send(batching, [5, 6])
        await settle()
        assert len(backend.calls) == 1  # sent before any other request arrived
        backend.release.set()
        np.testing.assert_array_equal(await call, [[11.0, 2.0]])

    asyncio.run(scenario())


def test_requests_arriving_during_a_call_leave_together_and_get_their_own_rows() -> None:
    async def scenario() -> None:
        backend, batching = held()
        first = send(batching, [1])
        await settle()
        waiting = [
            send(batching, [2, 2, 2]),
            send(batching, [3], [4, 4]),
            send(batching, [7, 7]),
        ]
        await settle()
        assert len(backend.calls) == 1  # the others wait for the call in flight
        backend.release.set()
        results = await asyncio.gather(first, *waiting)

        assert len(backend.calls) == 2
        _, ids, mask = backend.calls[1]
        assert ids.shape == (4, 3)  # 1 + 2 + 1 rows, padded to the longest (3 tokens)
        assert mask.sum() == 3 + 1 + 2 + 2
        np.testing.assert_array_equal(results[0], [[1.0, 1.0]])
        np.testing.assert_array_equal(results[1], [[6.0, 3.0]])
        np.testing.assert_array_equal(results[2], [[3.0, 1.0], [8.0, 2.0]])
        np.testing.assert_array_equal(results[3], [[14.0, 2.0]])

    asyncio.run(scenario())


def test_batches_stop_at_max_rows_and_calls_at_max_in_flight() -> None:
    async def scenario() -> None:
        backend = HeldBackend()
        batching = BatchingBackend(backend, max_rows=3, max_in_flight=2)
        calls = [send(batching, *[[n]] * 2) for n in range(1, 6)]
        await settle()
        # Two calls out at once, each alone (they arrived with nobody waiting).
        assert [c[1].shape[0] for c in backend.calls] == [2, 2]
        backend.release.set()
        results = await asyncio.gather(*calls)
        # Then 2 + 2 rows would exceed 3: every remaining request leaves alone.
        assert [c[1].shape[0] for c in backend.calls] == [2, 2, 2, 2, 2]
        for n, result in enumerate(results, start=1):
            np.testing.assert_array_equal(result, [[n, 1.0], [n, 1.0]])

    asyncio.run(scenario())


def test_beyond_max_in_flight_only_full_calls_go_out_up_to_the_calls_ahead() -> None:
    async def scenario() -> None:
        backend = HeldBackend()
        batching = BatchingBackend(backend, max_rows=2, max_in_flight=1, full_calls_ahead=1)
        calls = [send(batching, [1])]
        await settle()
        calls.append(send(batching, [2]))
        await settle()
        # One call out, one row waiting: not a full call, so it waits for a slot.
        assert [c[1][:, 0].tolist() for c in backend.calls] == [[1]]
        calls.append(send(batching, [3]))
        await settle()
        # Two rows waiting fill a call: it goes out ahead, to wait in the backend's queue.
        assert [c[1][:, 0].tolist() for c in backend.calls] == [[1], [2, 3]]
        calls += [send(batching, [4]), send(batching, [5])]
        await settle()
        assert len(backend.calls) == 2  # full, but the one call ahead is out already
        backend.release.set()
        results = await asyncio.gather(*calls)
        assert [c[1][:, 0].tolist() for c in backend.calls] == [[1], [2, 3], [4, 5]]
        for n, result in enumerate(results, start=1):
            np.testing.assert_array_equal(result, [[n, 1.0]])

    asyncio.run(scenario())


def test_a_request_above_max_rows_is_sent_in_slices() -> None:
    async def scenario() -> None:
        backend = HeldBackend()
        batching = BatchingBackend(backend, max_rows=3, max_in_flight=4)
        call = send(batching, *[[n] * (n % 3 + 1) for n in range(1, 8)])
        await settle()
        backend.release.set()
        result = await call
        assert [c[1].shape[0] for c in backend.calls] == [3, 3, 1]
        expected = [[n * (n % 3 + 1), n % 3 + 1] for n in range(1, 8)]
        np.testing.assert_array_equal(result, expected)

    asyncio.run(scenario())


def test_models_are_batched_apart() -> None:
    async def scenario() -> None:
        backend, batching = held()
        calls = [
            send(batching, [n], model=model)
            for n, model in enumerate(["a", "b", "a", "b"], start=1)
        ]
        await settle()
        backend.release.set()
        await asyncio.gather(*calls)
        assert sorted((model, ids.shape[0]) for model, ids, _ in backend.calls) == [
            ("a", 1),
            ("a", 1),
            ("b", 1),
            ("b", 1),
        ]

    asyncio.run(scenario())


def test_a_batch_the_model_rejects_is_retried_one_by_one() -> None:
    async def scenario() -> None:
        backend, batching = held(fail_when=9)
        first = send(batching, [1])
        await settle()
        good = send(batching, [2])
        bad = send(batching, [9])
        await settle()
        backend.release.set()
        np.testing.assert_array_equal(await first, [[1.0, 1.0]])
        np.testing.assert_array_equal(await good, [[2.0, 1.0]])
        with pytest.raises(InfergateError, match="failed on this batch"):
            await bad
        assert [c[1].shape[0] for c in backend.calls] == [1, 2, 1, 1]

    asyncio.run(scenario())


def test_an_unavailable_backend_fails_every_waiting_request_once() -> None:
    async def scenario() -> None:
        backend, batching = held(error=BackendUnavailable("Triton is gone"))
        calls = [send(batching, [n]) for n in range(4)]
        await settle()
        backend.release.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, BackendUnavailable) for r in results)
        assert len(backend.calls) == 2  # no retry one by one: nothing is request-specific

    asyncio.run(scenario())


def test_a_caller_that_gave_up_is_skipped() -> None:
    async def scenario() -> None:
        backend, batching = held()
        first = send(batching, [1])
        await settle()
        gone = send(batching, [2])
        kept = send(batching, [3])
        await settle()
        gone.cancel()
        await settle()
        backend.release.set()
        await first
        np.testing.assert_array_equal(await kept, [[3.0, 1.0]])
        assert [c[1][:, 0].tolist() for c in backend.calls] == [[1], [3]]

    asyncio.run(scenario())


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BatchingBackend(HeldBackend(), max_rows=0, max_in_flight=1)
    with pytest.raises(ValueError, match="at least 0"):
        BatchingBackend(HeldBackend(), max_rows=4, max_in_flight=1, full_calls_ahead=-1)


def test_a_batcher_is_idle_once_nothing_waits_and_no_call_is_out():
    async def scenario() -> list[bool]:
        release = asyncio.Event()

        class Slow:
            async def infer(self, model, input_ids, attention_mask, output_name):
                await release.wait()
                return np.zeros((input_ids.shape[0], 2), dtype=np.float32)

        batcher = BatchingBackend(Slow(), max_rows=8, max_in_flight=1)
        seen = [batcher.idle]
        ids = np.ones((1, 4), dtype=np.int64)
        calls = [asyncio.create_task(batcher.infer("m", ids, ids, "logits")) for _ in range(3)]
        await asyncio.sleep(0)
        seen.append(batcher.idle)  # one call out, two requests waiting
        release.set()
        await asyncio.gather(*calls)
        seen.append(batcher.idle)
        return seen

    assert asyncio.run(scenario()) == [True, False, True]


def test_past_the_queue_bound_a_request_is_shed_at_once_and_the_queue_drains():
    async def scenario() -> None:
        backend = HeldBackend()
        batching = BatchingBackend(backend, max_rows=64, max_in_flight=1, max_queued_rows=3)
        out = send(batching, [1])  # sent at once: it is not queued
        await settle()
        waiting = [send(batching, [2], [3]), send(batching, [4])]  # 3 rows wait: the bound
        await settle()
        with pytest.raises(Overloaded, match="3 texts already wait") as caught:
            await batching.infer("m", *tokens([5]), "out")
        assert caught.value.status == 429
        other = send(batching, [6], model="other")  # another model's lane has room
        backend.release.set()
        await asyncio.gather(out, *waiting, other)
        assert batching.idle
        await batching.infer("m", *tokens([7]), "out")  # drained: taken again

    asyncio.run(scenario())


class GeneratingBackend:
    """Answers like translation's Triton model: per row, each id repeated ``decoding[0]``
    times, padded with -1 to the call's longest; records the calls' extra inputs."""

    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray] | None] = []
        self.release = asyncio.Event()

    async def infer(self, model, input_ids, attention_mask, output_name, *, extra=None):
        self.calls.append(extra)
        await self.release.wait()
        settings = extra["decoding"]
        rows = [
            np.repeat(ids[mask == 1], int(decoding[0]))
            for ids, mask, decoding in zip(input_ids, attention_mask, settings, strict=True)
        ]
        out = np.full((len(rows), max(len(r) for r in rows)), -1, dtype=np.int64)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return out


def test_extra_inputs_are_stacked_with_their_rows_and_outputs_go_back_to_their_callers():
    async def scenario():
        backend = GeneratingBackend()
        batching = BatchingBackend(backend, max_rows=64, max_in_flight=1)

        def ask(rows, repeat):
            ids, mask = tokens(*rows)
            decoding = np.tile(np.array([repeat, 9], dtype=np.int64), (len(rows), 1))
            call = batching.infer("t", ids, mask, "translation_ids", extra={"decoding": decoding})
            return asyncio.ensure_future(call)

        first = ask([[5]], 1)  # goes out alone
        await settle()
        second, third = ask([[7, 8]], 2), ask([[3], [4, 4]], 1)  # wait, then one call
        await settle()
        backend.release.set()
        one, two, three = await asyncio.gather(first, second, third)
        assert len(backend.calls) == 2
        assert backend.calls[1]["decoding"].tolist() == [[2, 9], [1, 9], [1, 9]]
        assert one.tolist() == [[5]]
        assert two.tolist() == [[7, 7, 8, 8]]
        assert three.tolist() == [[3, -1, -1, -1], [4, 4, -1, -1]]  # the call's width

    asyncio.run(scenario())


def test_a_request_over_the_row_cap_is_sliced_with_its_extra_inputs():
    async def scenario():
        backend = GeneratingBackend()
        backend.release.set()
        batching = BatchingBackend(backend, max_rows=2, max_in_flight=4)
        ids, mask = tokens([1], [2, 2], [3, 3, 3])
        decoding = np.array([[1, 9], [1, 9], [2, 9]], dtype=np.int64)
        out = await batching.infer("t", ids, mask, "translation_ids", extra={"decoding": decoding})
        assert [call["decoding"].shape[0] for call in backend.calls] == [2, 1]
        assert out.tolist() == [
            [1, -1, -1, -1, -1, -1],
            [2, 2, -1, -1, -1, -1],
            [3, 3, 3, 3, 3, 3],
        ]

    asyncio.run(scenario())

"""The payload log's recording side: a draw per role, a bounded buffer, and writes that
happen in the log's own thread, never on the event loop."""

from __future__ import annotations

import asyncio
import threading
from itertools import cycle

from infergate.config import PayloadSampling, PayloadSettings
from infergate.observe.payloads import UNREDACTED, Payload, PayloadLog, open_payload_log

ON = PayloadSettings(enabled=True, flush_records=3, flush_interval_s=60)


def payload(role: str = "champion", version: str = "1") -> Payload:
    return Payload(1000.0, "m", version, role, ["a text"], [{"label": "x"}], 2.0, 200, "key-1")


class Batches:
    """A writer that keeps each batch and the thread that wrote it."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.batches: list[list[Payload]] = []
        self.threads: list[int] = []
        self.hold = hold
        self.wrote = threading.Event()

    def __call__(self, batch: list[Payload]) -> None:
        if self.hold is not None:
            assert self.hold.wait(10), "the test never released the writer"
        self.batches.append(batch)
        self.threads.append(threading.get_ident())
        self.wrote.set()


def test_each_role_is_kept_at_its_own_rate():
    sampling = PayloadSampling(champion=0.25, canary=0.5, shadow=1.0)
    draws = cycle([0.0, 0.3, 0.6, 0.9])  # a quarter of the draws under each quarter
    payloads = PayloadLog(
        PayloadSettings(enabled=True, sample=sampling), Batches(), draw=lambda: next(draws)
    )
    kept = {role: sum(payloads.wants(role) for _ in range(400)) for role in sampling.model_fields}
    assert kept == {"champion": 100, "canary": 200, "shadow": 400}
    # A call no version answered (its body unread, its model unknown): the champion's rate.
    assert sum(payloads.wants("") for _ in range(400)) == 100


def test_a_log_that_is_off_keeps_nothing_and_draws_nothing():
    def draw() -> float:
        raise AssertionError("no draw when the log is off")

    payloads = PayloadLog(PayloadSettings(enabled=False), Batches(), draw=draw)
    assert not payloads.wants("champion")
    assert not open_payload_log(PayloadSettings()).enabled


def test_a_flush_writes_what_is_held_as_one_batch():
    batches = Batches()
    payloads = PayloadLog(ON, batches)
    for version in "123":
        payloads.add(payload(version=version))
    assert payloads.flush() == 3 and payloads.flush() == 0  # nothing twice, nothing empty
    assert [[p.version for p in batch] for batch in batches.batches] == [["1", "2", "3"]]
    assert (payloads.written, payloads.held) == (3, 0)


def test_past_two_flushes_worth_a_record_is_dropped_and_counted():
    payloads = PayloadLog(ON, Batches())  # not started: nothing takes the buffer
    for _ in range(10):
        payloads.add(payload())
    assert (payloads.held, payloads.dropped) == (6, 4)
    assert payloads.outcomes == {"written": 0, "dropped": 4, "failed": 0}


def test_a_writer_that_fails_loses_its_batch_not_the_log():
    def broken(batch: list[Payload]) -> None:
        raise OSError("no space left on device")

    payloads = PayloadLog(ON, broken)
    payloads.add(payload())
    assert payloads.flush() == 0 and payloads.failed == 1
    payloads.add(payload())  # still taking records
    assert payloads.held == 1


def test_writes_happen_in_the_log_thread_and_the_event_loop_never_waits_for_them():
    release = threading.Event()
    batches = Batches(hold=release)
    payloads = PayloadLog(ON, batches)
    payloads.start()

    async def serve() -> int:
        for _ in range(5):  # the third fills a flush: the thread starts writing, and hangs
            payloads.add(payload())
            await asyncio.sleep(0)
        return threading.get_ident()

    try:
        # The loop went on adding while the writer hung: it never waited for the write.
        loop_thread = asyncio.run(asyncio.wait_for(serve(), 5))
        assert not batches.batches
    finally:
        release.set()
    assert batches.wrote.wait(5)
    payloads.close(timeout_s=5)  # the rest is written as the thread ends
    assert sum(len(batch) for batch in batches.batches) == 5
    assert set(batches.threads) and loop_thread not in batches.threads


def test_the_thread_flushes_on_its_interval_without_a_full_buffer():
    batches = Batches()
    payloads = PayloadLog(ON.model_copy(update={"flush_interval_s": 0.01}), batches)
    payloads.start()
    payloads.add(payload())
    assert batches.wrote.wait(5)
    payloads.close(timeout_s=5)
    assert [len(batch) for batch in batches.batches] == [1]


def test_a_closed_log_takes_nothing_more():
    payloads = PayloadLog(ON, Batches())
    payloads.close()
    payloads.add(payload())
    assert payloads.held == 0


REDACT = PayloadSettings(enabled=True, flush_records=10, texts="redact", redact_model="ner")


def test_texts_are_redacted_in_one_call_before_they_are_written():
    calls: list[list[str]] = []

    def redact(texts: list[str]) -> list[str]:
        calls.append(texts)
        return [text.replace("Alice", "[PER]") for text in texts]

    batches = Batches()
    payloads = PayloadLog(REDACT, batches, redact=redact)
    payloads.add(Payload(1.0, "m", "1", "champion", ["Alice here", "hi"], None, 1.0, 200, ""))
    payloads.add(Payload(1.0, "m", "", "", None, None, 1.0, 400, ""))  # body never read
    payloads.add(Payload(1.0, "m", "1", "champion", ["Alice again"], None, 1.0, 200, ""))
    assert payloads.flush() == 3
    assert calls == [["Alice here", "hi", "Alice again"]]
    written = [p.texts for p in batches.batches[0]]
    assert written == [["[PER] here", "hi"], None, ["[PER] again"]]


def test_texts_that_cannot_be_redacted_are_never_written_as_they_are():
    def away(texts: list[str]) -> list[str]:
        raise ConnectionError("Triton is away")

    for redact in (away, None):  # failing, or no model wired to the log
        batches = Batches()
        payloads = PayloadLog(REDACT, batches, redact=redact)
        payloads.add(Payload(1.0, "m", "1", "champion", ["Alice", "Bob"], None, 1.0, 200, ""))
        assert payloads.flush() == 1
        assert batches.batches[0][0].texts == [UNREDACTED, UNREDACTED]

"""A backlog of requests waiting to be added up (infergate.observe.backlog)."""

from __future__ import annotations

from infergate.observe.backlog import MAX_REQUESTS, MAX_TEXTS, Backlog


def test_entries_wait_until_taken_in_and_arrive_in_order():
    taken: list[list[int]] = []
    backlog: Backlog[int] = Backlog(taken.append)
    for i in range(5):
        backlog.add(i, texts=1)
    assert taken == [] and len(backlog) == 5
    backlog.take_in()
    backlog.take_in()  # nothing waits: no empty call
    assert taken == [[0, 1, 2, 3, 4]] and len(backlog) == 0


def test_a_full_backlog_takes_itself_in_by_requests_or_by_texts():
    taken: list[list[int]] = []
    backlog: Backlog[int] = Backlog(taken.append)
    for i in range(MAX_REQUESTS + 1):
        backlog.add(i, texts=0)
    assert [len(t) for t in taken] == [MAX_REQUESTS] and len(backlog) == 1
    backlog.add(-1, texts=MAX_TEXTS - 1)  # the texts count from the last take-in
    assert len(taken) == 1
    backlog.add(-2, texts=1)
    assert [len(t) for t in taken] == [MAX_REQUESTS, 3] and len(backlog) == 0

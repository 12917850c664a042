"""Logging in a front-end replica: records reach the replica's file at once, and a failure
repeated per request is logged once per window."""

import logging
import logging.handlers

from fakes import FakeClock
from infergate.serving import replica_logs
from infergate.serving.replica_logs import REPEATING_LOGGERS, RepeatLimit


def test_infergate_records_reach_the_replica_log_file_unbuffered(tmp_path):
    serve_logger, ours = logging.getLogger("ray.serve"), logging.getLogger("infergate")
    saved = (serve_logger.handlers[:], ours.handlers[:], ours.level, ours.propagate)
    path = tmp_path / "replica.log"
    file_handler = logging.FileHandler(path)
    # What Ray Serve sets up in a replica: a buffer in front of the file.
    serve_logger.handlers = [logging.handlers.MemoryHandler(1000, target=file_handler)]
    try:
        replica_logs.log_to_replica_file()
        replica_logs.log_to_replica_file()  # a second replica in the same process adds nothing
        logging.getLogger("infergate.serving.replica").info("table 3: ['a v1']")
        assert path.read_text() == "table 3: ['a v1']\n"
        for name in REPEATING_LOGGERS:
            filters = logging.getLogger(name).filters
            assert [type(f) for f in filters] == [RepeatLimit], name
    finally:
        file_handler.close()
        serve_logger.handlers, ours.handlers = saved[0], saved[1]
        for name in REPEATING_LOGGERS:
            logger = logging.getLogger(name)
            logger.filters = [f for f in logger.filters if not isinstance(f, RepeatLimit)]
        ours.setLevel(saved[2])
        ours.propagate = saved[3]


def test_a_failure_repeated_per_request_is_logged_once_per_window_with_a_count(caplog):
    clock = FakeClock(100.0)
    limit = RepeatLimit(10.0, clock=clock)
    logger = logging.getLogger("test.repeat_limit")
    logger.addFilter(limit)
    warn = "Triton inference on %s (%d rows) failed: %s"
    for rows in (3, 7, 1):  # one kind: only the number differs
        logger.warning(warn, "a__v1", rows, "UNAVAILABLE")
    logger.warning(warn, "b__v1", 2, "UNAVAILABLE")  # another model: another kind
    logger.error(warn, "a__v1", 2, "UNAVAILABLE")  # another level: another kind
    clock.now = 109.0
    logger.warning(warn, "a__v1", 5, "UNAVAILABLE")
    clock.now = 112.0
    logger.warning(warn, "a__v1", 4, "UNAVAILABLE")
    logger.warning(warn, "a__v1", 4, "UNAVAILABLE")
    clock.now = 200.0
    logger.warning(warn, "a__v1", 6, "UNAVAILABLE")
    logger.removeFilter(limit)
    assert caplog.messages == [
        "Triton inference on a__v1 (3 rows) failed: UNAVAILABLE",
        "Triton inference on b__v1 (2 rows) failed: UNAVAILABLE",
        "Triton inference on a__v1 (2 rows) failed: UNAVAILABLE",
        "Triton inference on a__v1 (4 rows) failed: UNAVAILABLE (3 more like it were not "
        "logged in the 12 s since the last one shown)",
        "Triton inference on a__v1 (6 rows) failed: UNAVAILABLE (1 more like it were not "
        "logged in the 88 s since the last one shown)",
    ]


def test_the_table_of_kinds_stays_bounded():
    clock = FakeClock(0.0)
    limit = RepeatLimit(10.0, clock=clock)
    records = [
        logging.LogRecord("x", logging.WARNING, __file__, 1, f"failure {kind}", (), None)
        for kind in ("a", "b", "c", "d")
    ]
    limit.MAX_KINDS = 3
    assert all(limit.filter(record) for record in records)  # the fourth clears the table
    assert len(limit._kinds) == 1
    clock.now = 20.0
    assert all(limit.filter(record) for record in records[:3])  # the old ones are pruned
    assert len(limit._kinds) == 3

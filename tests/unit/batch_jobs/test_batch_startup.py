"""A job's fixed costs told apart from its work: Ray's start, the slowest actor's load,
the time to the first part, and the rate from the first part's start to the last end."""

from __future__ import annotations

import pytest

from infergate.batch.job import StartUp


def test_start_up_is_the_time_to_the_first_part_and_work_the_parts_span():
    startup = StartUp(began=100.0, ray_start_s=6.0)
    # Two actors, loaded in parallel; parts arrive in the order they finish.
    startup.part("node/11", 9.0, began=118.0, ended=128.0)
    startup.part("node/12", 12.5, began=118.5, ended=129.0)
    startup.part("node/11", 9.0, began=128.0, ended=138.0)
    figures = startup.figures(rows=3000)
    assert figures["ray_start_s"] == 6.0
    assert figures["load_s"] == 12.5  # the slowest actor's
    assert figures["startup_s"] == pytest.approx(18.0)
    assert figures["work_s"] == pytest.approx(20.0)
    assert figures["work_rows_per_s"] == pytest.approx(150.0)


def test_a_job_with_no_part_run_has_no_work_figures():
    figures = StartUp(began=100.0, ray_start_s=5.0).figures(rows=0)
    assert figures == {"ray_start_s": 5.0, "load_s": 0.0, "startup_s": 0.0, "work_s": 0.0,
                       "work_rows_per_s": 0.0}  # fmt: skip

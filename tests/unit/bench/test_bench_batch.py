"""The batch cell's pure parts: its input file, its ratios, the report's table, the
command line's choice of it and how it runs after another part on the same stack."""

from __future__ import annotations

import argparse

import pyarrow.parquet as pq
import pytest

from infergate.bench.batch_cell import ratio, write_input
from infergate.bench.cli import add_commands, bench_options
from infergate.bench.report import markdown
from infergate.bench.runner import in_turn


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def batch_record() -> dict:
    return {
        "stack": "lean", "model": "sentiment", "version": "1", "rows": 512, "job_rows": 2048,
        "tokens": 16,
        "batch_size": 32, "load_average_at_start": [3.0, 2.0, 1.0],
        "load_average_at_end": [4.5, 2.0, 1.0], "cell_s": 31.6,
        "ceiling": {"rows": 512, "batch": 32, "sequences_per_s": 400.0, "rows_alone": True,
                    "layout": "2 sessions x 1 thread",
                    "cpu_ms_per_sequence": 2.2, "least_cpu_ms_per_sequence": 2.0,
                    "padded": {"sequences_per_s": 500.0, "layout": "2 sessions x 1 thread",
                               "cpu_ms_per_sequence": 1.6}},
        "online": {"rows": 512, "answered": 512, "requests": 16, "errors": 0,
                   "texts_per_request": 32, "in_flight": 4, "rows_per_s": 250.0},
        "job": {"rows": 2048, "errors": 0, "duration_s": 51.2, "rows_per_s": 40.0,
                "busy_rows_per_s": 360.0, "actors": 2, "output_rows": 2048,
                "startup_s": 20.0, "ray_start_s": 6.0, "load_s": 11.0, "work_s": 6.4,
                "work_rows_per_s": 320.0, "busy_cpu_ms_per_row": 2.5,
                "busy_waited_share": 0.25},
        "ratios": {"cpu_over_ceiling": 0.8, "job_over_ceiling": 0.1, "work_over_ceiling": 0.8,
                   "busy_over_ceiling": 0.9,
                   "busy_over_padded": 0.72, "padded_over_ceiling": 1.25,
                   "job_over_online": 0.16, "work_over_online": 1.28,
                   "busy_over_online": 1.44, "online_over_ceiling": 0.625},
    }  # fmt: skip


def test_the_input_file_holds_every_text_in_parts(tmp_path):
    texts = [f"text {i}" for i in range(10)]
    write_input(texts, tmp_path / "in.parquet", 10)
    file = pq.ParquetFile(tmp_path / "in.parquet")
    assert file.metadata.num_row_groups == 4  # at least 4 parts: 3 + 3 + 3 + 1 rows
    table = file.read()
    assert table.column("text").to_pylist() == texts
    assert table.column("id").to_pylist() == list(range(10))


def test_the_jobs_file_repeats_the_texts_in_parts_of_part_rows(tmp_path):
    texts = ["a", "b", "c"]
    write_input(texts, tmp_path / "job.parquet", 100, part_rows=16)
    file = pq.ParquetFile(tmp_path / "job.parquet")
    assert [file.metadata.row_group(i).num_rows for i in range(7)] == [16] * 6 + [4]
    table = file.read()
    assert table.column("text").to_pylist() == [texts[i % 3] for i in range(100)]
    assert table.column("id").to_pylist() == list(range(100))


def test_a_ratio_needs_both_figures():
    assert ratio(40.0, 400.0) == pytest.approx(0.1)
    assert ratio(None, 400.0) is None and ratio(40.0, None) is None and ratio(40.0, 0.0) is None


def test_the_report_puts_the_job_beside_the_online_path_and_the_ceiling():
    text = markdown({"batch": batch_record()})
    assert "## Batch" in text
    assert (
        "| `infergate batch`, end to end | 40.0 | 0.10 | 0.16 | 51.2 s for 2048 rows; "
        "start-up 20.0 s: Ray's start 6.0 s, then the actors' launch and load 14.0 s (the "
        "version's files and session 11.0 s of it); 2 actors" in text
    )
    assert "| `infergate batch`, after start-up | 320.0 | 0.80 | 1.28 | first part's start" in text
    assert "| `infergate batch`, busy (parts only) | 360.0 | 0.90 | 1.44 |" in text
    assert "| online path | 250.0 | 0.62 | 1.00 | 32 texts a request, 4 in flight" in text
    assert (
        "| ceiling (ONNX Runtime in process, as served) | 400.0 | 1.00 |  | 2 sessions x "
        "1 thread, texts tokenized beforehand, each text alone (rows_alone graph) |" in text
    )
    assert "| the same graph in padded batches | 500.0 | 1.25 |" in text
    assert "(the job: 2048 rows of them in one Parquet file)" in text
    assert (
        "CPU per row: the job's actors 2.50 ms on parts, the ceiling 2.00 ms as served (its "
        "layout with the least) (1.60 ms in padded batches): the actors do 0.80 of the "
        "ceiling's rows per CPU second, a ratio that other load on the machine moves less "
        "than rows/s. They waited for a CPU 25 % of their time on parts." in text
    )
    assert "Load average at start/end: 3.0 / 4.5. The cell took 32 s." in text


def test_a_failed_part_is_shown_and_the_others_stand():
    record = batch_record()
    record["job"] = {"error": "RuntimeError: infergate batch exited 1"}
    record["ratios"] = {**record["ratios"], "job_over_ceiling": None, "job_over_online": None}
    text = markdown({"batch": record})
    assert "| `infergate batch`, end to end | - | - | - | RuntimeError: infergate batch" in text
    assert "| online path | 250.0 |" in text
    assert "Failed: the lean scenario's stack did not start" in markdown(
        {"batch": {"error": "the lean scenario's stack did not start"}}
    )
    assert "## Batch" not in markdown({})


def test_batch_is_a_scenario_name_on_the_command_line():
    options = bench_options(parse("--smoke", "--scenarios", "lean", "batch"))
    assert options.scenarios == ("lean", "batch")
    with pytest.raises(SystemExit):
        parse("--scenarios", "batches")


def test_the_second_part_on_a_stack_runs_whatever_the_first_met():
    ran: list[str] = []

    def fails(name: str) -> None:
        ran.append(f"first on {name}")
        raise RuntimeError("the task cells failed")

    with pytest.raises(RuntimeError):
        in_turn(fails, lambda name: ran.append(f"then on {name}"))("lean")
    assert ran == ["first on lean", "then on lean"]
    ran.clear()
    in_turn(lambda name: ran.append(name), None)("lean")
    assert ran == ["lean"]

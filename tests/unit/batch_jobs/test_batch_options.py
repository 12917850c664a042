"""`infergate batch`'s arguments: each mistake refused in one line before any work."""

from __future__ import annotations

import argparse

import pytest

from infergate.batch import cli
from infergate.batch.job import actors_for
from infergate.batch.options import (
    JobOptions,
    check_columns,
    check_task_options,
    format_of,
)
from infergate.errors import BatchError
from infergate.tasks import get


def parse(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.add_command(sub, [], lambda a: 0)
    return parser.parse_args(["batch", *args])


def test_arguments_make_a_job_with_the_champion_by_default():
    options = cli.options_of(parse("embed", "in.parquet", "out", "--parameters",
                                   '{"normalize": false}', "--batch-size", "8"))  # fmt: skip
    assert options.alias == "champion" and options.version is None
    assert options.parameters == {"normalize": False} and options.batch_size == 8


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "--batch-size is 0; use 1 to 1024"),
    (["--parameters", "{oops"], "--parameters is not JSON"),
    (["--parameters", "[1]"], "'parameters' must be an object, got a list"),
    (["--parameters", '{"temperature": 1}'], "unknown parameter 'temperature'"),
    (["--parameters", '{"normalize": "no"}'], "parameter 'normalize' must be bool"),
    (["--part-rows", "0"], "--part-rows and --part-bytes must be at least 1"),
    (["--concurrency", "0"], "--concurrency is 0"),
])  # fmt: skip
def test_bad_arguments_are_refused_in_one_line(args, message):
    with pytest.raises(BatchError) as caught:
        cli.options_of(parse("embed", "in.parquet", "out", *args))
    assert message in caught.value.message and "\n" not in caught.value.message


def test_version_and_alias_exclude_each_other():
    with pytest.raises(SystemExit):
        parse("embed", "in.csv", "out", "--version", "2", "--alias", "canary")


@pytest.mark.parametrize("path, fmt", [
    ("s3://bucket/data.parquet", "parquet"), ("in.JSONL", "jsonl"), ("x.ndjson", "jsonl"),
    ("rows.csv", "csv"), ("folder.parquet/", "parquet"),
])  # fmt: skip
def test_format_from_the_name(path, fmt):
    assert format_of(path) == fmt


def test_format_unknown_or_unnamed():
    with pytest.raises(BatchError, match=r"cannot tell the format of 'data\.txt'"):
        format_of("data.txt")
    with pytest.raises(BatchError, match="format 'xml' is not supported"):
        format_of("data.txt", "xml")
    assert format_of("data.txt", "csv") == "csv"


def test_missing_columns_are_named_with_the_ones_there():
    check_columns(["id", "text"], "text", None, "in.csv")
    with pytest.raises(BatchError) as caught:
        check_columns(["id", "body"], "text", None, "in.csv")
    assert (
        caught.value.message
        == "in.csv has no column 'text' (--column); its columns are ['id', 'body']"
    )
    with pytest.raises(BatchError, match="no column 'q' \\(--query-column\\)"):
        check_columns(["text"], "text", "q", "in.csv")


def job(**kw) -> JobOptions:
    return JobOptions(model="m", input="in.csv", output="out", **kw)


def test_a_query_column_suits_rerankers_only():
    check_task_options(get("text-ranking"), job(query_column="q"))
    check_task_options(get("text-ranking"), job(parameters={"query": "what"}))
    with pytest.raises(BatchError, match="--query-column applies to models that score"):
        check_task_options(get("text-classification"), job(query_column="q"))
    with pytest.raises(BatchError, match="give one"):
        check_task_options(get("text-ranking"), job(query_column="q", parameters={"query": "x"}))
    with pytest.raises(BatchError, match="or --query-column for one query per row"):
        check_task_options(get("text-ranking"), job())


def test_parameters_of_another_task_are_refused():
    with pytest.raises(BatchError, match="parameter 'top_k' applies to sparse-embedding"):
        check_task_options(get("feature-extraction"), job(parameters={"top_k": 3}))


@pytest.mark.parametrize("free, parts, wanted, expected", [
    ([{"CPU": 2.0}], 10, None, (2, 1.0, False)),
    ([{"CPU": 8.0}], 2, None, (2, 4.0, False)),
    ([{"CPU": 8.0, "GPU": 2.0}], 10, None, (2, 4.0, True)),
    ([{"CPU": 4.0}], 10, 1, (1, 4.0, False)),
    ([{"CPU": 0.5}], 3, None, (1, 0.5, False)),  # a serving cluster's replicas keep theirs
    # Each actor on one node: two nodes with 0.4 free take two of 0.4, not one of 0.8.
    ([{"CPU": 0.4}, {"CPU": 0.4}], 5, None, (2, 0.4, False)),
    ([{"CPU": 1.4}, {"CPU": 0.4}], 5, None, (1, 1.0, False)),
    ([{"CPU": 3.0}, {"CPU": 1.0}], 2, None, (2, 1.0, False)),  # 2 CPUs each would not fit
    ([{"CPU": 4.0}, {"CPU": 4.0}], 2, None, (2, 4.0, False)),
    ([{"CPU": 2.0}], 10, 6, (2, 1.0, False)),  # never more than fit
    ([{"CPU": 4.0, "GPU": 1.0}, {"GPU": 1.0}], 10, None, (2, 2.0, True)),
])  # fmt: skip
def test_actors_are_sized_from_each_nodes_free_resources(free, parts, wanted, expected):
    assert actors_for(free, parts, wanted) == expected


def test_no_free_cpu_is_a_clear_error():
    with pytest.raises(BatchError, match="no free CPU or GPU"):
        actors_for([{"CPU": 0.0}, {}], 3, None)

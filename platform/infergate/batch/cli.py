"""``infergate batch MODEL INPUT OUTPUT``: a registered version over a data set."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from infergate.batch.options import (
    ALIASES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_PART_BYTES,
    DEFAULT_PART_ROWS,
    FORMATS,
    JobOptions,
    check_alias,
    check_batch_size,
    parse_parameters,
)
from infergate.errors import BatchError
from infergate.versions import CHAMPION


def options_of(args: argparse.Namespace) -> JobOptions:
    """The job the arguments describe, each checked (BatchError, one line)."""
    if args.version is not None and args.alias is not None:
        raise BatchError("give --version or --alias, not both")
    if args.part_rows < 1 or args.part_bytes < 1:
        raise BatchError("--part-rows and --part-bytes must be at least 1")
    if args.concurrency is not None and args.concurrency < 1:
        raise BatchError(f"--concurrency is {args.concurrency}; use 1 or more actors")
    return JobOptions(
        model=args.model,
        input=args.input,
        output=args.output,
        column=args.column,
        version=args.version,
        alias=check_alias(args.alias or CHAMPION),
        query_column=args.query_column,
        parameters=parse_parameters(args.parameters),
        batch_size=check_batch_size(args.batch_size),
        input_format=args.input_format or "",
        output_format=args.output_format or "",
        part_rows=args.part_rows,
        part_bytes=args.part_bytes,
        concurrency=args.concurrency,
    )


def cmd_batch(
    args: argparse.Namespace,
    registry_of: Callable[[argparse.Namespace], Any],
    limits_of: Callable[[argparse.Namespace], Any],
) -> int:
    from infergate.batch.job import run

    options = options_of(args)
    figures = run(options, registry_of(args), limits_of(args), quiet=args.quiet)
    print(json.dumps(figures), file=sys.stdout, flush=True)
    return 0


def add_command(
    sub: argparse._SubParsersAction,
    parents: list[argparse.ArgumentParser],
    func: Callable[[argparse.Namespace], int],
) -> None:
    batch = sub.add_parser(
        "batch",
        parents=parents,
        help="run a registered version over a data set (Parquet, JSON Lines, CSV) on Ray Data",
        description="Answer every row of INPUT with a registered version, as predict would, "
        "and write OUTPUT as one file per part of the input with rows. A rerun skips the parts "
        "already written. With RAY_ADDRESS set it runs on that Ray cluster.",
    )
    batch.add_argument("model", help="registered model name")
    batch.add_argument("input", help="a file or a folder of files; a path or a URL (s3://...)")
    batch.add_argument("output", help="folder for the output parts; a path or a URL")
    which = batch.add_mutually_exclusive_group()
    which.add_argument("--version", help="this version")
    which.add_argument(
        "--alias", choices=ALIASES, help="the version under this alias (default champion)"
    )
    batch.add_argument("--column", default="text", help="the text column (default text)")
    batch.add_argument("--query-column", help="a reranker's query, one per row")
    batch.add_argument(
        "--parameters", help="predict's parameters as JSON, e.g. '{\"normalize\": false}'"
    )
    batch.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"texts per model call (default {DEFAULT_BATCH_SIZE})",
    )
    batch.add_argument("--input-format", choices=list(FORMATS), help="default: from INPUT's name")
    batch.add_argument("--output-format", choices=list(FORMATS), help="default: INPUT's format")
    batch.add_argument(
        "--part-rows",
        type=int,
        default=DEFAULT_PART_ROWS,
        help="Parquet: row groups are gathered into parts of this many rows",
    )
    batch.add_argument(
        "--part-bytes",
        type=int,
        default=DEFAULT_PART_BYTES,
        help="JSON Lines and CSV: files are split into parts of about this many bytes",
    )
    batch.add_argument(
        "--concurrency",
        type=int,
        help="actors (default: one per CPU, or per GPU, of the cluster)",
    )
    batch.set_defaults(func=func)

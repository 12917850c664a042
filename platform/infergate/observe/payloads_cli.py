"""``infergate payloads ...``: the payload log the front-end replicas write
(``frontend.payloads`` settings): list its files, read its records as JSON lines, export
them as one file, recompute a canary's shadow agreement from them."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from infergate.config import load_config
from infergate.errors import CommandFailed, InvalidConfig
from infergate.observe.payload_reader import Filters, PayloadFolder, json_line, shadow_agreement
from infergate.observe.payloads import ROLES, SHADOW

AGO = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: Callable[[], float] = time.time) -> float:
    """Seconds since the epoch from ``30m``, ``2h``, ``1d`` (ago) or an ISO 8601 time
    (UTC unless it says otherwise)."""
    ago = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if ago:
        return now() - float(ago[1]) * AGO[ago[2]]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidConfig(
            f"--since {text!r} is neither a time ago (30s, 15m, 2h, 1d) nor an ISO 8601 time "
            "(2026-01-31T12:00:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _folder(args: argparse.Namespace) -> PayloadFolder:
    if args.url:
        return PayloadFolder(args.url)
    overrides = {"state_dir": args.state_dir} if args.state_dir else {}
    return PayloadFolder(load_config(args.config, overrides=overrides).payload_url)


def _filters(args: argparse.Namespace) -> Filters:
    since = parse_since(args.since) if args.since else None
    return Filters(args.model, args.version, args.role, since)


def cmd_list(args: argparse.Namespace) -> int:
    folder = _folder(args)
    summaries = folder.summaries()
    if not summaries:
        print(f"no payload files in {folder.url}", file=sys.stderr)
        return 0
    rows: list[tuple[str, ...]] = [("file", "records", "size", "first", "last")]
    for s in summaries:
        span = [t.strftime("%Y-%m-%d %H:%M:%S") if t else "-" for t in (s.first, s.last)]
        rows.append((s.name, str(s.records), _size(s.size), *span))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    records = sum(s.records for s in summaries)
    total = _size(sum(s.size for s in summaries))
    print(f"{len(summaries)} files, {records} records, {total} in {folder.url}")
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    for count, record in enumerate(_folder(args).records(_filters(args))):
        if args.limit is not None and count >= args.limit:
            break
        print(json_line(record))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    out = Path(args.out)
    jsonl = (
        args.format or ("jsonl" if out.suffix in (".jsonl", ".json") else "parquet")
    ) == "jsonl"
    count = _folder(args).export(out, _filters(args), jsonl=jsonl)
    print(f"{count} records written to {out}", file=sys.stderr)
    return 0


def cmd_agreement(args: argparse.Namespace) -> int:
    filters = Filters(args.model, args.version, SHADOW, _filters(args).since_s)
    agreement = shadow_agreement(_folder(args).records(filters))
    if agreement.share is None:
        raise CommandFailed(
            f"no shadow record of {args.model} v{args.version} with a text judged in the "
            "payload log (is frontend.payloads.enabled on, and sample.shadow above 0?)"
        )
    print(
        f"{args.model} v{args.version} in shadow: {agreement.share:.3f} of {agreement.texts} "
        f"texts agreed ({agreement.records} records)"
    )
    return 0


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    scaled = size / 1024
    for unit in ("KB", "MB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} GB"


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    where = argparse.ArgumentParser(add_help=False, parents=[common])
    where.add_argument(
        "--url", help="the log's folder or URL (default: frontend.payloads.url of the config)"
    )
    which = argparse.ArgumentParser(add_help=False)
    which.add_argument("--model", help="only this model's records")
    which.add_argument("--version", help="only this version's")
    which.add_argument("--role", choices=ROLES, help="only this role's")
    which.add_argument("--since", help="only records since: 30m, 2h, 1d ago, or an ISO time")

    payloads = sub.add_parser(
        "payloads", help="the payload log: sampled requests and answers per version and role"
    )
    commands = payloads.add_subparsers(dest="payloads_command", required=True)
    listing = commands.add_parser(
        "list", parents=[where], help="the log's files: records, size, time span"
    )
    listing.set_defaults(func=cmd_list)
    read = commands.add_parser(
        "read", parents=[where, which], help="records as JSON lines, oldest first"
    )
    read.add_argument("--limit", type=int, help="at most this many records")
    read.set_defaults(func=cmd_read)
    export = commands.add_parser(
        "export", parents=[where, which], help="records into one Parquet or JSON Lines file"
    )
    export.add_argument("out", help="the file to write (.parquet, or .jsonl for JSON Lines)")
    export.add_argument("--format", choices=("parquet", "jsonl"), help="default: by OUT's suffix")
    export.set_defaults(func=cmd_export)
    agreement = commands.add_parser(
        "agreement", parents=[where], help="a canary's shadow agreement, from its shadow records"
    )
    agreement.add_argument("--model", required=True)
    agreement.add_argument("--version", required=True, help="the canary's version")
    agreement.add_argument("--since", help="only records since: 30m, 2h, 1d ago, or an ISO time")
    agreement.set_defaults(func=cmd_agreement, role=None)

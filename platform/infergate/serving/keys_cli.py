"""``infergate keys ...``: API keys for the inference endpoints, kept as digests in the file
``frontend.api_keys_file`` names (or ``--file``). Replicas read the file again when it
changes: a key created or revoked takes effect within seconds, without a restart."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infergate.config import load_config
from infergate.errors import CommandFailed, InvalidConfig
from infergate.serving.access import ALL_MODELS, KeyEntry, digest, new_key, read_keys, write_keys


def _path(args: argparse.Namespace) -> Path:
    if args.file is not None:
        return Path(args.file)
    path = load_config(args.config).frontend.api_keys_file
    if path is None:
        raise InvalidConfig(
            "no API key file: pass --file, or set frontend.api_keys_file in the config "
            "(INFERGATE_FRONTEND__API_KEYS_FILE)"
        )
    return path


def cmd_create(args: argparse.Namespace) -> int:
    path = _path(args)
    keys = read_keys(path)
    if any(entry.id == args.id for entry in keys.keys):
        raise CommandFailed(f"a key with id {args.id!r} exists in {path}; revoke it first")
    key = new_key()
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    entry = KeyEntry(
        id=args.id,
        sha256=digest(key),
        models=models,
        requests_per_s=args.requests_per_s,
        texts_per_s=args.texts_per_s,
    )
    keys.keys.append(entry)
    write_keys(path, keys)
    print(key)  # the only time the key is shown: the file keeps its digest
    print(f"key {args.id!r} added to {path}; store the key now, it is not kept", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    keys = read_keys(_path(args)).keys
    rows = [("id", "models", "requests/s", "texts/s")]
    for entry in keys:
        rows.append(
            (
                entry.id,
                ",".join(entry.models),
                _limit(entry.requests_per_s),
                _limit(entry.texts_per_s),
            )
        )
    width = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, width, strict=True)).rstrip())
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    path = _path(args)
    keys = read_keys(path)
    kept = [entry for entry in keys.keys if entry.id != args.id]
    if len(kept) == len(keys.keys):
        raise CommandFailed(f"no key with id {args.id!r} in {path}")
    keys.keys = kept
    write_keys(path, keys)
    print(f"key {args.id!r} revoked", file=sys.stderr)
    return 0


def _limit(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    keys = sub.add_parser("keys", help="API keys for the inference endpoints")
    commands = keys.add_subparsers(dest="keys_command", required=True)
    shared = argparse.ArgumentParser(add_help=False, parents=[common])
    shared.add_argument("--file", type=Path, help="key file (default: frontend.api_keys_file)")

    create = commands.add_parser(
        "create", parents=[shared], help="add a key; prints it once, stores its digest"
    )
    create.add_argument("id", help="a name for the key, shown on metrics and logs")
    create.add_argument(
        "--models",
        default=ALL_MODELS,
        help=f"comma-separated models the key may call (default {ALL_MODELS!r}: all)",
    )
    create.add_argument("--requests-per-s", type=float, help="rate limit (default: none)")
    create.add_argument("--texts-per-s", type=float, help="rate limit on texts (default: none)")
    create.set_defaults(func=cmd_create)

    listing = commands.add_parser("list", parents=[shared], help="the keys and their limits")
    listing.set_defaults(func=cmd_list)

    revoke = commands.add_parser("revoke", parents=[shared], help="remove a key")
    revoke.add_argument("id")
    revoke.set_defaults(func=cmd_revoke)

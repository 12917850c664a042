"""The ``infergate dashboards`` commands: ``generate [--check]``, ``push``, ``snapshot``.

Wire into the main parser with ``add_commands(subparsers)``; ``python -m
infergate.dashboards`` runs the same commands on their own.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from infergate.dashboards.generate import DASHBOARDS_DIR
from infergate.errors import DashboardError, exit_code

TOKEN_ENV = "GRAFANA_TOKEN"


def _default_prometheus_url() -> str:
    """The local stack's Prometheus (deployments/local.yaml and its env overrides)."""
    from infergate.config import load_config

    return f"http://127.0.0.1:{load_config().prometheus.port}"


def cmd_generate(args: argparse.Namespace) -> int:
    from infergate.dashboards.generate import check, generate

    if args.check:
        problems = check(args.out)
        if problems:
            raise DashboardError(
                "the dashboards are not current:\n  "
                + "\n  ".join(problems)
                + "\nregenerate them with `python -m infergate.dashboards generate`"
            )
        print(f"the dashboards in {args.out} are current")
        return 0
    for path in generate(args.out):
        print(path)
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from infergate.dashboards.push import push

    token = args.token or os.environ.get(TOKEN_ENV, "")
    if not token:
        raise DashboardError(f"no Grafana token: pass --token or set {TOKEN_ENV}")
    result = push(
        args.grafana_url,
        token,
        args.prometheus_url or _default_prometheus_url(),
        args.dashboards_dir,
    )
    print(f"data source: {result.datasource}; folder infergate: {result.folder}")
    for dashboard in result.dashboards:
        print(f"  {dashboard.title}  version {dashboard.version}  {dashboard.url}")
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    from infergate.dashboards.snapshot import snapshot

    paths = snapshot(
        args.prometheus_url or _default_prometheus_url(), args.out, minutes=args.minutes
    )
    for path in paths:
        print(path)
    return 0


def add_dashboard_commands(sub: argparse._SubParsersAction) -> None:
    """The ``generate``, ``push`` and ``snapshot`` sub-commands, onto ``sub``."""
    generate = sub.add_parser("generate", help="write dashboards/*.json from the code")
    generate.add_argument(
        "--check", action="store_true", help="fail if the files differ from the code"
    )
    generate.add_argument(
        "--out",
        type=Path,
        default=DASHBOARDS_DIR,
        help="folder (default: the repository's dashboards/)",
    )
    generate.set_defaults(func=cmd_generate)

    push = sub.add_parser("push", help="upload the dashboards and data source to Grafana")
    push.add_argument("--grafana-url", required=True, help="e.g. http://127.0.0.1:3000")
    push.add_argument("--token", help=f"service-account token (default: ${TOKEN_ENV})")
    push.add_argument(
        "--prometheus-url",
        help="Prometheus as Grafana's server reaches it (default: the local stack's)",
    )
    push.add_argument("--dashboards-dir", type=Path, default=DASHBOARDS_DIR, help="JSON files")
    push.set_defaults(func=cmd_push)

    snapshot = sub.add_parser("snapshot", help="render the key panels to PNG from Prometheus")
    snapshot.add_argument("--out", type=Path, required=True, help="folder for the PNG files")
    snapshot.add_argument("--prometheus-url", help="default: the local stack's Prometheus")
    snapshot.add_argument("--minutes", type=int, default=15, help="time range (default 15)")
    snapshot.set_defaults(func=cmd_snapshot)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dashboards generate|push|snapshot`` to the ``infergate`` parser."""
    dashboards = subparsers.add_parser(
        "dashboards", help="Grafana dashboards: generate, push, snapshot"
    )
    sub = dashboards.add_subparsers(dest="dashboards_command", required=True)
    add_dashboard_commands(sub)


def main(argv: list[str] | None = None) -> int:
    """``python -m infergate.dashboards``."""
    parser = argparse.ArgumentParser(prog="python -m infergate.dashboards", description=__doc__)
    add_dashboard_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return exit_code(lambda: args.func(args))

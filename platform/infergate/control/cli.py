"""``infergate canary ...``: rollout commands, sent to the running control plane's admin API."""

from __future__ import annotations

import argparse
from typing import Any

import httpx

from infergate.config import load_config
from infergate.errors import CommandFailed, StackError


def _call(args: argparse.Namespace, method: str, path: str, body: dict | None = None) -> Any:
    config = load_config(args.config)
    url = args.admin_url or config.admin.url
    token = args.token or config.admin.token
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, url + path, json=body, headers=headers, timeout=120)
    except httpx.HTTPError:
        raise StackError(
            f"the control plane at {url} does not answer; is `infergate up` running?"
        ) from None
    try:
        data = response.json()
    except ValueError:
        raise StackError(
            f"{url} answered {response.status_code} with no JSON: is it infergate's admin "
            "API (port 8104 by default)?"
        ) from None
    if response.status_code >= 400:
        raise CommandFailed(data.get("error", response.text))
    return data


def _print_status(status: dict[str, Any]) -> None:
    champion_weight = 100 - status["weight"] if status["canary"] else 100
    rows = [("version", "role", "weight")]
    if status["champion"]:
        rows.append((status["champion"], "champion", f"{champion_weight}%"))
    if status["canary"]:
        rows.append((status["canary"], "canary", f"{status['weight']}%"))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"model {status['model']} ({status['task']})")
    for row in rows:
        cells = (cell.ljust(w) for cell, w in zip(row, width, strict=True))
        print(("  " + "  ".join(cells)).rstrip())
    if status["canary"]:
        steps = ", ".join(str(s) for s in status["steps"])
        if status["mode"] == "manual":
            step = "manual"
        elif status.get("shadow"):
            step = "shadow"
        elif status["step"] == -1:  # automatic, started at a weight of its own
            step = f"start weight {status['weight']}%"
        else:
            step = f"{status['step'] + 1} of {len(status['steps'])}"
        print(f"  mode {status['mode']}, step {step} (steps {steps})")
        print(f"  last decision: {status['last_decision']} ({status['last_reason']})")
    else:
        print(f"  no canary; last rollout: {status.get('last_rollout') or 'none'}")
    figures = status.get("figures") or {}
    if status["canary"] and figures:
        print("  analysis of the current step:")
        for key, value in sorted(figures.items()):
            print(f"    {key:<22} {value:.4g}")


def cmd_start(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"version": args.version, "mode": "manual" if args.manual else "auto"}
    if args.weight is not None:
        body["weight"] = args.weight
    if args.no_shadow:
        body["shadow"] = False
    _print_status(_call(args, "POST", f"/admin/models/{args.name}/canary", body))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    _print_status(_call(args, "GET", f"/admin/models/{args.name}/rollout"))
    return 0


def cmd_set_weight(args: argparse.Namespace) -> int:
    body = {"weight": args.weight}
    _print_status(_call(args, "POST", f"/admin/models/{args.name}/canary/weight", body))
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    _print_status(_call(args, "POST", f"/admin/models/{args.name}/canary/promote"))
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    body = {"reason": args.reason} if args.reason else {}
    _print_status(_call(args, "POST", f"/admin/models/{args.name}/canary/rollback", body))
    return 0


def add_commands(subparsers: Any, common: argparse.ArgumentParser) -> None:
    admin = argparse.ArgumentParser(add_help=False, parents=[common])
    admin.add_argument("--admin-url", help="control plane API (default: the local stack's)")
    admin.add_argument("--token", help="admin token (default: INFERGATE_ADMIN__TOKEN)")
    canary = subparsers.add_parser("canary", help="roll a new version out as a canary")
    commands = canary.add_subparsers(dest="canary_command", required=True)

    start = commands.add_parser("start", parents=[admin], help="make VERSION the canary")
    start.add_argument("name")
    start.add_argument("--version", required=True)
    start.add_argument("--weight", type=int, help="initial traffic share in percent")
    mode = start.add_mutually_exclusive_group()
    mode.add_argument("--auto", action="store_true", help="analyse, advance, promote (default)")
    mode.add_argument("--manual", action="store_true", help="hold at the weight given")
    start.add_argument(
        "--no-shadow", action="store_true",
        help="automatic: begin at the first weighted step, without the shadow stage",
    )  # fmt: skip
    start.set_defaults(func=cmd_start)

    status = commands.add_parser("status", parents=[admin], help="versions, weights, analysis")
    status.add_argument("name")
    status.set_defaults(func=cmd_status)

    weight = commands.add_parser("set-weight", parents=[admin], help="hold the canary at W%%")
    weight.add_argument("name")
    weight.add_argument("weight", type=int)
    weight.set_defaults(func=cmd_set_weight)

    promote = commands.add_parser("promote", parents=[admin], help="canary becomes champion")
    promote.add_argument("name")
    promote.set_defaults(func=cmd_promote)

    rollback = commands.add_parser("rollback", parents=[admin], help="drop the canary")
    rollback.add_argument("name")
    rollback.add_argument("--reason", help="recorded on the version")
    rollback.set_defaults(func=cmd_rollback)

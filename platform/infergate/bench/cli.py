"""``infergate bench``: run the benchmark scenarios and write the results folder.

Hooked into the main parser with ``bench_cli.add_commands(sub)``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from infergate.bench.cost import H200_FP16_16_TOKENS_SEQUENCES_PER_S
from infergate.config import PROJECT_ROOT

if TYPE_CHECKING:
    from infergate.bench.options import BenchOptions

DEFAULT_OUT = PROJECT_ROOT / "bench-results"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def running_stack() -> Path | None:
    """The state folder of an ``infergate up`` stack running on this machine's default
    config, if one runs: the benchmark's cells would share the cores with it."""
    from infergate.config import load_config
    from infergate.stack.state import read_state

    state_dir = load_config().state_dir
    return state_dir if read_state(state_dir) is not None else None


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark; exit 0 when it ran (targets are reported, not enforced), 1 when a
    scenario failed to run, 2 with ``--check`` when a target was missed."""
    from infergate.bench.report import write_report
    from infergate.bench.runner import run_bench
    from infergate.bench.targets import evaluate_targets

    # Progress bars of artifact downloads would be noise between the progress lines.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = bench_options(args)

    # Stop what was started on Ctrl-C and on SIGTERM alike (SIGINT is ignored in
    # background jobs of non-interactive shells; SIGTERM would end Python without cleanup).
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)
    beside = running_stack()
    if beside is not None:
        _say(
            f"warning: an infergate stack runs from {beside}; its load disturbs every cell "
            "(`infergate down` stops it)"
        )
    try:
        results = run_bench(options, say=_say)
    except KeyboardInterrupt:
        _say("interrupted; every scenario started was stopped")
        return 130
    files = write_report(results, args.out)
    print(files["markdown"].read_text())
    _say("wrote " + ", ".join(str(path) for path in files.values()))
    failed = [n for n, r in results["scenarios"].items() if r.get("error")]
    failed += task_failures(results.get("tasks") or {})
    if (results.get("ceiling") or {}).get("error"):
        failed.append("ceiling")
    for cell in ("grpc", "batch"):
        if (results.get(cell) or {}).get("error"):
            failed.append(cell)
    if failed:
        _say(f"scenarios that failed: {', '.join(failed)}")
        return 1
    if args.check and any(t["passed"] is False for t in evaluate_targets(results)):
        return 2
    return 0


def bench_options(args: argparse.Namespace) -> BenchOptions:
    """What the command line asks the run to do."""
    from infergate.bench.options import ALL_SCENARIOS, BenchOptions
    from infergate.bench.workload import PROFILES

    profile = PROFILES["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.duration is not None:
        profile = replace(profile, duration_s=args.duration)
    tasks, peers = task_selection(args)
    # With --tasks and no --scenarios, only the task cells are measured.
    scenarios = args.scenarios or (() if tasks else ALL_SCENARIOS)
    return BenchOptions(
        profile=profile,
        scenarios=tuple(scenarios),
        tasks=tasks,
        peers=peers,
        cache_dir=args.cache_dir,
        refresh_model=args.refresh_model,
        timeout_s=args.timeout,
        quiet_wait_s=args.wait_quiet,
        noisy_retries=args.noisy_retries,
        variants=tuple(args.variant or ()),
        gpu_sequences_per_s=args.gpu_sequences_per_s,
    )


# The short form of the task cells in --smoke: one task with real weights, no peers.
SMOKE_TASKS = ("feature-extraction",)


def task_selection(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The task cells and the embeddings cell's peers asked for: ``--tasks`` alone means
    every task (with --smoke, ``SMOKE_TASKS``); the peers run with the embeddings cell
    unless ``--peers`` names fewer (or none), and not in --smoke unless named."""
    from infergate.bench.options import PEER_NAMES
    from infergate.bench.task_models import TASK_NAMES

    if args.tasks is None:
        return (), ()
    tasks = tuple(args.tasks) or (SMOKE_TASKS if args.smoke else TASK_NAMES)
    default = () if args.smoke else PEER_NAMES
    peers = tuple(args.peers) if args.peers is not None else default
    return tasks, peers if "feature-extraction" in tasks else ()


def task_failures(tasks: dict) -> list[str]:
    """What failed in the task part: the stack, a task's cell or its ceiling (a peer that
    cannot run here is reported, not counted: it is not the platform's failure)."""
    failed = ["tasks: the stack"] if (tasks.get("stack") or {}).get("error") else []
    for task, record in (tasks.get("cases") or {}).items():
        if (record.get("served", {}).get("infergate") or {}).get("error"):
            failed.append(f"tasks: {task}")
        if (record.get("ceiling") or {}).get("error"):
            failed.append(f"tasks: {task} ceiling")
    return failed


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a rate above 0")
    return value


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` to the ``infergate`` command's subparsers."""
    from infergate.bench.options import ALL_SCENARIOS, PEER_NAMES, Variant
    from infergate.bench.task_models import TASK_NAMES

    def variant(text: str) -> Variant:
        try:
            return Variant.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    bench = subparsers.add_parser(
        "bench",
        help="benchmark infergate against its ceiling and baselines",
        description="Start each scenario on free ports, drive it with the same load "
        "generator, and write results.json, results.md and plots to --out.",
    )
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer cells, short (a few minutes)")
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny grid, for CI: a few minutes, most of it starting things",
    )
    bench.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    bench.add_argument(
        "--tasks",
        nargs="*",
        choices=TASK_NAMES,
        metavar="TASK",
        help="also measure a cell per task, infergate against the task's ceiling (all "
        f"tasks when none is named; with --smoke, {' '.join(SMOKE_TASKS)}); without "
        f"--scenarios, only these. Tasks: {', '.join(TASK_NAMES)}",
    )
    bench.add_argument(
        "--peers",
        nargs="*",
        choices=PEER_NAMES,
        metavar="PEER",
        help="peers measured in the feature-extraction cell (default: all of them, none "
        f"with --smoke; none when the flag names none). Peers: {', '.join(PEER_NAMES)}",
    )
    bench.add_argument("--scenarios", nargs="+", choices=ALL_SCENARIOS, help="default: all of them")
    bench.add_argument("--cache-dir", type=Path, help="where the prepared model is kept")
    bench.add_argument(
        "--refresh-model", action="store_true", help="rebuild the cached model first"
    )
    bench.add_argument("--duration", type=float, help="seconds per cell (overrides the mode)")
    bench.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, s")
    bench.add_argument(
        "--noisy-retries",
        type=int,
        default=2,
        help="measure a cell again (at most this often) when other load disturbed it",
    )
    bench.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each cell, wait up to this long for other load on the box to calm down",
    )
    bench.add_argument(
        "--variant",
        action="append",
        type=variant,
        metavar="LABEL:NAME=VALUE[,...]",
        help="also measure infergate with these environment settings, side by side; "
        "repeatable (e.g. 'one-instance:INFERGATE_TRITON__INSTANCE_COUNT=1')",
    )
    bench.add_argument(
        "--gpu-sequences-per-s",
        type=_positive,
        default=H200_FP16_16_TOKENS_SEQUENCES_PER_S,
        metavar="RATE",
        help="the GPU the cost table prices front-end cores against: its sequences/s "
        "(default: an H200, fp16, 16 tokens, 253,000)",
    )
    bench.add_argument("--check", action="store_true", help="exit 2 when a target is missed")
    bench.set_defaults(func=cmd_bench)


def main(argv: list[str] | None = None) -> int:
    """``python -m infergate.bench.cli bench ...``: the same command without the main CLI."""
    import logging

    from infergate.errors import exit_code

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(prog="infergate")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return exit_code(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())

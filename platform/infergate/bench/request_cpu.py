"""CPU per request of a front-end replica's own request path, two code trees side by side.

A repeatable measurement for issue 37's "cut it": the platform's ``Frontend`` built as a
replica builds it (the served version's tokenizer, spec and drift reference, the
replica's ``Monitors`` and ``RayTelemetry`` totals flushed once a second, the coalescing
``BatchingBackend`` in front of the real ``TritonBackend``), called as an ASGI app by
``--concurrency`` clients in the same event loop (uvloop, as Ray Serve runs it), against
a real Triton serving the version's ONNX file. Ray Serve's proxy, its replica wrapper and
uvicorn are left out: what is measured is the platform's code and the libraries it calls
(Starlette, tokenizers, tritonclient, gRPC), plus the few microseconds of the clients'
own ASGI glue, the same for both trees.

Each worker is one process running one tree's ``infergate`` (``PYTHONPATH``); the
driver starts Triton once, then in every round runs a worker of each tree at the same
time on the same load, so both see the same machine. A worker reports the process's
CPU (``time.process_time``: every thread, gRPC's included) per request over windows of
``--window-s``; the driver prints each tree's median and spread per cell.

    python -m infergate.bench.request_cpu --served-dir DIR --baseline-tree OLD --tree NEW
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROUTE_PATH = "/v1/models/{model}/predict"
TEXT_TOKENS = 16  # the bench's single-text cell: 16-token texts


# -- the worker: one tree's front-end under load -------------------------------------------


def build_frontend(
    served_dir: Path, model: str, version: str, settings_file: Path
) -> tuple[Any, Any, Any]:
    """The front-end as a replica builds it for one version: ``(frontend, monitors,
    telemetry)``. Only the APIs both trees share are used."""
    from infergate.config import FrontendSettings
    from infergate.observe.monitor import Monitors
    from infergate.observe.telemetry import RayTelemetry
    from infergate.protocols.frontend import Frontend
    from infergate.serving.batching import BatchingBackend
    from infergate.serving.routing import ServedModel
    from infergate.serving.runtime import ModelRuntime
    from infergate.serving.tokenization import TextTokenizer, tokenize_serially
    from infergate.triton.client import TritonBackend
    from infergate.versions import ServedVersion, Spec

    tokenize_serially()
    try:  # the replica's collector setting, in the trees that have it
        from infergate.serving.gc_tuning import collect_young_objects_rarely
    except ImportError:
        pass
    else:
        collect_young_objects_rarely()
    spec = Spec.from_dict(json.loads((served_dir / "infergate.json").read_text()))
    reference = json.loads((served_dir / "reference_stats.json").read_text())
    tokenizer = TextTokenizer.from_dir(served_dir / "tokenizer", spec.max_length)
    served = ServedVersion(model, version, spec.task, "bench")
    runtime = ModelRuntime(served, spec, tokenizer, reference)
    settings = FrontendSettings.model_validate_json(settings_file.read_text())
    backend = BatchingBackend.from_settings(
        TritonBackend(settings.triton_grpc_url, settings.triton_timeout_s), settings
    )
    telemetry = RayTelemetry()
    monitors = Monitors(telemetry)
    models = {model: ServedModel(model, spec.task, (runtime,))}
    frontend = Frontend(settings, backend, models, telemetry=telemetry, monitors=monitors)
    return frontend, monitors, telemetry


class CollectorClock:
    """The time the garbage collector takes in this process, from its own callbacks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections += 1

    def close(self) -> None:
        gc.callbacks.remove(self._on_collection)


async def _drive(args: argparse.Namespace) -> list[dict[str, float]]:
    from starlette.requests import Request

    frontend, monitors, telemetry = build_frontend(
        args.served_dir, args.model, args.version, args.settings_file
    )
    texts: list[str] = json.loads(args.texts_file.read_text())
    bodies = [
        json.dumps(
            {"inputs": [texts[(i * args.texts + j) % len(texts)] for j in range(args.texts)]}
        ).encode()
        for i in range(len(texts))
    ]
    path = ROUTE_PATH.format(model=args.model)
    interval_s = 1.0 / args.rate if args.rate else 0.0
    next_start = time.perf_counter()
    done = 0
    failed = 0
    stop = False

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        response = await frontend.handle(Request(scope, receive))
        await response(scope, receive, send)

    async def paced() -> None:
        """Wait for this request's turn: ``--rate`` requests a second over all clients."""
        nonlocal next_start
        now = time.perf_counter()
        next_start = max(next_start + interval_s, now)
        if next_start > now:
            await asyncio.sleep(next_start - now)

    async def client(index: int) -> None:
        nonlocal done, failed
        i = index
        while not stop:
            if interval_s:
                await paced()
            body = bodies[i % len(bodies)]
            i += args.concurrency
            status = 0

            async def receive(body: bytes = body) -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": path,
                "raw_path": path.encode(),
                "query_string": b"",
                "root_path": "",
                "headers": [
                    (b"host", b"127.0.0.1"),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
                "client": ("127.0.0.1", 5000 + index),
                "server": ("127.0.0.1", 8000),
            }
            await app(scope, receive, send)
            done += 1
            if status != 200:
                failed += 1

    async def refresh() -> None:  # what the replica's report loop does once a second
        while not stop:
            await asyncio.sleep(1.0)
            monitors.publish()
            telemetry.flush()

    tasks = [asyncio.create_task(client(i)) for i in range(args.concurrency)]
    tasks.append(asyncio.create_task(refresh()))
    await asyncio.sleep(args.warmup_s)
    windows = []
    collector = CollectorClock()
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        requests0, cpu0, wall0 = done, time.process_time(), time.perf_counter()
        gc0, collections0 = collector.seconds, collector.collections
        await asyncio.sleep(args.window_s)
        requests = done - requests0
        windows.append(
            {
                "requests": requests,
                "cpu_s": time.process_time() - cpu0,
                "wall_s": time.perf_counter() - wall0,
                "gc_s": collector.seconds - gc0,
                "collections": collector.collections - collections0,
            }
        )
    collector.close()
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    if failed:
        raise SystemExit(f"{failed} of {done} requests failed")
    return windows


def worker(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="request_cpu worker")
    parser.add_argument("--served-dir", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", required=True, help="its own Triton model, per tree")
    parser.add_argument("--settings-file", type=Path, required=True,
                        help="the replicas' FrontendSettings as JSON (the driver's)")  # fmt: skip
    parser.add_argument("--texts-file", type=Path, required=True)
    parser.add_argument("--texts", type=int, default=1, help="texts per request")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: flat out")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--window-s", type=float, default=0.5)
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # Ray Serve runs on uvloop where it is installed
        pass
    windows = asyncio.run(_drive(args))
    print(json.dumps(windows))
    return 0


# -- the driver: Triton, then rounds of both trees at the same time -------------------------


def write_texts(served_dir: Path, out: Path) -> Path:
    from infergate.bench.workload import build_text_sets

    sets = build_text_sets(served_dir / "tokenizer", [TEXT_TOKENS])
    out.write_text(json.dumps(sets.by_tokens[TEXT_TOKENS]))
    return out


def run_round(
    trees: dict[str, Path],
    worker_args: list[str],
    python: str,
    *,
    reverse: bool = False,
    turns: bool = False,
) -> dict[str, list[dict[str, float]]]:
    """One worker per tree, started together (``reverse``: the last tree's first; with
    ``turns``, one after the other), tree ``i`` on version ``i + 1``; their windows by
    tree name."""
    running = {}
    windows = {}
    order = list(enumerate(trees.items()))
    for index, (name, tree) in reversed(order) if reverse else order:
        code = (
            "import runpy, sys; sys.argv = ['request_cpu', 'worker', *sys.argv[1:]]; "
            f"runpy.run_path({str(HERE)!r}, run_name='__main__')"
        )
        env = {**os.environ, "PYTHONPATH": str(tree / "platform")}
        running[name] = subprocess.Popen(
            [python, "-c", code, *worker_args, "--version", str(index + 1)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        if turns:
            windows[name] = _windows(name, running.pop(name))
    for name, process in running.items():
        windows[name] = _windows(name, process)
    return windows


def _windows(name: str, process: subprocess.Popen[str]) -> list[dict[str, float]]:
    out, err = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"worker {name} failed:\n{err[-3000:]}")
    windows: list[dict[str, float]] = json.loads(out.strip().splitlines()[-1])
    return windows


def per_request_us(window: dict[str, float]) -> float:
    return window["cpu_s"] / window["requests"] * 1e6 if window["requests"] else float("nan")


def summary(windows: list[dict[str, float]], texts: int) -> dict[str, float]:
    """CPU us per request over every window (median, least, quartiles) and over the
    whole run; ``per_sequence`` divides by the texts of a request; ``gc_us``: the
    garbage collector's time per request over the run."""
    figures = sorted(per_request_us(w) for w in windows if w["requests"])
    quartiles = statistics.quantiles(figures, n=4) if len(figures) > 1 else figures * 3
    requests = sum(w["requests"] for w in windows)
    overall = sum(w["cpu_s"] for w in windows) / requests * 1e6
    return {
        "median_us": statistics.median(figures),
        "least_us": figures[0],
        "q1_us": quartiles[0],
        "q3_us": quartiles[2],
        "overall_us": overall,
        "overall_per_sequence_us": overall / texts,
        "req_per_s": requests / sum(w["wall_s"] for w in windows),
        "gc_us": sum(w.get("gc_s", 0.0) for w in windows) / requests * 1e6,
        "collections": sum(w.get("collections", 0) for w in windows),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return worker(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--served-dir", type=Path, required=True,
                        help="a served version: model.onnx, tokenizer/, infergate.json, "
                        "reference_stats.json")  # fmt: skip
    parser.add_argument("--baseline-tree", type=Path, required=True, help="old code (A)")
    parser.add_argument("--tree", type=Path, required=True, help="new code (B)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rates", type=float, nargs="+", default=[800.0, 60.0],
                        help="requests/s of each --texts cell, per worker (0: flat out); "
                        "paced, both trees answer as many requests")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--turns", action="store_true",
                        help="the trees' workers one after the other, not at once")  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--stand-in-graph", action="store_true",
                        help="Triton serves a graph that costs it next to nothing "
                        "(stand_in.write_stand_in_graph), not the version's model")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write every window here")
    args = parser.parse_args(argv)
    from infergate.bench import stand_in
    from infergate.config import load_config

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="request-cpu-"))
    model = "sentiment"
    trees = {"A": args.baseline_tree.resolve(), "B": args.tree.resolve()}
    triton, triton_settings = stand_in.start_triton(
        workdir, args.served_dir, model, ["1", "2"], stand_in=args.stand_in_graph
    )
    # What a replica of this stack gets (its calls capped at Triton's max_batch_size),
    # the same for both trees
    stack = load_config().model_copy(update={"triton": triton_settings})
    settings_file = workdir / "frontend_settings.json"
    settings_file.write_text(stack.frontend_settings().model_dump_json())
    results: dict[str, Any] = {}
    try:
        texts_file = write_texts(args.served_dir, workdir / "texts.json")
        for texts, rate in zip(args.texts, args.rates, strict=True):
            for round_ in range(args.rounds):
                worker_args = [
                    "--served-dir", str(args.served_dir), "--model", model,
                    "--settings-file", str(settings_file),
                    "--texts-file", str(texts_file), "--texts", str(texts),
                    "--concurrency", str(args.concurrency), "--seconds", str(args.seconds),
                    "--rate", str(rate),
                ]  # fmt: skip
                windows = run_round(
                    trees, worker_args, sys.executable, reverse=round_ % 2 == 1, turns=args.turns
                )
                for name, tree_windows in windows.items():
                    figures = summary(tree_windows, texts)
                    results.setdefault(f"{texts}", {}).setdefault(name, []).append(
                        {"summary": figures, "windows": tree_windows}
                    )
                    print(
                        f"texts={texts:<2} round {round_ + 1} {name}: "
                        f"median {figures['median_us']:.0f} us/request "
                        f"(least {figures['least_us']:.0f}, "
                        f"IQR {figures['q1_us']:.0f}-{figures['q3_us']:.0f}), "
                        f"overall {figures['overall_us']:.0f} us/request = "
                        f"{figures['overall_per_sequence_us']:.1f} us/sequence "
                        f"at {figures['req_per_s']:.0f} req/s; garbage collector "
                        f"{figures['gc_us']:.1f} us/request ({figures['collections']} collections)",
                        flush=True,
                    )
    finally:
        triton.terminate()
        triton.wait(60)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

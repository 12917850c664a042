"""The ``infergate`` command: run the stack, register models."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from infergate.batch import cli as batch_cli
from infergate.bench import cli as bench_cli
from infergate.config import StackConfig, load_config
from infergate.control import cli as canary_cli
from infergate.dashboards import cli as dashboards_cli
from infergate.errors import InfergateError, StackError, exit_code
from infergate.observe import payloads_cli
from infergate.serving import keys_cli
from infergate.serving.access import read_keys
from infergate.tasks import TASKS

log = logging.getLogger("infergate")
DETACH_TIMEOUT_S = 1800.0  # the first `up --demo` trains and registers the demo models


def _config(args: argparse.Namespace) -> StackConfig:
    overrides: dict[str, Any] = {}
    if getattr(args, "state_dir", None):
        overrides["state_dir"] = args.state_dir
    return load_config(args.config, overrides=overrides)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _reachable(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


# -- up / down -----------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    from infergate.stack.state import read_state
    from infergate.stack.supervisor import Stack

    config = _config(args)
    if read_state(config.state_dir):
        raise StackError(
            f"a stack already runs from {config.state_dir} (see stack.json there); "
            "stop it with `infergate down` first"
        )
    keys = config.frontend.api_keys_file
    if keys is not None and not read_keys(keys).keys:  # also: refuses a broken file
        raise StackError(
            f"frontend.api_keys_file is {keys}, which holds no key: every request would get "
            f"a 401. Add one with `infergate keys create NAME --file {keys}`"
        )
    if args.detach:
        return _up_detached(args, config)
    stack = Stack(config)
    stop_requested: list[bool] = []

    def on_signal(signum: int, frame: Any) -> None:
        if stop_requested:  # a second Ctrl-C
            raise KeyboardInterrupt
        stop_requested.append(True)
        if not os.path.exists(config.state_dir / "stack.json"):
            raise KeyboardInterrupt  # still starting: abort the start at once

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        _say(f"starting MLflow, Triton, Ray Serve and Prometheus (logs in {stack.log_dir}) ...")
        stack.start()
        if args.demo:
            _register_demo(config)
        assert stack.control is not None
        stack.control.reconcile()
        if stack.control.serving:
            stack.wait_serving()
        stack.write_state()
        _print_endpoints(stack.endpoints())
        stack.watch(stop_requested)
    except KeyboardInterrupt:
        pass
    except InfergateError:
        raise
    except Exception as exc:  # a component failed in a way we did not foresee
        log.exception("the stack failed")
        raise StackError(f"the stack failed: {type(exc).__name__}: {exc}") from None
    finally:
        _say("stopping ...")
        stack.stop()
        _say("stopped")
    return 0


def _register_demo(config: StackConfig) -> None:
    """In a child process, so PyTorch never lives in the supervisor."""
    _say("registering the demo models if the registry lacks them ...")
    command = [sys.executable, "-m", "infergate", "demo", "--tracking-uri", config.mlflow.uri]
    if subprocess.run(command, check=False).returncode != 0:
        raise StackError("registering the demo models failed (see above)")


def _print_endpoints(endpoints: dict[str, Any], *, detached: bool = False) -> None:
    lines = ["infergate is up:"]
    keys = (
        "inference",
        "inference_grpc",
        "admin",
        "mlflow",
        "triton_grpc",
        "triton_metrics",
        "prometheus",
        "logs",
    )
    for key in keys:
        if key in endpoints:
            lines.append(f"  {key:<15} {endpoints[key]}")
    models = ", ".join(endpoints["models"]) or "none (register one with `infergate register`)"
    lines.append(f"  {'models':<15} {models}")
    lines.append(
        "Stop with `infergate down`." if detached else "Stop with Ctrl-C or `infergate down`."
    )
    print("\n".join(lines), flush=True)


def _up_detached(args: argparse.Namespace, config: StackConfig) -> int:
    from infergate.stack.state import read_state

    log_dir = config.state_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "infergate", "up"]
    if args.demo:
        command.append("--demo")
    if args.config:
        command += ["--config", str(args.config)]
    if args.state_dir:
        command += ["--state-dir", str(args.state_dir)]
    with (log_dir / "up.log").open("ab") as log_file:
        child = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + DETACH_TIMEOUT_S
    while time.monotonic() < deadline:
        state = read_state(config.state_dir)
        if state and state.get("pid") == child.pid:
            _print_endpoints(state, detached=True)
            return 0
        if child.poll() is not None:
            tail = (log_dir / "up.log").read_text(errors="replace").splitlines()[-20:]
            raise StackError("the stack failed to start:\n" + "\n".join(tail))
        time.sleep(0.5)
    child.terminate()
    raise StackError(f"the stack was not up after {DETACH_TIMEOUT_S:.0f} s; see {log_dir}")


def cmd_down(args: argparse.Namespace) -> int:
    from infergate.stack.state import stop_running

    config = _config(args)
    if stop_running(config.state_dir):
        _say("stopped")
    else:
        _say(f"no stack runs from {config.state_dir}")
    return 0


def cmd_triton(args: argparse.Namespace) -> int:
    """Run the wheel's Triton in the foreground, for a control plane on another machine."""
    from infergate.triton.server import (
        find_tritonserver,
        prepare_backends,
        server_command,
        server_environment,
    )

    config = _config(args)
    settings = config.triton.model_copy(update={"bind_address": args.address})
    repository = args.repository or config.state_dir / "triton-repository"
    repository.mkdir(parents=True, exist_ok=True)
    install = find_tritonserver()
    backends = prepare_backends(config.state_dir, install=install)
    command = server_command(settings, repository, backends, install=install)
    _say(
        f"Triton on {args.address}: HTTP {settings.http_port}, gRPC {settings.grpc_port}, "
        f"metrics {settings.metrics_port}; repository {repository} (explicit model control)"
    )
    os.execve(command[0], command, server_environment(os.environ, install=install))


# -- register ------------------------------------------------------------------------------


def _registry(args: argparse.Namespace):
    from infergate.registry import Registry

    uri = args.tracking_uri or _config(args).mlflow.uri
    if not _reachable(uri):
        raise StackError(
            f"the MLflow server at {uri} does not answer; start the stack with "
            "`infergate up` or pass --tracking-uri"
        )
    return Registry(uri)


def cmd_register(args: argparse.Namespace) -> int:
    from infergate.registration.pipeline import describe, register_model
    from infergate.registration.prompts import parse_prompt_options

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    registered = register_model(
        args.src,
        name=args.name,
        task=args.task,
        registry=_registry(args),
        precision=args.precision,
        max_length=args.max_length,
        reference_texts=args.reference_texts,
        alias=args.alias,
        quality_budget=args.quality_budget,
        progress=not args.quiet,
        onnx_file=args.onnx,
        prompts=parse_prompt_options(args.prompt),
        default_prompt=args.default_prompt,
    )
    print(describe(registered))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from infergate.registration.demo import register_demo_models

    for line in register_demo_models(_registry(args), progress=not args.quiet):
        print(line)
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    from infergate.protocols.wire import Limits

    def limits(args: argparse.Namespace) -> Limits:
        frontend = _config(args).frontend  # predict's own limits on a text
        return Limits(frontend.max_body_bytes, frontend.max_texts_per_request,
                      frontend.max_chars_per_text)  # fmt: skip

    return batch_cli.cmd_batch(args, _registry, limits)


# -- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infergate", description="Run the serving stack, register models, roll them out."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="YAML config (default deployments/local.yaml)")
    common.add_argument("--state-dir", type=Path, help="folder for logs and runtime state")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", parents=[common], help="start the whole local stack")
    up.add_argument("--demo", action="store_true", help="register and serve the demo models")
    up.add_argument("--detach", action="store_true", help="return once everything is ready")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", parents=[common], help="stop the stack started by `up`")
    down.set_defaults(func=cmd_down)

    triton = sub.add_parser(
        "triton",
        parents=[common],
        help="run a Triton server (from the nvidia-pytriton wheel) for a control plane that "
        "drives it from elsewhere (triton.external_host)",
    )
    triton.add_argument(
        "--address", default="127.0.0.1", help="address to listen on; 0.0.0.0 for other hosts"
    )
    triton.add_argument(
        "--repository", type=Path, help="model repository (default: STATE_DIR/triton-repository)"
    )
    triton.set_defaults(func=cmd_triton)

    registry = argparse.ArgumentParser(add_help=False, parents=[common])
    registry.add_argument("--tracking-uri", help="MLflow server (default: the local stack's)")
    registry.add_argument("--quiet", action="store_true", help="no progress bars")

    register = sub.add_parser(
        "register", parents=[registry], help="optimise a model and register it as a version"
    )
    register.add_argument(
        "src",
        help="Hugging Face model folder (PyTorch weights, or an ONNX file: model.onnx or one "
        "under onnx/), or an MLflow artifact URI",
    )
    register.add_argument(
        "--onnx",
        metavar="FILE",
        help="register from this ONNX file (a path, or one inside SRC) instead of exporting "
        "from PyTorch, with SRC's tokenizer and config.json; without it a folder with no "
        "PyTorch weights is registered from its own ONNX file",
    )
    register.add_argument("--name", required=True, help="registered model name")
    register.add_argument("--task", required=True, choices=list(TASKS))
    register.add_argument("--precision", choices=("int8", "fp16", "fp32"), default="int8")
    register.add_argument("--max-length", type=int, help="truncate inputs to this many tokens")
    register.add_argument(
        "--reference-texts", type=Path, help="texts for the quality check and drift reference"
    )
    register.add_argument("--alias", help="set this alias on the new version, e.g. champion")
    register.add_argument(
        "--quality-budget",
        default="default",
        help="what the optimised model must keep on the reference texts against the original: "
        "'default' (the task's), 'none', or NAME=VALUE,... such as "
        "nn_agreement=0.95,cosine_mean=0.995 (floors; *_change figures are ceilings)",
    )
    register.add_argument(
        "--prompt",
        action="append",
        default=[],
        metavar="NAME=TEXT",
        help="a named prompt a request picks by prompt_name, put before each text (repeat "
        "for more), e.g. --prompt 'query=query: '; over those of SRC's "
        "config_sentence_transformers.json (embedding models)",
    )
    register.add_argument(
        "--default-prompt",
        metavar="NAME",
        help="the prompt put before texts whose request names none (default: SRC's "
        "default_prompt_name, if any)",
    )
    register.set_defaults(func=cmd_register)

    demo = sub.add_parser("demo", parents=[registry], help="register the demo models")
    demo.set_defaults(func=cmd_demo)

    batch_cli.add_command(sub, [registry], cmd_batch)
    canary_cli.add_commands(sub, common)
    keys_cli.add_commands(sub, common)
    payloads_cli.add_commands(sub, common)
    dashboards_cli.add_commands(sub)
    bench_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Our own progress at INFO; libraries (ONNX Runtime's quantiser, httpx) only warnings.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    args = build_parser().parse_args(argv)
    try:
        return exit_code(lambda: args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `infergate canary status m | head -3`: the reader left
        # Python flushes stdout again at exit; point it at nothing so that says nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

"""The model every scenario serves, prepared once and cached between runs.

All scenarios serve the demo ``sentiment`` model (all-MiniLM-L6-v2 with a trained
classification head), so that every comparison is between the same weights:

- ``sentiment-hf/``: the Hugging Face folder that ``infergate up --demo`` builds
  (:func:`infergate.registration.demo_models.build_sentiment_model`, seed 0); the naive
  baseline runs it in PyTorch fp32.
- ``store/``: an MLflow store in which that folder was registered by ``infergate register``
  (default precision, alias ``champion``); the infergate scenario starts its stack on a copy.
- ``served/``: ``model.onnx``, ``tokenizer/`` and ``infergate.json`` of that version,
  downloaded from the registry: the very files the platform serves, which the ceiling, the
  ensemble and the in-process scenarios load.

Building takes a minute or two (training, export, quantisation, parity); later runs reuse
the cache. A file lock keeps two harnesses from building it at the same time.

``stand-in/`` holds a second model under the same name for the ``stand-in`` scenario: a
graph that costs Triton next to nothing (:func:`infergate.bench.stand_in.write_stand_in_graph`)
with the sentiment model's tokenizer and labels, registered from its ONNX file as a user
would (``hf/``, ``store/``, ``served/`` as above). On it the stack runs as it would before
a GPU: Triton no longer holds the rate down, and the front-end's CPU per request is what
it costs when the front-end is what limits the rate.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from infergate.config import PROJECT_ROOT
from infergate.errors import StackError

DEFAULT_CACHE_DIR = PROJECT_ROOT / ".infergate" / "bench-cache"
MODEL_NAME = "sentiment"
TASK = "text-classification"
MANIFEST = "manifest.json"
SERVED_FILES = ("model.onnx", "tokenizer", "infergate.json", "reference_stats.json")
MLFLOW_START_TIMEOUT_S = 90.0
REGISTER_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class PreparedModel:
    """Paths of the cached model and what the registry said about it."""

    hf_dir: Path
    store_dir: Path
    onnx_path: Path
    tokenizer_dir: Path
    spec: dict
    version: str
    onnx_sha256: str

    @property
    def served_dir(self) -> Path:
        return self.onnx_path.parent

    @property
    def labels(self) -> list[str]:
        return list(self.spec.get("labels", []))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def locked(cache_dir: Path) -> Iterator[None]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _load(cache_dir: Path, hf_name: str = "sentiment-hf") -> PreparedModel | None:
    manifest = cache_dir / MANIFEST
    if not manifest.exists():
        return None
    data = json.loads(manifest.read_text())
    served = cache_dir / "served"
    prepared = PreparedModel(
        hf_dir=cache_dir / hf_name,
        store_dir=cache_dir / "store",
        onnx_path=served / "model.onnx",
        tokenizer_dir=served / "tokenizer",
        spec=json.loads((served / "infergate.json").read_text()),
        version=str(data["version"]),
        onnx_sha256=str(data["onnx_sha256"]),
    )
    needed = [prepared.hf_dir / "config.json", *(served / name for name in SERVED_FILES)]
    return prepared if all(path.exists() for path in needed) else None


def prepare_model(
    cache_dir: Path = DEFAULT_CACHE_DIR,
    *,
    refresh: bool = False,
    say: Callable[[str], None] = print,
) -> PreparedModel:
    """The cached model, built first if missing (or if ``refresh``)."""
    cache_dir = Path(cache_dir).resolve()
    with locked(cache_dir):
        prepared = None if refresh else _load(cache_dir)
        if prepared is not None:
            return prepared
        for stale in ("sentiment-hf", "store", "served", MANIFEST):
            target = cache_dir / stale
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        started = time.monotonic()
        say(f"preparing the benchmark model in {cache_dir} (once; a minute or two) ...")
        _build_hf_folder(cache_dir / "sentiment-hf")
        version = _register_and_download(cache_dir, say)
        onnx_sha = sha256(cache_dir / "served" / "model.onnx")
        manifest = {"model": MODEL_NAME, "version": version, "onnx_sha256": onnx_sha}
        (cache_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
        say(f"benchmark model ready in {time.monotonic() - started:.0f} s")
        loaded = _load(cache_dir)
        assert loaded is not None
        return loaded


def prepare_stand_in(prepared: PreparedModel, say: Callable[[str], None] = print) -> PreparedModel:
    """The stand-in model beside ``prepared`` (in its cache's ``stand-in/``), registered
    first if missing: a few seconds. It takes only the tokenizer and labels from
    ``prepared``, which a rebuilt benchmark model keeps."""
    cache_dir = prepared.store_dir.parent / "stand-in"
    with locked(cache_dir):
        loaded = _load(cache_dir, "hf")
        if loaded is not None:
            return loaded
        for stale in ("hf", "store", "served"):
            shutil.rmtree(cache_dir / stale, ignore_errors=True)
        say("registering the stand-in model (once; a few seconds) ...")
        build_stand_in_folder(prepared.hf_dir, cache_dir / "hf", prepared.spec["output_name"])
        with mlflow_on(cache_dir / "store", cache_dir / "logs") as uri:
            version = register_and_download(
                uri, cache_dir / "hf", MODEL_NAME, TASK, cache_dir / "served"
            )
        onnx_sha = sha256(cache_dir / "served" / "model.onnx")
        manifest = {"model": MODEL_NAME, "version": version, "onnx_sha256": onnx_sha}
        (cache_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
        loaded = _load(cache_dir, "hf")
        assert loaded is not None
        return loaded


def build_stand_in_folder(hf_dir: Path, out_dir: Path, output_name: str) -> None:
    """A model folder as a user brings an ONNX-only model: the stand-in graph as
    ``model.onnx``, and ``hf_dir``'s tokenizer files and config (its labels and length
    limit) without the architecture, which would name fusions for a graph that has none."""
    from infergate.bench.stand_in import write_stand_in_graph

    out_dir.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(hf_dir / name, out_dir / name)
    config = json.loads((hf_dir / "config.json").read_text())
    config.pop("architectures", None)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    write_stand_in_graph(out_dir / "model.onnx", output_name)


def _build_hf_folder(out_dir: Path) -> None:
    # In a child process: PyTorch's threads and memory should not stay in the harness,
    # whose CPU time is measured as the load generator's.
    code = (
        "import sys; from pathlib import Path; "
        "from infergate.registration.demo import SENTIMENT_DATA, minilm_dir; "
        "from infergate.registration.demo_models import build_sentiment_model; "
        "build_sentiment_model(minilm_dir(), SENTIMENT_DATA, Path(sys.argv[1]), progress=False)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run_step([sys.executable, "-c", code, str(out_dir)], env, "training the sentiment model")


@contextlib.contextmanager
def mlflow_on(store_dir: Path, logs_dir: Path) -> Iterator[str]:
    """An MLflow server on ``store_dir`` for as long as the block runs; yields its URI."""
    from infergate.config import MlflowSettings
    from infergate.stack import mlflow_server
    from infergate.stack.processes import free_ports, http_ok, spawn, wait_until

    [port] = free_ports(1)
    settings = MlflowSettings(store_dir=store_dir, port=port)
    uri = settings.uri
    command = mlflow_server.server_command(settings)
    env = mlflow_server.server_environment(settings, os.environ)
    mlflow = spawn("mlflow", command, logs_dir, env)
    try:
        wait_until(mlflow, lambda: http_ok(f"{uri}/health"), MLFLOW_START_TIMEOUT_S, "MLflow")
        yield uri
    finally:
        mlflow.stop()


def register_and_download(
    uri: str,
    hf_dir: Path,
    name: str,
    task: str,
    served_dir: Path,
    files: Sequence[str] = SERVED_FILES,
) -> str:
    """``infergate register`` ``hf_dir`` as ``name`` (alias champion) at ``uri``, then
    download ``files`` of the new version to ``served_dir``; returns the version."""
    from infergate.registry import Registry
    from infergate.versions import CHAMPION

    register = [
        str(Path(sys.executable).with_name("infergate")),
        "register",
        str(hf_dir),
        "--name",
        name,
        "--task",
        task,
        "--alias",
        CHAMPION,
        "--tracking-uri",
        uri,
        "--quiet",
    ]
    run_step(register, {**os.environ, "HF_HUB_OFFLINE": "1"}, f"infergate register ({name})")
    registry = Registry(uri)
    version = registry.model(name).aliases[CHAMPION]
    source = registry.version_source(name, version)
    for relative in files:
        registry.download(source, relative, served_dir)
    return str(version)


def _register_and_download(cache_dir: Path, say: Callable[[str], None]) -> str:
    with mlflow_on(cache_dir / "store", cache_dir / "logs") as uri:
        say("registering it with `infergate register` ...")
        return register_and_download(
            uri, cache_dir / "sentiment-hf", MODEL_NAME, TASK, cache_dir / "served"
        )


def run_step(command: list[str], env: dict[str, str], what: str) -> None:
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=REGISTER_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise StackError(f"{what} failed (exit {done.returncode}):\n{tail}")

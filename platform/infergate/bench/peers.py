"""The peers a user would pick instead of infergate to serve embeddings on the same machine,
started as their users start them and driven by the same load generator as infergate's
embeddings cell (``infergate.bench.task_cells``), each with the settings listed here
tried in turn, its fastest kept:

- ``fastembed`` (Qdrant; ONNX Runtime): in process behind the naive baseline's harness,
  FastAPI under uvicorn (``infergate.bench.fastembed_server``), a worker per core with one
  ONNX Runtime thread each, or one worker with a thread per core. Installed in the
  project's environment without its dependencies (``make bench-peers``): it asks for the
  ``onnxruntime`` package, which would overwrite the ``onnxruntime-gpu`` build the
  platform installs under the same module name.
- ``infinity`` (``infinity-emb``): its own HTTP server, ``infinity_emb v2``, with its
  torch engine at two batch sizes and its optimum (ONNX Runtime) engine. It needs
  transformers < 5 (its torch engine calls the tokenizer's ``batch_encode_plus``, which
  transformers 5 removed; its optimum engine needs optimum, whose ONNX Runtime part
  imports what transformers 5 removed too), so it runs from an environment of its own,
  ``.venv-infinity``, that ``make bench-peers`` creates with the same CPU torch.

Both load all-MiniLM-L6-v2 from the local folder (no hub here, ``HF_HUB_OFFLINE=1``):
infinity's torch engine the Hugging Face folder itself; fastembed and infinity's optimum
engine an fp32 ONNX export of it with ``last_hidden_state`` as output, as the hub's ONNX
copies of this model are (``export_plain_onnx``), which they pool themselves. infergate
serves the version its registration chose (int8 by default): the report says both.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from infergate.bench.baselines import _ChildScenario
from infergate.bench.options import PEER_NAMES
from infergate.bench.prepare import run_step
from infergate.bench.scenarios import HOST, START_TIMEOUT_S
from infergate.bench.task_models import TaskModel
from infergate.config import PROJECT_ROOT
from infergate.stack.processes import free_ports, http_ok, spawn, wait_until

INFINITY_ENV_DIR = PROJECT_ROOT / ".venv-infinity"
SERVED_NAME = "embed"
PLAIN_ONNX_DIR = "minilm-onnx-fp32"
# Read by fastembed_server (uvicorn's workers take no arguments).
FASTEMBED_MODEL_ENV = "BENCH_FASTEMBED_MODEL_DIR"
FASTEMBED_THREADS_ENV = "BENCH_FASTEMBED_THREADS"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "config.json",
)


@dataclass(frozen=True)
class PeerRoute:
    """How a peer is asked for embeddings, as ``task_models.TaskCase`` says it for ours."""

    path: str
    openai: bool  # OpenAI's embeddings shape, else infergate's {"inputs"} / {"outputs"}

    def body(self, texts: Sequence[str]) -> bytes:
        if self.openai:
            return orjson.dumps({"model": SERVED_NAME, "input": list(texts)})
        return orjson.dumps({"inputs": list(texts)})

    def answers(self, answer: bytes) -> int:
        document = orjson.loads(answer)
        return len(document["data"] if self.openai else document["outputs"])


class Peer(_ChildScenario):
    """One peer under one setting."""

    setting: str
    case: PeerRoute
    precision = "fp32"  # what its model file holds (infergate serves what it registered)

    def __init__(self, model: TaskModel, workdir: Path) -> None:
        # Scenario wants the prepared sentiment model; a peer serves the embed model only.
        self.model = model
        self.workdir = workdir
        self.port = 0
        self.info: dict[str, Any] = {}
        self.triton_metrics_url = None

    def body(self, texts: Sequence[str]) -> bytes:
        return self.case.body(texts)


class FastembedPeer(Peer):
    name = "fastembed"
    path = "/embed"
    case = PeerRoute("/embed", openai=False)

    def __init__(self, model: TaskModel, workdir: Path, onnx_dir: Path, workers: int, threads: int):
        super().__init__(model, workdir)
        self.onnx_dir, self.workers, self.threads = onnx_dir, workers, threads
        self.setting = f"{workers} worker(s) x {threads} ONNX Runtime thread(s)"
        self.description = (
            f"fastembed {_version('fastembed')}: FastAPI + uvicorn, {self.setting}, fp32 ONNX"
        )

    def start(self) -> None:
        [self.port] = free_ports(1)
        command = [
            str(Path(sys.executable).with_name("uvicorn")),
            "infergate.bench.fastembed_server:app",
            f"--host={HOST}",
            f"--port={self.port}",
            f"--workers={self.workers}",
            "--no-access-log",
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", FASTEMBED_MODEL_ENV: str(self.onnx_dir),
               FASTEMBED_THREADS_ENV: str(self.threads)}  # fmt: skip
        self.child = spawn(self.name, command, self.workdir / "logs", env)
        log_path = self.child.log_path

        def all_workers_up() -> bool:
            return log_path.read_text().count("Application startup complete") >= self.workers

        wait_until(self.child, all_workers_up, START_TIMEOUT_S, "the fastembed server")


class InfinityPeer(Peer):
    name = "infinity"
    path = "/embeddings"
    case = PeerRoute("/embeddings", openai=True)

    def __init__(
        self, model: TaskModel, workdir: Path, model_dir: Path, engine: str, batch_size: int
    ):
        super().__init__(model, workdir)
        self.model_dir, self.engine, self.batch_size = model_dir, engine, batch_size
        self.setting = f"{engine} engine, batch size {batch_size}"
        self.description = f"infinity {_infinity_version()}: infinity_emb v2, {self.setting}"

    def start(self) -> None:
        [self.port] = free_ports(1)
        # Started in the model's folder, named ".": for a local folder infinity 0.0.78 hands
        # optimum the ONNX file's path as found under the folder's name, and optimum 2
        # looks for that path inside the folder ("Could not find any ONNX files with
        # target file name /.../model.onnx, only found: [model.onnx]").
        command = [
            "env",
            f"--chdir={self.model_dir}",
            str(INFINITY_ENV_DIR / "bin" / "infinity_emb"),
            "v2",
            "--model-id=.",
            f"--served-model-name={SERVED_NAME}",
            f"--engine={self.engine}",
            "--device=cpu",
            f"--batch-size={self.batch_size}",
            # all-MiniLM-L6-v2 is mean-pooled; said outright, as the ONNX folder lacks the
            # sentence-transformers files infinity otherwise reads it from.
            "--pooling-method=mean",
            f"--host={HOST}",
            f"--port={self.port}",
            "--log-level=warning",  # no line per request, as the naive server's uvicorn
        ]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            # Its optimum engine writes the optimised graph under the hub cache.
            "HF_HOME": str(self.workdir / "hf-home"),
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1",
        }
        env.pop("PYTHONPATH", None)  # its own environment's packages only
        self.child = spawn(self.name, command, self.workdir / "logs", env)
        url = f"http://{HOST}:{self.port}/health"
        wait_until(self.child, lambda: http_ok(url, timeout_s=5), START_TIMEOUT_S, "infinity")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def _infinity_version() -> str:
    found = sorted((INFINITY_ENV_DIR / "lib").glob("python*/site-packages/infinity_emb-*"))
    return found[-1].name.removesuffix(".dist-info").split("-")[1] if found else "?"


def make_peer(name: str, model: TaskModel, workdir: Path) -> list[Peer]:
    """The settings ``name`` is tried with; FileNotFoundError when it is not installed."""
    from infergate.registration.demo import minilm_dir

    cores = os.cpu_count() or 1
    onnx_dir = export_plain_onnx(minilm_dir(), model.served_dir.parent.parent / PLAIN_ONNX_DIR)
    if name == "fastembed":
        if _version("fastembed") == "?":
            raise FileNotFoundError("fastembed is not installed (`make bench-peers`)")
        return [
            FastembedPeer(model, workdir, onnx_dir, workers=cores, threads=1),
            FastembedPeer(model, workdir, onnx_dir, workers=1, threads=cores),
        ]
    if name == "infinity":
        if not (INFINITY_ENV_DIR / "bin" / "infinity_emb").exists():
            raise FileNotFoundError(
                f"{INFINITY_ENV_DIR}/bin/infinity_emb is missing (`make bench-peers`)"
            )
        return [
            InfinityPeer(model, workdir, minilm_dir(), "torch", 16),
            InfinityPeer(model, workdir, minilm_dir(), "torch", 64),
            InfinityPeer(model, workdir, onnx_dir, "optimum", 64),
        ]
    raise ValueError(f"unknown peer {name!r}; choose from {PEER_NAMES}")


def export_plain_onnx(hf_dir: Path, out_dir: Path) -> Path:
    """``hf_dir``'s encoder as fp32 ONNX (``last_hidden_state`` out) with its tokenizer and
    config in ``out_dir``, made once (in a child process: it imports torch)."""
    if (out_dir / "model.onnx").exists():
        return out_dir
    work = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    code = (
        "import sys; from pathlib import Path; "
        "from infergate.bench.peers import _export; _export(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run_step([sys.executable, "-c", code, str(hf_dir), str(work)], env, "exporting to ONNX")
    shutil.rmtree(out_dir, ignore_errors=True)
    work.rename(out_dir)
    return out_dir


def _export(hf_dir: Path, out_dir: Path) -> None:
    import torch
    import transformers

    out_dir.mkdir(parents=True)
    model = transformers.AutoModel.from_pretrained(hf_dir).eval()

    class Encoder(torch.nn.Module):  # keyword arguments, as transformers 5 wants them
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    ids = torch.ones((2, 8), dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    torch.onnx.export(
        Encoder(), (ids, ids, torch.zeros_like(ids)), str(out_dir / "model.onnx"),
        input_names=names, output_names=["last_hidden_state"],
        dynamic_axes={**axes, "last_hidden_state": {0: "batch", 1: "sequence"}},
        opset_version=17, dynamo=False,
    )  # fmt: skip
    for name in TOKENIZER_FILES:
        if (hf_dir / name).exists():
            shutil.copy(hf_dir / name, out_dir / name)

"""A registered-like version served by a front-end in process: the tiny model exported as
registration does, its ONNX file run by ``OnnxBackend`` in place of Triton."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from starlette.testclient import TestClient

from fakes import asgi
from infergate.config import FrontendSettings
from infergate.observe.monitor import Monitors
from infergate.observe.telemetry import NullTelemetry
from infergate.protocols.frontend import Frontend
from infergate.registration import onnx_export
from infergate.registration.reference_texts import read_inputs, reference_queries, run_reference
from infergate.serving.routing import ServedModel
from infergate.serving.runtime import ModelRuntime
from infergate.serving.tokenization import TextTokenizer
from infergate.versions import ServedVersion, Spec
from onnx_backend import OnnxBackend

REFERENCE_TEXTS = Path(__file__).resolve().parents[1] / "registry" / "demo" / "sentiment.tsv"


@dataclass
class Local:
    built: onnx_export.BuildResult
    runtime: ModelRuntime
    frontend: Frontend
    client: TestClient
    backend: OnnxBackend
    reference: dict


def serve_locally(source: Path, task: str, out: Path, name: str = "m") -> Local:
    built = onnx_export.build(source, task, "fp32", out, progress=False)
    tokenizer = TextTokenizer.from_dir(built.tokenizer_dir, built.max_length)
    texts, queries = read_inputs(REFERENCE_TEXTS)
    texts = texts[:100]
    if task == "text-ranking":
        queries = reference_queries(texts, None)
    reference = run_reference(
        built.onnx_path, tokenizer, task, built.output_name, built.labels, texts, False,
        queries if task == "text-ranking" else None,
    )  # fmt: skip
    spec = Spec(task, built.labels, built.output_name, built.output_dim, built.max_length)
    runtime = ModelRuntime(ServedVersion(name, "1", task, "src"), spec, tokenizer, reference)
    backend = OnnxBackend(built.onnx_path)
    models = {name: ServedModel(name, task, (runtime,))}
    frontend = Frontend(FrontendSettings(), backend, models, monitors=Monitors(NullTelemetry()))
    return Local(built, runtime, frontend, TestClient(asgi(frontend)), backend, reference)

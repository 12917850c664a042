"""fastembed behind the naive baseline's harness: FastAPI under ``uvicorn --workers N``, a
synchronous endpoint (run in FastAPI's thread pool) that embeds the request's texts with
``fastembed.TextEmbedding`` and answers them, as a user serving fastembed would write it.

fastembed downloads its models from the Hugging Face hub; no hub is reachable here, so
the model is loaded from a local folder with its ``specific_model_path`` option, under
the name of the catalogue entry it stands for (``sentence-transformers/all-MiniLM-L6-v2``,
whose hub files are an fp32 ONNX export with ``last_hidden_state`` as output, mean-pooled
and normalised by fastembed). ONNX Runtime threads per worker come from the environment
(``THREADS_ENV``): uvicorn's workers import the app by name and take no arguments.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI
from fastembed import TextEmbedding
from pydantic import BaseModel

MODEL_ENV = "BENCH_FASTEMBED_MODEL_DIR"
THREADS_ENV = "BENCH_FASTEMBED_THREADS"
CATALOGUE_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class EmbedRequest(BaseModel):
    inputs: str | list[str]


app = FastAPI(title="fastembed")
_model = TextEmbedding(
    CATALOGUE_NAME,
    specific_model_path=os.environ[MODEL_ENV],
    threads=int(os.environ.get(THREADS_ENV) or 0) or None,
    # The CPU provider, as with the onnxruntime package fastembed asks for: the
    # onnxruntime-gpu build here would first try CUDA, which this machine lacks.
    providers=["CPUExecutionProvider"],
    local_files_only=True,
)


@app.post("/embed")
def embed(request: EmbedRequest) -> dict[str, Any]:
    """Embed this request's texts in one batch."""
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    vectors = _model.embed(texts, batch_size=len(texts))
    return {"outputs": [vector.tolist() for vector in vectors]}


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}

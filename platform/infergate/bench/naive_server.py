"""The naive baseline: FastAPI + transformers + PyTorch fp32, one forward per request.

What a first deployment usually looks like: the Hugging Face folder loaded with the Auto
classes, a synchronous endpoint (FastAPI runs it in its thread pool) that tokenizes and
runs the model on each request as it comes, and ``uvicorn --workers <cores>``. No ONNX, no
batching across requests. Request and answer shapes are infergate's (``{"inputs": ...}``
in, ``{"outputs": [{"label", "score"}]}`` out).

Given its best honest setting: PyTorch threads per worker set so that the workers share
the cores rather than oversubscribe them (``THREADS_ENV``, one per worker on one worker
per core; PyTorch's default, a thread per core in every worker, fell as concurrency rose),
and, with ``INT8_ENV`` set, PyTorch's own dynamic int8 quantisation of the Linear layers,
what a user quantising without ONNX reaches for (seed 002's baseline quantises).

Started by the harness as ``uvicorn infergate.bench.naive_server:app --workers N``; the
model folder and settings come from the environment because uvicorn's workers import the
app by name and take no arguments.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModelForSequenceClassification, AutoTokenizer

# Set by infergate.bench.baselines.NaiveServer. Not INFERGATE_*: load_config() would read
# that prefix as a config override and reject the unknown field.
MODEL_ENV = "BENCH_NAIVE_MODEL_DIR"
THREADS_ENV = "BENCH_NAIVE_THREADS"
INT8_ENV = "BENCH_NAIVE_INT8"
MAX_LENGTH = 512


class PredictRequest(BaseModel):
    inputs: str | list[str]


def _load(folder: str) -> tuple[Any, Any]:
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        folder, local_files_only=True, dtype=torch.float32
    ).eval()
    if os.environ.get(INT8_ENV):
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return tokenizer, model


if os.environ.get(THREADS_ENV):
    torch.set_num_threads(int(os.environ[THREADS_ENV]))
app = FastAPI(title="naive baseline")
_tokenizer, _model = _load(os.environ[MODEL_ENV])
_labels = [_model.config.id2label[i] for i in range(_model.config.num_labels)]


@app.post("/v1/models/{name}/predict")
def predict(name: str, request: PredictRequest) -> dict[str, Any]:
    """Tokenize and run the model on this request's texts alone."""
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    encoded = _tokenizer(
        texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
    )
    with torch.no_grad():
        probabilities = _model(**encoded).logits.softmax(dim=-1)
    best = probabilities.argmax(dim=-1).tolist()
    scores = probabilities.max(dim=-1).values.tolist()
    outputs = [{"label": _labels[i], "score": score} for i, score in zip(best, scores, strict=True)]
    return {"model": name, "outputs": outputs}


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}

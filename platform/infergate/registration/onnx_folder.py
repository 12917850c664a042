"""Registration from an ONNX file: a graph the user exported (or downloaded) themselves.

A Hugging Face folder without PyTorch weights but with an ONNX file (``model.onnx``, or
one file under ``onnx/`` as Optimum and transformers.js lay them out), or any folder with
``--onnx FILE``, holds what serving needs besides the graph: the tokenizer files and,
for classifiers, ``config.json``'s ``id2label``. ``build`` then does what
``onnx_export.build`` does after its export:

1. checks the graph against the task's contract and adapts its plumbing
   (``infergate.registration.graph_contract``);
2. runs ONNX Runtime's transformer fusions when ``config.json`` names an architecture
   they know (``hf_folder.SUPPORTED_ARCHITECTURES``), else serves the graph unfused;
3. keeps the fastest setting of ``--precision`` whose quality meets the budget
   (``infergate.registration.quantise``), measured against the user's file;
4. checks parity against the user's file.

A graph that came quantised (ONNX Runtime's 4-bit ``MatMulNBits``, int8, QDQ) is not
quantised again: at ``--precision int8`` it is served ``as-given`` (fused only), and
``fp16``/``fp32`` are refused, since its weights cannot get back what they lost.

The original is the user's file as it is, run by ONNX Runtime with ``token_type_ids``
fed and the task's head applied in numpy: no PyTorch model exists. So the quality and
parity figures say how much the optimised graph departs from the file given, not from a
model the file was made from (a graph quantised before it came has lost what it lost).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from infergate import tasks
from infergate.errors import RegistrationError
from infergate.registration import graph_contract, quantise
from infergate.registration.hf_folder import (
    SUPPORTED_ARCHITECTURES,
    first_line,
    labels_of,
    load_tokenizer,
    max_length_of,
    transformers_quiet,
)
from infergate.registration.onnx_export import (
    _EXPORT_QUERY,
    PRECISIONS,
    QUALITY_TEXTS,
    BuildResult,
    Sample,
    default_samples,
    encoder,
    save_served,
)
from infergate.registration.parity import Runner, batched_outputs, check_parity, onnx_runner
from infergate.registration.quality import Budget
from infergate.registration.steps import Steps
from infergate.tasks import heads

log = logging.getLogger(__name__)

# Files that mean a folder holds PyTorch (or other framework) weights to export from.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")  # fmt: skip
UNKNOWN_MODEL_TYPE = "onnx"  # the spec's model_type when config.json names none


def onnx_file_of(folder: Path, onnx_file: str | None = None) -> Path | None:
    """The ONNX file to register from ``folder``: ``onnx_file`` when given (relative to
    ``folder`` or absolute); else, for a folder without PyTorch weights, its
    ``model.onnx`` or the one ``.onnx`` file under ``onnx/``; else None (export from
    PyTorch). Raises :class:`RegistrationError` when several files could be meant."""
    if onnx_file is not None:
        path = Path(onnx_file).expanduser()
        path = path if path.is_absolute() or path.is_file() else folder / path
        if not path.is_file():
            raise RegistrationError(f"ONNX file {onnx_file} does not exist")
        return path
    if not folder.is_dir() or any((folder / name).is_file() for name in WEIGHT_FILES):
        return None
    if (folder / "model.onnx").is_file():
        return folder / "model.onnx"
    found = sorted(folder.glob("onnx/*.onnx"))
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        names = ", ".join(str(path.relative_to(folder)) for path in found)
        raise RegistrationError(
            f"{folder} holds several ONNX files ({names}); choose one with --onnx FILE"
        )
    return None


def read_config(folder: Path) -> Any:
    """``config.json`` as attributes (labels, positions, architecture), or an empty one:
    an ONNX file needs no transformers class, so its config is read as JSON."""
    path = folder / "config.json"
    if not path.is_file():
        return SimpleNamespace()
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (ValueError, OSError) as exc:
        raise RegistrationError(f"cannot read {path}: {first_line(exc)}") from None
    return SimpleNamespace(**data)


def max_length(config: Any, tokenizer: Any, model_type: str, requested: int | None) -> int:
    """As ``hf_folder.max_length_of`` when config.json gives the positions; else the
    tokenizer's limit, or ``--max-length``."""
    if getattr(config, "max_position_embeddings", None):
        return max_length_of(config, tokenizer, model_type, requested)
    if requested is not None:
        if requested < 2:
            raise RegistrationError(f"max_length {requested} is out of range: use 2 or more")
        return requested
    limit = int(tokenizer.model_max_length)
    if limit > 1_000_000:  # the "no limit" sentinel
        raise RegistrationError(
            "neither config.json (max_position_embeddings) nor the tokenizer says how many "
            "tokens the model takes; pass --max-length"
        )
    return limit


def reference_runner(path: Path, fitted: graph_contract.GraphFit, sep_id: int | None) -> Runner:
    """Run the user's file as it is: token types fed, the chosen output read, the head
    the contract adds computed in numpy (``infergate.tasks.heads``)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    dtypes = {name: (np.int32 if elem == onnx.TensorProto.INT32 else np.int64)
              for name, elem in fitted.input_types.items()}  # fmt: skip

    def run(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if fitted.token_types:
            feeds[graph_contract.TOKEN_TYPES] = heads.token_types(input_ids, sep_id)
        feeds = {name: value.astype(dtypes[name]) for name, value in feeds.items()}
        (out,) = session.run([fitted.output], feeds)
        return heads.apply(fitted.head, np.asarray(out, dtype=np.float32), attention_mask)

    return run


def _segment_sep(tokenizer: Any, task: str, fitted: graph_contract.GraphFit) -> int | None:
    """The separator a pair's second segment starts after, for a graph of (query, text)
    pairs that reads token_type_ids; checked against the tokenizer's own type ids."""
    if not tasks.get(task).pairs or not fitted.token_types:
        return None
    from infergate.registration.onnx_export import segment_rule

    return segment_rule(tokenizer, SimpleNamespace(type_vocab_size=2))


def build(
    folder: Path,
    onnx_path: Path,
    task: str,
    precision: str,
    out_dir: Path,
    *,
    max_length_tokens: int | None = None,
    quality_texts: Sequence[Sample] | None = None,
    budget: Budget | None = None,
    progress: bool = True,
) -> BuildResult:
    """Check, adapt, optimise and convert the graph at ``onnx_path`` for ``task`` at
    ``precision``, the tokenizer and labels from ``folder``; write ``out_dir/model.onnx``
    and ``out_dir/tokenizer/``. Raises :class:`RegistrationError` with one line for a
    graph that does not fit, a missing tokenizer or labels, a budget no setting meets or
    parity over tolerance; nothing is written to ``out_dir`` then."""
    folder, onnx_path, out_dir = Path(folder), Path(onnx_path), Path(out_dir)
    if precision not in PRECISIONS:
        raise RegistrationError(
            f"precision {precision!r} is not supported; use one of {list(PRECISIONS)}"
        )
    served = tasks.get(task)
    output_name = served.output_name
    texts = default_samples(task)
    measured = list(texts if quality_texts is None else quality_texts)[:QUALITY_TEXTS]
    if not measured:
        raise RegistrationError("quality_texts is empty; the quality check needs at least one")
    budget = Budget.default(output_name) if budget is None else budget
    names = ("load", "check", "optimise", precision, "parity", "save")
    steps = Steps(onnx_path.name, names, progress)

    with steps, tempfile.TemporaryDirectory(prefix="infergate-onnx-") as tmp:
        work = Path(tmp)
        with steps("load"), transformers_quiet(not progress):
            config = read_config(folder)
            model_type = str(getattr(config, "model_type", None) or UNKNOWN_MODEL_TYPE)
            vocab_size = int(getattr(config, "vocab_size", None) or sys.maxsize)
            tokenizer = load_tokenizer(folder, vocab_size)
            labels: list[str] = []
            if served.needs_labels:
                if not hasattr(config, "id2label"):
                    raise RegistrationError(
                        f"a {task} model names its outputs in config.json's id2label; "
                        f"{folder} has {'no id2label' if vars(config) else 'no config.json'}"
                    )
                labels = labels_of(config)
            tokens = max_length(config, tokenizer, model_type, max_length_tokens)
            try:
                original = onnx.load(str(onnx_path))
            except Exception as exc:  # protobuf's DecodeError, missing external data...
                raise RegistrationError(
                    f"cannot read {onnx_path} as ONNX: {first_line(exc)}"
                ) from None
        encode = encoder(tokenizer, tokens)
        with steps("check"):
            fitted = graph_contract.fit(original, task, served.head, served.per_token)
            sep_id = _segment_sep(tokenizer, task, fitted)
            adapted = graph_contract.adapt(original, fitted, output_name, sep_id)
            onnx.save(adapted, str(work / "adapted.onnx"))
            log.info("adapted %s: %s", onnx_path, adapted.doc_string or "no changes")
            reference = reference_runner(onnx_path, fitted, sep_id)
            try:
                probe_feeds = encode(_probe_samples(task))
                probe = reference(probe_feeds["input_ids"], probe_feeds["attention_mask"])
            except Exception as exc:  # ORT's own exception types
                raise RegistrationError(
                    f"running {onnx_path} in ONNX Runtime failed: {first_line(exc)}"
                ) from None
            output_dim = _check_output(probe, encode(_probe_samples(task)), served, labels)
            quantised = graph_contract.quantised_ops(original)
            if quantised and precision != "int8":
                raise RegistrationError(
                    f"{onnx_path.name} is already quantised ({', '.join(quantised)}); it "
                    f"cannot be served at {precision}: register the float graph, or use "
                    "--precision int8 to serve it with its own quantisation"
                )
        with steps("optimise"):
            optimised = _optimise(work, config, model_type)
        with steps(precision):
            original_outputs = batched_outputs(reference, encode, measured)
            final, quality = quantise.choose(
                precision,
                optimised,
                work,
                outputs=lambda path: batched_outputs(onnx_runner(path), encode, measured),
                original=original_outputs,
                output_name=output_name,
                budget=budget,
                on_attempt=steps.describe,
                n_texts=len(measured),
                settings=(quantise.AS_GIVEN,) if quantised else None,
            )
            log.info("quality %s", quality.summary())
        served_precision = quantise.precision_of(quality.setting)
        with steps("parity"):
            try:
                parity = check_parity(
                    reference, onnx_runner(final), encode, output_name=output_name,
                    precision=served_precision, texts=texts, progress=progress,
                )  # fmt: skip
            except Exception as exc:  # ORT's own exception types, or outputs' shapes
                raise RegistrationError(
                    f"running the {served_precision} ONNX model for the parity check failed: "
                    f"{first_line(exc)}"
                ) from None
            if not parity.passed:
                raise RegistrationError(
                    f"ONNX parity check failed ({served_precision}): {parity.summary()}"
                )
        with steps("save"):
            tokenizer_dir, served_path = save_served(
                tokenizer, tokens, final, work, out_dir, folder, progress
            )

    times = steps.summary()
    log.info("built %s (%s, %s): %s; %s", onnx_path, task, precision, parity.summary(), times)
    return BuildResult(
        onnx_path=served_path,
        output_name=output_name,
        output_dim=output_dim,
        labels=labels,
        max_length=tokens,
        precision=served_precision,
        parity=parity,
        tokenizer_dir=tokenizer_dir,
        model_type=model_type,
        quality=quality,
    )


def _probe_samples(task: str) -> list[Sample]:
    """Two inputs of different lengths, so the probe batch has padding."""
    if tasks.get(task).pairs:
        return [(_EXPORT_QUERY, "a short text"), (_EXPORT_QUERY, "a somewhat longer text here")]
    return ["a short text", "a somewhat longer text, so that this batch needs padding"]


def _check_output(
    out: np.ndarray, feeds: dict[str, np.ndarray], served: tasks.Task, labels: list[str]
) -> int:
    """The graph's output on a real batch has the task's shape; its last axis."""
    batch, sequence = feeds["input_ids"].shape
    expected = (batch, sequence) if served.per_token else (batch,)
    if out.shape[:-1] != expected or out.ndim != len(expected) + 1:
        axes = "[batch, sequence, labels]" if served.per_token else "[batch, n]"
        raise RegistrationError(
            f"on a batch of {batch} texts of {sequence} tokens the graph's output has shape "
            f"{list(out.shape)}; a {served.name} model outputs {axes}"
        )
    dim = int(out.shape[-1])
    if labels and dim != len(labels):
        raise RegistrationError(f"the graph has {dim} outputs but id2label names {len(labels)}")
    problem = served.output_dim_problem(dim)
    if problem:
        raise RegistrationError(f"{problem}; this graph has {dim}")
    return dim


def _optimise(work: Path, config: Any, model_type: str) -> Any:
    """ONNX Runtime's fusions for an architecture they know (as ``onnx_export``), else
    the adapted graph as it is; saved as ``optimised.onnx``, returned as an OnnxModel."""
    from onnxruntime.transformers.onnx_model import OnnxModel
    from onnxruntime.transformers.optimizer import optimize_model

    adapted = work / "adapted.onnx"
    if model_type in SUPPORTED_ARCHITECTURES:
        try:
            optimised = optimize_model(
                str(adapted),
                model_type=SUPPORTED_ARCHITECTURES[model_type],
                num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
                hidden_size=int(getattr(config, "hidden_size", 0) or 0),
            )
            optimised.save_model_to_file(str(work / "optimised.onnx"))
        except Exception as exc:
            raise RegistrationError(
                f"ONNX Runtime optimisation failed: {first_line(exc)}"
            ) from None
        fused = {op: n for op, n in optimised.get_fused_operator_statistics().items() if n}
        log.info("ONNX Runtime optimiser fused %s", fused or "nothing")
        return optimised
    log.info("architecture %r: the graph is served without ONNX Runtime's fusions", model_type)
    model = OnnxModel(onnx.load(str(adapted)))
    model.save_model_to_file(str(work / "optimised.onnx"))
    return model

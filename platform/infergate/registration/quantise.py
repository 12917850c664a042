"""The settings a graph can be served at, and the search for the fastest that meets the
quality budget (``infergate.registration.quality``).

``--precision int8`` tries, fastest first:

- ``int8-dynamic``: ONNX Runtime's dynamic quantisation, int8 weights per output channel,
  activations quantised per call with one scale for the whole input, every MatMul and
  fused Attention. That scale would make a text's result depend on the texts (and the
  padding) batched with it, so the served graph is marked (:func:`save_served_graph`)
  and Triton's model runs each of its texts alone, on its own tokens.
- ``int8-blockwise``: ONNX Runtime's ``MatMulNBits`` at 8 bits: int8 weights in blocks of
  128 along the input dimension, and with ``accuracy_level`` 4 activations quantised to
  int8 per row and block at run time, so an outlier costs only its own block. The fused
  Attention's projections stay float.
- ``fp32``: the optimised graph as it is, where no int8 setting meets the budget.

``fp16`` and ``fp32`` are one setting each; their quality is measured and must meet the
budget too. A graph registered from an ONNX file that came quantised (``infergate.
onnx_folder``) has one setting, ``as-given``: its own quantisation, fused but not
quantised again (ONNX Runtime's quantisers leave quantised weights as they are).

Measured on all-MiniLM-L6-v2 (2 cores, 300 texts of ``registry/demo/sentiment.tsv`` each
alone, against the fp32 graph; throughput at batch 32 with one thread, alternated in one
run, relative to ``int8-dynamic``):

==================  ===========  =====  ============  =========  ==========
setting             cosine mean  worst  nn agreement  recall@10  throughput
==================  ===========  =====  ============  =========  ==========
int8-dynamic        0.9918       0.972  0.897         0.913      1
int8-blockwise      0.9994       0.998  0.980         0.977      0.57
fp32                1            1      1             1          0.46
==================  ===========  =====  ============  =========  ==========

Also tried, none better on both counts: any one MatMul or Attention kept in fp32 under
dynamic int8 (at most +0.0015 mean cosine, the error is spread over all of them); the
feed-forward output projections in fp32 (0.9952 and nn 0.910 at 0.70; layers 0-2 only:
0.9948, 0.907 at 0.85); blocks of 32 (0.9998, 0.993 at 0.50); blockwise MatMuls with
dynamic Attention (0.9983, 0.960 at 0.59); static QDQ calibrated by min-max on 100 other
texts (0.9995, 0.967 at 0.47: ONNX Runtime runs its weights blockwise and its
activations in float); 4-bit blocks (0.9751 at 0.46).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

from infergate.errors import RegistrationError
from infergate.registration.hf_folder import first_line
from infergate.registration.quality import Attempt, Budget, QualityReport, measure

SETTINGS: dict[str, tuple[str, ...]] = {
    "int8": ("int8-dynamic", "int8-blockwise", "fp32"),
    "fp16": ("fp16",),
    "fp32": ("fp32",),
}
AS_GIVEN = "as-given"  # an already-quantised graph, served with its own quantisation
# Operators that quantise activations with a scale taken from the whole call's input.
PER_CALL_SCALE_OPS = frozenset(
    {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"}
)
# Metadata of a served graph with such operators; ``infergate/triton/backend_model.py``
# reads it (under the same name: it cannot import this module) and runs rows alone.
ROWS_ALONE_KEY = "infergate.rows_alone"
BLOCK_SIZE = 128
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations, int8 compute


def precision_of(setting: str) -> str:
    """``int8``, ``fp16`` or ``fp32``: what the parity tolerances and the spec go by.
    A graph quantised before it came counts as int8, whatever its bits."""
    return "int8" if setting == AS_GIVEN else setting.split("-")[0]


def choose(
    precision: str,
    optimised: Any,
    work: Path,
    *,
    outputs: Callable[[Path], np.ndarray],
    original: np.ndarray,
    output_name: str,
    budget: Budget,
    on_attempt: Callable[[str], None] = lambda setting: None,
    settings: tuple[str, ...] | None = None,
    n_texts: int | None = None,
) -> tuple[Path, QualityReport]:
    """The first of ``precision``'s settings (or of ``settings``) whose ``outputs`` (the
    graph's on the quality texts) meet ``budget`` against ``original``, its file and the
    report. ``n_texts`` is how many texts ``original`` holds the outputs of (its rows
    are tokens for a per-token output); by default its rows.

    Raises:
        RegistrationError: a conversion failed, or no setting meets the budget.
    """
    attempts: list[Attempt] = []
    for setting in settings or SETTINGS[precision]:
        on_attempt(setting)
        path = convert(optimised, work, setting)
        try:
            figures = measure(output_name, original, outputs(path))
        except Exception as exc:  # ORT's own exception types, or outputs of the wrong shape
            raise RegistrationError(
                f"running the {setting} ONNX model for the quality check failed: {first_line(exc)}"
            ) from None
        attempts.append(Attempt(setting, figures, budget.misses(figures)))
        if not attempts[-1].misses:
            texts = len(original) if n_texts is None else n_texts
            return path, QualityReport(setting, budget.describe(), texts, attempts)
    tried = "; ".join(f"{a.setting}: {', '.join(a.misses)}" for a in attempts)
    raise RegistrationError(
        f"no {precision} setting meets the quality budget ({budget.describe()}): {tried}. "
        "Relax it with --quality-budget, or register at another --precision"
    )


def convert(optimised: Any, work: Path, setting: str) -> Path:
    """Write the optimised graph (an ONNX Runtime ``OnnxModel`` saved as
    ``work/optimised.onnx``) at ``setting``; return its path."""
    fp32 = work / "optimised.onnx"
    if setting in ("fp32", AS_GIVEN):
        return fp32
    out = work / f"{setting}.onnx"
    try:
        if setting == "fp16":
            # keep_io_types: clients keep sending int64 ids and reading float32 outputs.
            optimised.convert_float_to_float16(keep_io_types=True)
            optimised.save_model_to_file(str(out))
        elif setting == "int8-dynamic":
            with _without_log_message("Please consider to run pre-processing"), _quiet():
                quantize_dynamic(
                    fp32,
                    out,
                    per_channel=True,
                    weight_type=QuantType.QInt8,
                    # Needed on a fused BERT graph, whose contrib ops carry no type info.
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                )
        elif setting == "int8-blockwise":
            nbits = _matmul_nbits()
            config = nbits.DefaultWeightOnlyQuantConfig(
                block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=ACCURACY_LEVEL, bits=8
            )
            quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(fp32)), algo_config=config)
            with _quiet():
                quantizer.process()
            quantizer.model.save_model_to_file(str(out), use_external_data_format=False)
        else:
            raise ValueError(f"unknown setting {setting!r}")
    except Exception as exc:
        raise RegistrationError(f"{setting} conversion failed: {first_line(exc)}") from None
    return out


def save_served_graph(graph: Path, target: Path) -> bool:
    """Copy ``graph`` to ``target``, marked with ``ROWS_ALONE_KEY`` if its activations get
    one scale per call (``PER_CALL_SCALE_OPS``); whether it was marked."""
    model = onnx.load(str(graph), load_external_data=False)
    if not {node.op_type for node in model.graph.node} & PER_CALL_SCALE_OPS:
        shutil.copyfile(graph, target)
        return False
    model = onnx.load(str(graph))  # with any external data, to write one file
    kept = [p for p in model.metadata_props if p.key != ROWS_ALONE_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(
        [*kept, onnx.StringStringEntryProto(key=ROWS_ALONE_KEY, value="true")]
    )
    onnx.save(model, str(target))
    return True


def _matmul_nbits() -> Any:
    """ONNX Runtime's blockwise quantiser module. Importing it calls ``logging.basicConfig``
    at INFO, which would configure the root logger of whatever process imported it; what
    the root logger had is put back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        from onnxruntime.quantization import matmul_nbits_quantizer
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return matmul_nbits_quantizer


@contextlib.contextmanager
def _without_log_message(text: str) -> Iterator[None]:
    """ORT's quantiser logs the same advice on the root logger on every call; drop it."""

    def drop(record: logging.LogRecord) -> bool:
        return text not in record.getMessage()

    logging.getLogger().addFilter(drop)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(drop)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ONNX Runtime's quantisers log a line or two per MatMul at INFO on the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        root.setLevel(level)

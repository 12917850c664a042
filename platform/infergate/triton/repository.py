"""Triton's model repository on disk: one folder per served model version.

Layout written here (Triton's model-repository documentation,
https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_repository.md)::

    <repository>/<triton_name>/config.pbtxt
    <repository>/<triton_name>/1/model.py      # backend_model.py, copied
    <repository>/<triton_name>/1/model.onnx

The config is built as Triton's own ``ModelConfig`` protobuf (shipped in tritonclient) and
printed in text format, so a misspelt field fails here rather than at load time.
"""

from __future__ import annotations

import os
import re
import shutil
from importlib import resources
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from infergate.config import TritonSettings

INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAMES = ("embeddings", "logits")
MODEL_VERSION_DIR = "1"
ORT_THREADS_PARAMETER = "ort_intra_op_threads"
WARMUP_COUNT = 3
WARMUP_TOKENS = 16
# Token id 1 exists in every vocabulary; with a full mask it is an ordinary sentence.
WARMUP_DATA = {
    "input_ids": np.ones(WARMUP_TOKENS, dtype=np.int64),
    "attention_mask": np.ones(WARMUP_TOKENS, dtype=np.int64),
}

# Folder names that are safe on every filesystem and in URLs (/v2/models/<name>/infer).
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def _check_name(triton_name: str) -> None:
    # Also the guard against path traversal: the name becomes a folder of the repository.
    if not _NAME_PATTERN.match(triton_name) or ".." in triton_name:
        raise ValueError(
            f"{triton_name!r} is not a valid Triton model name; expected letters, digits, "
            "'_', '-' or '.'. Build names with triton_model_name()."
        )


def build_config(
    triton_name: str, *, output_name: str, output_dim: int, settings: TritonSettings
) -> mc.ModelConfig:
    """The ``ModelConfig`` of one served version (see the module docstring)."""
    _check_name(triton_name)
    if output_name not in OUTPUT_NAMES:
        raise ValueError(f"output_name is {output_name!r}; expected one of {OUTPUT_NAMES}.")
    if output_dim < 1:
        raise ValueError(f"output_dim is {output_dim}; expected a positive size.")
    kind = mc.ModelInstanceGroup.KIND_GPU if settings.gpu else mc.ModelInstanceGroup.KIND_CPU
    config = mc.ModelConfig(
        name=triton_name,
        backend="python",
        max_batch_size=settings.max_batch_size,
        input=[
            # dims exclude the batch dimension. allow_ragged_batch lets the dynamic batcher
            # put requests of different sequence lengths in one batch; the Python backend
            # hands them over one by one and model.py pads them. https://docs.nvidia.com/
            # deeplearning/triton-inference-server/user-guide/docs/ragged_batching.html
            mc.ModelInput(name=name, data_type=mc.TYPE_INT64, dims=[-1], allow_ragged_batch=True)
            for name in INPUT_NAMES
        ],
        output=[mc.ModelOutput(name=output_name, data_type=mc.TYPE_FP32, dims=[output_dim])],
        dynamic_batching=mc.ModelDynamicBatching(
            max_queue_delay_microseconds=settings.max_queue_delay_us
        ),
        instance_group=[mc.ModelInstanceGroup(count=settings.instance_count, kind=kind)],
    )
    config.parameters[ORT_THREADS_PARAMETER].string_value = str(settings.ort_intra_op_threads)
    # Triton runs these requests before it reports the model ready, so the first real
    # requests (and a canary's first latency figures) do not pay ONNX Runtime's cold start.
    config.model_warmup.append(
        mc.ModelWarmup(
            name="warmup",
            batch_size=1,
            count=WARMUP_COUNT,
            inputs={
                name: mc.ModelWarmup.Input(
                    data_type=mc.TYPE_INT64, dims=[WARMUP_TOKENS], input_data_file=name
                )
                for name in INPUT_NAMES
            },
        )
    )
    return config


def render_config(config: mc.ModelConfig) -> str:
    """``config`` in the protobuf text format Triton reads from ``config.pbtxt``."""
    return text_format.MessageToString(config)


def write_model(
    repository: Path,
    triton_name: str,
    onnx_path: Path,
    *,
    output_name: str,
    output_dim: int,
    settings: TritonSettings,
) -> Path:
    """Write one served version into the repository; returns its model folder.

    The ONNX file is hard-linked when it lives on the same filesystem, copied otherwise.
    Every file is written under a temporary name and renamed into place, so a concurrent
    Triton load never reads a half-written file. Overwrites an existing folder of that name.
    """
    config = build_config(
        triton_name, output_name=output_name, output_dim=output_dim, settings=settings
    )
    if not onnx_path.is_file():
        raise FileNotFoundError(f"No ONNX file at {onnx_path}.")
    model_dir = repository / triton_name
    version_dir = model_dir / MODEL_VERSION_DIR
    version_dir.mkdir(parents=True, exist_ok=True)

    backend_source = resources.files("infergate.triton").joinpath("backend_model.py")
    _write_atomically(version_dir / "model.py", backend_source.read_bytes())
    _place_file(onnx_path, version_dir / "model.onnx")
    (model_dir / "warmup").mkdir(exist_ok=True)
    for name, data in WARMUP_DATA.items():
        _write_atomically(model_dir / "warmup" / name, data.tobytes())
    # The config goes last: its presence is what makes the folder a loadable model.
    _write_atomically(model_dir / "config.pbtxt", render_config(config).encode())
    return model_dir


def remove_model(repository: Path, triton_name: str) -> None:
    """Delete a model folder from the repository (unload it from Triton first)."""
    _check_name(triton_name)
    shutil.rmtree(repository / triton_name, ignore_errors=True)


def _write_atomically(target: Path, data: bytes) -> None:
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, target)


def _place_file(source: Path, target: Path) -> None:
    # Already a link to the source. (rename() between two links of one file does nothing
    # and would leave the temporary link behind; man 2 rename.)
    if target.exists() and os.path.samefile(source, target):
        return
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(source, partial)
    except OSError:  # another filesystem, or links not allowed
        shutil.copyfile(source, partial)
    os.replace(partial, target)

"""One served version as Triton reads it: a model folder, on disk or sent with its load.

Layout (Triton's model-repository documentation,
https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_repository.md)::

    <triton_name>/config.pbtxt
    <triton_name>/1/model.onnx
    <triton_name>/1/model.py          # backend_model.py: the Python backend only
    <triton_name>/warmup/<input>      # the warm-up request's tensors

Two backends run the ONNX file: Triton's native ONNX Runtime backend (``onnxruntime``,
in NVIDIA's images; CUDA and optionally TensorRT on GPU instances), or a Python-backend
model that runs ONNX Runtime itself (``python``, the only backend of the nvidia-pytriton
wheel). ``model_files`` lists the folder's files; ``write_model`` puts them in a
repository folder, and ``ModelFiles.load_request`` turns them into the config and
``file:`` overrides of a load through Triton's repository API, for a Triton whose
repository the platform cannot write (https://github.com/triton-inference-server/server/
blob/main/docs/protocol/extension_model_repository.md).

The config is built as Triton's own ``ModelConfig`` protobuf (shipped in tritonclient), so
a misspelt field fails here rather than at load time.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from infergate.config import TritonSettings
from infergate.files import write_atomically
from infergate.tasks import CTRANSLATE2, ONNX, TASKS
from infergate.tasks.translation import DECODING_INPUT
from infergate.versions import CT2_DIR, ONNX_FILE

INPUT_NAMES = ("input_ids", "attention_mask")
# CTranslate2's output (translation's), int64 ids; the ONNX graphs' outputs are float32.
(TRANSLATION_OUTPUT,) = (task.output_name for task in TASKS.values() if task.engine == CTRANSLATE2)
OUTPUT_NAMES = tuple(task.output_name for task in TASKS.values() if task.engine == ONNX)
# Outputs with one row per token, [batch, sequence, n] (dims [-1, n]); the others are
# [batch, n].
PER_TOKEN_OUTPUTS = tuple(task.output_name for task in TASKS.values() if task.per_token)
MODEL_VERSION_DIR = "1"
ORT_THREADS_PARAMETER = "ort_intra_op_threads"  # read by backend_model.py
# Parameters of Triton's ONNX Runtime backend (onnxruntime_backend's README).
NATIVE_ORT_THREADS_PARAMETER = "intra_op_thread_count"
TENSORRT_WORKSPACE_BYTES = 1 << 30
WARMUP_COUNT = 3
WARMUP_TOKENS = 16
# Token id 1 exists in every vocabulary; with a full mask it is an ordinary sentence.
WARMUP_DATA = {
    "input_ids": np.ones(WARMUP_TOKENS, dtype=np.int64),
    "attention_mask": np.ones(WARMUP_TOKENS, dtype=np.int64),
}
WARMUP_DECODING = np.array([1, 4], dtype=np.int64)  # greedy, 4 tokens

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
    """The ``ModelConfig`` of one served version, for ``settings.backend`` (``python`` or
    ``onnxruntime``; ``auto`` is resolved against the server before this)."""
    _check_name(triton_name)
    if output_name not in OUTPUT_NAMES:
        raise ValueError(f"output_name is {output_name!r}; expected one of {OUTPUT_NAMES}.")
    if output_dim < 1:
        raise ValueError(f"output_dim is {output_dim}; expected a positive size.")
    if settings.backend not in ("python", "onnxruntime"):
        raise ValueError(f"backend {settings.backend!r} must be resolved to python or onnxruntime")
    native = settings.backend == "onnxruntime"
    dims = [-1, output_dim] if output_name in PER_TOKEN_OUTPUTS else [output_dim]
    kind = mc.ModelInstanceGroup.KIND_GPU if settings.gpu else mc.ModelInstanceGroup.KIND_CPU
    config = mc.ModelConfig(
        name=triton_name,
        max_batch_size=settings.max_batch_size,
        input=[
            # dims exclude the batch dimension. In the Python backend, allow_ragged_batch
            # lets the dynamic batcher put requests of different sequence lengths in one
            # batch, handed over one by one for model.py to pad. https://docs.nvidia.com/
            # deeplearning/triton-inference-server/user-guide/docs/ragged_batching.html
            # The native backend takes one tensor per input: it batches equal lengths.
            mc.ModelInput(
                name=name, data_type=mc.TYPE_INT64, dims=[-1], allow_ragged_batch=not native
            )
            for name in INPUT_NAMES
        ],
        output=[mc.ModelOutput(name=output_name, data_type=mc.TYPE_FP32, dims=dims)],
        dynamic_batching=mc.ModelDynamicBatching(
            max_queue_delay_microseconds=settings.max_queue_delay_us
        ),
        instance_group=[mc.ModelInstanceGroup(count=settings.instance_count, kind=kind)],
    )
    threads = str(settings.ort_intra_op_threads)
    if native:
        config.platform = "onnxruntime_onnx"
        config.default_model_filename = ONNX_FILE
        config.parameters[NATIVE_ORT_THREADS_PARAMETER].string_value = threads
        if settings.gpu and settings.tensorrt:
            tensorrt = config.optimization.execution_accelerators.gpu_execution_accelerator.add()
            tensorrt.name = "tensorrt"
            tensorrt.parameters["precision_mode"] = "FP16"
            tensorrt.parameters["max_workspace_size_bytes"] = str(TENSORRT_WORKSPACE_BYTES)
    else:
        config.backend = "python"
        config.parameters[ORT_THREADS_PARAMETER].string_value = threads
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


def build_translation_config(
    triton_name: str, *, precision: str, max_decoding_length: int, settings: TritonSettings
) -> mc.ModelConfig:
    """The ``ModelConfig`` of a translation version: a Python-backend model running
    CTranslate2 (``translator_model.py``) whatever ``settings.backend`` says, since
    Triton's ONNX Runtime backend has nothing to run here."""
    _check_name(triton_name)
    kind = mc.ModelInstanceGroup.KIND_GPU if settings.gpu else mc.ModelInstanceGroup.KIND_CPU
    config = mc.ModelConfig(
        name=triton_name,
        backend="python",
        max_batch_size=settings.max_batch_size,
        input=[
            *(
                mc.ModelInput(
                    name=name, data_type=mc.TYPE_INT64, dims=[-1], allow_ragged_batch=True
                )
                for name in INPUT_NAMES
            ),
            # (beam size, maximum decoding length) per row
            mc.ModelInput(name=DECODING_INPUT, data_type=mc.TYPE_INT64, dims=[2]),
        ],
        output=[mc.ModelOutput(name=TRANSLATION_OUTPUT, data_type=mc.TYPE_INT64, dims=[-1])],
        dynamic_batching=mc.ModelDynamicBatching(
            max_queue_delay_microseconds=settings.max_queue_delay_us
        ),
        instance_group=[mc.ModelInstanceGroup(count=settings.instance_count, kind=kind)],
    )
    config.parameters["intra_threads"].string_value = str(settings.ort_intra_op_threads)
    config.parameters["precision"].string_value = precision
    # Requests asking for more are capped to it: the decoder has no positions past it.
    config.parameters["max_decoding_length"].string_value = str(max_decoding_length)
    config.model_warmup.append(
        mc.ModelWarmup(
            name="warmup",
            batch_size=1,
            count=WARMUP_COUNT,
            inputs={
                **{
                    name: mc.ModelWarmup.Input(
                        data_type=mc.TYPE_INT64, dims=[WARMUP_TOKENS], input_data_file=name
                    )
                    for name in INPUT_NAMES
                },
                DECODING_INPUT: mc.ModelWarmup.Input(
                    data_type=mc.TYPE_INT64, dims=[2], input_data_file=DECODING_INPUT
                ),
            },
        )
    )
    return config


def translation_files(
    triton_name: str,
    ct2_dir: Path,
    *,
    precision: str,
    max_decoding_length: int,
    settings: TritonSettings,
) -> ModelFiles:
    """The model folder of one translation version: the converted model's files under
    ``1/ctranslate2/`` and ``translator_model.py`` as ``1/model.py``."""
    config = build_translation_config(
        triton_name, precision=precision, max_decoding_length=max_decoding_length,
        settings=settings,
    )  # fmt: skip
    if not (ct2_dir / "model.bin").is_file():
        raise FileNotFoundError(f"No CTranslate2 model (model.bin) in {ct2_dir}.")
    files: dict[str, bytes | Path] = {
        f"{MODEL_VERSION_DIR}/{CT2_DIR}/{path.name}": path
        for path in sorted(ct2_dir.iterdir())
        if path.is_file()
    }
    source = resources.files("infergate.triton").joinpath("translator_model.py")
    files[f"{MODEL_VERSION_DIR}/model.py"] = source.read_bytes()
    for name, data in WARMUP_DATA.items():
        files[f"warmup/{name}"] = data.tobytes()
    files[f"warmup/{DECODING_INPUT}"] = WARMUP_DECODING.tobytes()
    return ModelFiles(triton_name, config, files)


def render_config(config: mc.ModelConfig) -> str:
    """``config`` in the protobuf text format Triton reads from ``config.pbtxt``."""
    return text_format.MessageToString(config)


@dataclass(frozen=True)
class ModelFiles:
    """One version's model folder: its config, and every other file by its path in the
    folder (contents, or a file on disk to link or copy)."""

    name: str
    config: mc.ModelConfig
    files: dict[str, bytes | Path]

    def load_request(self) -> tuple[str, dict[str, bytes]]:
        """The config as JSON and the files as ``file:<path>`` overrides: what a load
        through Triton's repository API carries when Triton cannot read our disk."""
        config = json_format.MessageToJson(self.config, preserving_proto_field_name=True)
        files = {
            f"file:{path}": data if isinstance(data, bytes) else data.read_bytes()
            for path, data in self.files.items()
        }
        return config, files


def model_files(
    triton_name: str,
    onnx_path: Path,
    *,
    output_name: str,
    output_dim: int,
    settings: TritonSettings,
) -> ModelFiles:
    """The model folder of one served version (see the module docstring)."""
    config = build_config(
        triton_name, output_name=output_name, output_dim=output_dim, settings=settings
    )
    if not onnx_path.is_file():
        raise FileNotFoundError(f"No ONNX file at {onnx_path}.")
    files: dict[str, bytes | Path] = {f"{MODEL_VERSION_DIR}/{ONNX_FILE}": onnx_path}
    if config.backend == "python":
        backend_source = resources.files("infergate.triton").joinpath("backend_model.py")
        files[f"{MODEL_VERSION_DIR}/model.py"] = backend_source.read_bytes()
    for name, data in WARMUP_DATA.items():
        files[f"warmup/{name}"] = data.tobytes()
    return ModelFiles(triton_name, config, files)


def write_model(
    repository: Path,
    triton_name: str,
    onnx_path: Path,
    *,
    output_name: str,
    output_dim: int,
    settings: TritonSettings,
) -> Path:
    """Write one served version into the repository; returns its model folder."""
    files = model_files(
        triton_name, onnx_path, output_name=output_name, output_dim=output_dim, settings=settings
    )
    return write_files(repository, files)


def write_files(repository: Path, model: ModelFiles) -> Path:
    """Put ``model``'s folder into ``repository``; returns the folder.

    An ONNX file is hard-linked when it lives on the same filesystem, copied otherwise.
    Every file is written under a temporary name and renamed into place, so a concurrent
    Triton load never reads a half-written file. Overwrites an existing folder of that name.
    """
    model_dir = repository / model.name
    for relative, data in model.files.items():
        target = model_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            write_atomically(target, data)
        else:
            _place_file(data, target)
    # The config goes last: its presence is what makes the folder a loadable model.
    write_atomically(model_dir / "config.pbtxt", render_config(model.config))
    return model_dir


def remove_model(repository: Path, triton_name: str) -> None:
    """Delete a model folder from the repository (unload it from Triton first)."""
    _check_name(triton_name)
    shutil.rmtree(repository / triton_name, ignore_errors=True)


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

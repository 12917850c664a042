"""The transformer-deploy layout: Triton alone, tokenizer and model chained in an ensemble.

Clients send text straight to Triton's KServe v2 HTTP endpoint; inside Triton an ensemble
runs a Python model that tokenizes (``ensemble_tokenize_model.py``), then the served
model. The model folder is written by the platform's own ``infergate.triton.repository``
(the same Python-backend ONNX Runtime model and dynamic-batching settings as the platform's
Triton), so the two layouts differ only in where tokenization runs and what sits in front.
Triton's ensemble scheduling:
https://github.com/triton-inference-server/server/blob/main/docs/user_guide/architecture.md#ensemble-models

Repository layout written here::

    <repository>/tokenize/config.pbtxt, 1/model.py, 1/tokenizer.json
    <repository>/<model>__v<N>/...            (infergate.triton.repository.write_model)
    <repository>/ensemble/config.pbtxt         (TEXT -> tokenize -> model -> logits)
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from infergate.config import TritonSettings
from infergate.triton.repository import INPUT_NAMES, render_config, write_model
from infergate.versions import triton_model_name

TOKENIZE_MODEL = "tokenize"
ENSEMBLE_MODEL = "ensemble"
TEXT_INPUT = "TEXT"


def tokenize_config(settings: TritonSettings, max_length: int) -> mc.ModelConfig:
    """The tokenizer model: ``TEXT`` ``[n, 1]`` strings to ``[n, sequence]`` ids and mask.

    No dynamic batching: as in transformer-deploy, each request is tokenized on its own.
    """
    config = mc.ModelConfig(
        name=TOKENIZE_MODEL,
        backend="python",
        max_batch_size=settings.max_batch_size,
        input=[mc.ModelInput(name=TEXT_INPUT, data_type=mc.TYPE_STRING, dims=[1])],
        output=[
            mc.ModelOutput(name=name, data_type=mc.TYPE_INT64, dims=[-1]) for name in INPUT_NAMES
        ],
        instance_group=[mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)],
    )
    config.parameters["max_length"].string_value = str(max_length)
    return config


def ensemble_config(
    settings: TritonSettings, model: str, output_name: str, output_dim: int
) -> mc.ModelConfig:
    """The ensemble: ``TEXT`` in, the model's output (``logits``) out."""
    step = mc.ModelEnsembling.Step
    return mc.ModelConfig(
        name=ENSEMBLE_MODEL,
        platform="ensemble",
        max_batch_size=settings.max_batch_size,
        input=[mc.ModelInput(name=TEXT_INPUT, data_type=mc.TYPE_STRING, dims=[1])],
        output=[mc.ModelOutput(name=output_name, data_type=mc.TYPE_FP32, dims=[output_dim])],
        ensemble_scheduling=mc.ModelEnsembling(
            step=[
                step(
                    model_name=TOKENIZE_MODEL,
                    model_version=-1,
                    input_map={TEXT_INPUT: TEXT_INPUT},
                    output_map={name: name for name in INPUT_NAMES},
                ),
                step(
                    model_name=model,
                    model_version=-1,
                    input_map={name: name for name in INPUT_NAMES},
                    output_map={output_name: output_name},
                ),
            ]
        ),
    )


def write_ensemble_repository(
    repository: Path,
    *,
    onnx_path: Path,
    tokenizer_dir: Path,
    spec: dict,
    settings: TritonSettings,
    model_name: str,
    version: str,
) -> list[str]:
    """Write the three models; returns their names in load order."""
    served = triton_model_name(model_name, version)
    output_name, output_dim = spec["output_name"], int(spec["output_dim"])
    write_model(
        repository,
        served,
        onnx_path,
        output_name=output_name,
        output_dim=output_dim,
        settings=settings,
    )
    tokenize_dir = repository / TOKENIZE_MODEL
    (tokenize_dir / "1").mkdir(parents=True, exist_ok=True)
    source = resources.files("infergate.bench").joinpath("ensemble_tokenize_model.py")
    (tokenize_dir / "1" / "model.py").write_bytes(source.read_bytes())
    shutil.copyfile(tokenizer_dir / "tokenizer.json", tokenize_dir / "1" / "tokenizer.json")
    config = tokenize_config(settings, int(spec["max_length"]))
    (tokenize_dir / "config.pbtxt").write_text(render_config(config))
    ensemble_dir = repository / ENSEMBLE_MODEL
    (ensemble_dir / "1").mkdir(parents=True, exist_ok=True)  # an ensemble needs a version folder
    config = ensemble_config(settings, served, output_name, output_dim)
    (ensemble_dir / "config.pbtxt").write_text(render_config(config))
    return [served, TOKENIZE_MODEL, ENSEMBLE_MODEL]

"""What every side of the platform says about a served model version.

Pure data: the control plane, the front-end replicas, registration and Triton's model
repository all name a version the same way (its roles, its artifact files, its Triton
model name, its serving spec), and none of this needs Ray, Triton or MLflow.

A registered version's artifacts live under one folder (``ARTIFACT_DIR``)::

    model.onnx            the optimised graph Triton serves
    ctranslate2/          translation: the CTranslate2 model Triton serves, instead
    tokenizer/            tokenizer.json and friends (front-end replicas load it)
    infergate.json        the serving spec: task, labels, output name and size, max length
    reference_stats.json  statistics of the reference texts (the drift baseline)
    parity_report.json    the optimised graph measured against the original model
    triton/config.pbtxt   the Triton model configuration it was registered with
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The registry aliases that say what is served.
CHAMPION = "champion"
CANARY = "canary"

ARTIFACT_DIR = "model"
ONNX_FILE = "model.onnx"
CT2_DIR = "ctranslate2"  # translation: the CTranslate2 model, in place of model.onnx
TOKENIZER_DIR = "tokenizer"
SPEC_FILE = "infergate.json"
REFERENCE_FILE = "reference_stats.json"
PARITY_FILE = "parity_report.json"
QUALITY_FILE = "quality_report.json"

_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Shadow:
    """A canary in its shadow stage: the share of its champion's requests mirrored to it
    (its answers reach no client), and when one of its answers counts as slower than the
    champion's to the same request: more than ``latency_ratio`` times, and by more than
    ``latency_margin_ms``."""

    share: float
    latency_ratio: float = 1.5
    latency_margin_ms: float = 5.0

    def slower(self, canary_s: float, champion_s: float) -> bool:
        return (
            canary_s > champion_s * self.latency_ratio
            and (canary_s - champion_s) * 1e3 > self.latency_margin_ms
        )


@dataclass(frozen=True)
class ServedVersion:
    """One model version the platform serves, with its place in the traffic split."""

    name: str
    version: str
    task: str
    source: str  # artifact URI of the version's ``model/`` folder
    role: str = CHAMPION
    weight: int = 100
    # Registered again from other files and being reloaded under its Triton name: replicas
    # drop what they loaded of it and route nothing to it until a table without the mark.
    reloading: bool = False
    shadow: Shadow | None = None  # a canary in shadow: weight 0, mirrored requests

    @property
    def triton_model(self) -> str:
        return triton_model_name(self.name, self.version)

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "task": self.task,
            "source": self.source,
            "role": self.role,
            "weight": self.weight,
        }
        # Only when set: replicas of a release before the mark read every other table.
        if self.reloading:
            entry["reloading"] = True
        if self.shadow is not None:
            entry["shadow"] = asdict(self.shadow)
        return entry

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> ServedVersion:
        shadow = entry.get("shadow")
        return cls(**{**entry, "shadow": Shadow(**shadow) if shadow else None})


@dataclass(frozen=True)
class Spec:
    """The serving spec a version was registered with (``SPEC_FILE``)."""

    task: str
    labels: list[str]
    output_name: str
    output_dim: int
    max_length: int
    precision: str = ""  # int8, fp16 or fp32 (translation's Triton model reads it)
    max_decoding_length: int = 0  # translation: the most tokens the model can generate
    # Named instruction prefixes (sentence-transformers' ``prompts``): a request's
    # ``prompt_name`` picks one, put before each text; the default goes before a text
    # whose request names none (infergate.serving.prompts).
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Spec:
        return cls(
            task=data["task"],
            labels=list(data.get("labels", [])),
            output_name=data["output_name"],
            output_dim=int(data["output_dim"]),
            max_length=int(data["max_length"]),
            precision=str(data.get("precision", "")),
            max_decoding_length=int(data.get("max_decoding_length", 0)),
            prompts={str(k): str(v) for k, v in data.get("prompts", {}).items()},
            default_prompt_name=data.get("default_prompt_name"),
        )


def triton_model_name(name: str, version: str) -> str:
    """The Triton model name of an MLflow model version, e.g. ``sentiment__v3``.

    MLflow names may hold spaces, dots, slashes or any Unicode. Such characters become
    ``_``, and a short hash of the original name is appended whenever anything was
    replaced, so ``"a b"`` and ``"a_b"`` stay different models.
    """
    safe_name = _UNSAFE_CHARS.sub("_", name).strip("_")[:120] or "model"
    if safe_name != name:
        safe_name += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    safe_version = _UNSAFE_CHARS.sub("_", str(version)).strip("_")[:32] or "0"
    return f"{safe_name}__v{safe_version}"


def version_cache(root: Path, served: ServedVersion) -> Path:
    """The folder under ``root`` that keeps one version's downloaded artifacts.

    Keyed by the artifact URI as well as name and version: a model deleted and registered
    again starts over at version 1 with other files, which must not be served from the
    first one's copies.
    """
    digest = hashlib.sha256(served.source.encode()).hexdigest()[:16]
    return root / served.triton_model / digest

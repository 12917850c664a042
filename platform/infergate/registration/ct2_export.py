"""Turn a Hugging Face sequence-to-sequence folder (Marian, T5, mT5, BART) into a
CTranslate2 model, and prove it still translates as transformers does.

``build`` loads the folder offline, converts it with CTranslate2's
``TransformersConverter`` at the registered precision (``int8`` weights by default, run
as int8 on a CPU and int8/float16 on a GPU; ``fp16`` for GPUs; ``fp32``), checks that the
converted vocabulary keeps the tokenizer's ids (Triton's model maps ids to tokens through
it), then translates the reference texts both ways, greedily: CTranslate2 at the
precision a CPU serves it, and transformers' ``generate`` on the original weights. The
figures are the exact-match rate of the detokenized outputs and their corpus chrF
(``infergate.observe.chrf``); chrF under ``MIN_CHRF[precision]`` fails the registration.

``generate`` runs with the model's generation config except what the comparison needs
equal: greedy search, ``DEFAULT_MAX_DECODING_LENGTH`` new tokens, and no end token forced
at that limit (CTranslate2 does not force one; transformers would replace the last token).

Measured on the tiny random Marian of the tests (2 layers, d_model 32; seed 0): fp32
exact match 1.0 and chrF 100; int8 diverges on near-ties of random weights (figures in
docs/tasks.md).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infergate.errors import RegistrationError
from infergate.observe.chrf import chrf, exact_match_rate
from infergate.registration.hf_folder import (
    first_line,
    load_config,
    load_tokenizer,
    transformers_quiet,
)
from infergate.registration.steps import Steps
from infergate.serving.tokenization import TextTokenizer
from infergate.tasks.translation import DEFAULT_MAX_DECODING_LENGTH, MAX_DECODING_LENGTH

log = logging.getLogger(__name__)

# config.model_type of the sequence-to-sequence families converted here. Left out for now:
# M2M-100 and NLLB (config m2m_100) and mBART need a target-language token at every
# request, which the front-end does not send yet.
SUPPORTED_ARCHITECTURES = ("bart", "marian", "mt5", "t5")
# CTranslate2 4.8.5's BART loader reads config.normalize_before, which transformers 5's
# BartConfig no longer has; BART normalises after each sublayer (post-norm), so the
# folder is converted through a copy whose config.json says so.
_NORMALIZE_BEFORE = {"bart": False}
PRECISIONS = {"int8": "int8", "fp16": "float16", "fp32": "float32"}  # -> quantization
CPU_COMPUTE_TYPES = {"int8": "int8", "fp16": "float32", "fp32": "float32"}
# Lowest corpus chrF of CTranslate2's greedy outputs against transformers'. fp32 should
# reproduce transformers' tokens; int8 moves near-ties (random test weights are full of
# them), fp16 is checked in float32 on a CPU.
MIN_CHRF = {"fp32": 99.0, "fp16": 99.0, "int8": 80.0}
PARITY_TEXTS = 64  # reference texts translated both ways
PARITY_BATCH = 16
CT2_DIR = "ctranslate2"
DEFAULT_MAX_LENGTH = 512  # input tokens, when neither tokenizer nor config bounds them


@dataclass(frozen=True)
class TranslationParity:
    """CTranslate2's greedy translations against transformers' on the same texts."""

    exact_match: float  # share of texts translated identically, 0 to 1
    chrf: float  # corpus chrF, 0 to 100
    min_chrf: float  # the registration's threshold
    n_samples: int
    precision: str
    compute_type: str

    @property
    def passed(self) -> bool:
        return bool(self.chrf >= self.min_chrf)  # NaN fails

    @property
    def check(self) -> str:
        return f"chrf {self.chrf:.4g} >= {self.min_chrf:.4g}, exact match {self.exact_match:.3g}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


@dataclass(frozen=True)
class TranslationBuild:
    """What ``build`` produced, for the registry and Triton."""

    ct2_dir: Path
    tokenizer_dir: Path
    max_length: int
    precision: str
    model_type: str
    parity: TranslationParity
    model_bytes: int
    max_decoding_length: int  # what the model can generate; requests are capped to it


def load_seq2seq(model_dir: Path) -> tuple[str, Any, Any, Any]:
    """``(model_type, config, tokenizer, model)`` of a supported folder; RegistrationError
    with one line otherwise."""
    import torch
    import transformers

    model_type, config = load_config(
        model_dir, SUPPORTED_ARCHITECTURES, "a translation model infergate converts"
    )
    tokenizer = load_tokenizer(model_dir, int(config.vocab_size))
    try:
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(
            model_dir, local_files_only=True, dtype=torch.float32
        )
    except Exception as exc:
        raise RegistrationError(
            f"cannot load the model in {model_dir}: {first_line(exc)}"
        ) from None
    return str(model_type), config, tokenizer, model.eval()


def max_length_of(config: Any, tokenizer: Any, requested: int | None) -> int:
    positions = int(getattr(config, "max_position_embeddings", 0) or DEFAULT_MAX_LENGTH)
    limit = min(int(tokenizer.model_max_length), positions)
    if requested is None:
        return limit
    if not 2 <= requested <= positions:
        raise RegistrationError(f"max_length {requested} is out of range: use 2..{positions}")
    return requested


def decoding_limit(config: Any) -> int:
    """The most tokens the decoder can generate: its position table less the start
    token's position (relative positions, as T5's, have no table)."""
    positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    return min(positions - 1, MAX_DECODING_LENGTH) if positions else MAX_DECODING_LENGTH


def converter_source(model_dir: Path, model_type: str, work: Path) -> Path:
    """``model_dir``, or for BART a copy (links, and a config.json with the field
    CTranslate2's loader reads) that converts."""
    if model_type not in _NORMALIZE_BEFORE:
        return model_dir
    config = json.loads((model_dir / "config.json").read_text())
    if "normalize_before" in config:
        return model_dir
    copy = work / "source"
    copy.mkdir()
    for path in model_dir.iterdir():
        if path.name != "config.json":
            (copy / path.name).symlink_to(path.resolve())
    config["normalize_before"] = _NORMALIZE_BEFORE[model_type]
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def check_vocabulary(ct2_dir: Path, tokenizer: Any) -> None:
    """The converted vocabulary must list the tokenizer's tokens in id order (Marian's
    converter drops a trailing ``<pad>``, which is never generated)."""
    for name in ("shared_vocabulary.json", "target_vocabulary.json"):
        path = ct2_dir / name
        if path.is_file():
            tokens = json.loads(path.read_text())
            break
    else:
        raise RegistrationError(f"CTranslate2 wrote no vocabulary file into {ct2_dir}")
    expected = tokenizer.convert_ids_to_tokens(list(range(len(tokens))))
    if tokens != expected:
        first = next(i for i, (a, b) in enumerate(zip(tokens, expected, strict=True)) if a != b)
        raise RegistrationError(
            f"CTranslate2's vocabulary differs from the tokenizer's at id {first} "
            f"({tokens[first]!r} vs {expected[first]!r}); the served ids would be wrong"
        )


def translate_ct2(
    translator: Any,
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    vocabulary: list[str],
    *,
    beam_size: int = 1,
    max_decoding_length: int = DEFAULT_MAX_DECODING_LENGTH,
) -> tuple[list[list[int]], np.ndarray]:
    """CTranslate2's output ids of ``texts``, tokenized as the front-end does, and their
    input lengths: what Triton's model computes for them."""
    batch = tokenizer(list(texts))
    sources = [
        [vocabulary[i] for i in row[mask.astype(bool)].tolist()]
        for row, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
    ]
    ids = {token: i for i, token in enumerate(vocabulary)}
    results = translator.translate_batch(
        sources, beam_size=beam_size, max_decoding_length=max_decoding_length
    )
    outputs = [[ids.get(token, 0) for token in result.hypotheses[0]] for result in results]
    return outputs, batch.lengths


def translate_transformers(
    model: Any, tokenizer: Any, texts: Sequence[str], max_length: int, max_new_tokens: int
) -> list[str]:
    """transformers' greedy translations of ``texts``, detokenized."""
    import torch

    outputs: list[str] = []
    for start in range(0, len(texts), PARITY_BATCH):
        chunk = list(texts[start : start + PARITY_BATCH])
        enc = tokenizer(
            chunk, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        with torch.no_grad():
            generated = model.generate(
                **enc, num_beams=1, do_sample=False, max_new_tokens=max_new_tokens,
                max_length=None, forced_eos_token_id=None, num_return_sequences=1,
            )  # fmt: skip
        outputs.extend(tokenizer.batch_decode(generated, skip_special_tokens=True))
    return outputs


def build(
    model_dir: Path,
    precision: str,
    out_dir: Path,
    *,
    texts: Sequence[str],
    max_length: int | None = None,
    progress: bool = True,
) -> TranslationBuild:
    """Convert ``model_dir`` at ``precision`` into ``out_dir/ctranslate2`` (and its
    tokenizer into ``out_dir/tokenizer``) after the parity check on ``texts``."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if precision not in PRECISIONS:
        raise RegistrationError(
            f"precision {precision!r} is not supported; use one of {list(PRECISIONS)}"
        )
    if not texts:
        raise RegistrationError("the parity check needs at least one reference text")
    steps = Steps(model_dir.name, ("load", "convert", "parity", "save"), progress)

    with steps, tempfile.TemporaryDirectory(prefix="infergate-ct2-") as tmp:
        work = Path(tmp)
        with steps("load"), transformers_quiet(not progress):
            if not model_dir.is_dir():
                raise RegistrationError(f"model folder {model_dir} does not exist")
            model_type, config, hf_tokenizer, model = load_seq2seq(model_dir)
            max_length = max_length_of(config, hf_tokenizer, max_length)
            limit = decoding_limit(config)
            decode = min(DEFAULT_MAX_DECODING_LENGTH, limit)
            hf_tokenizer.model_max_length = max_length
            hf_tokenizer.save_pretrained(work / "tokenizer")
            if not (work / "tokenizer" / "tokenizer.json").is_file():
                raise RegistrationError(f"the tokenizer of {model_dir} saved no tokenizer.json")
        with steps("convert"), transformers_quiet(not progress):
            try:
                source = converter_source(model_dir, model_type, work)
                TransformersConverter(str(source)).convert(
                    str(work / CT2_DIR), quantization=PRECISIONS[precision], force=True
                )
            except Exception as exc:
                raise RegistrationError(
                    f"CTranslate2 could not convert {model_dir}: {first_line(exc)}"
                ) from None
            check_vocabulary(work / CT2_DIR, hf_tokenizer)
        with steps("parity"), transformers_quiet(not progress):
            served_tokenizer = TextTokenizer.from_dir(work / "tokenizer", max_length)
            compute_type = CPU_COMPUTE_TYPES[precision]
            translator = ctranslate2.Translator(
                str(work / CT2_DIR), device="cpu", compute_type=compute_type
            )
            vocabulary = json.loads(next((work / CT2_DIR).glob("*vocabulary.json")).read_text())
            sample = list(texts[:PARITY_TEXTS])
            ids, _ = translate_ct2(
                translator, served_tokenizer, sample, vocabulary, max_decoding_length=decode
            )
            ours = served_tokenizer.decode_batch(ids)
            theirs = translate_transformers(model, hf_tokenizer, sample, max_length, decode)
            parity = TranslationParity(
                exact_match=exact_match_rate(ours, theirs),
                chrf=chrf(ours, theirs),
                min_chrf=MIN_CHRF[precision],
                n_samples=len(sample),
                precision=precision,
                compute_type=compute_type,
            )
            log.info("translation parity: %s", parity.check)
            if not parity.passed:
                raise RegistrationError(
                    f"translation parity check failed ({precision}): CTranslate2's greedy "
                    f"outputs against transformers' on {len(sample)} reference texts: "
                    f"chrF {parity.chrf:.4g} < {parity.min_chrf:.4g} (exact match "
                    f"{parity.exact_match:.3g}); try --precision fp32"
                )
        with steps("save"):
            out_dir.mkdir(parents=True, exist_ok=True)
            shutil.copytree(work / "tokenizer", out_dir / "tokenizer", dirs_exist_ok=True)
            shutil.copytree(work / CT2_DIR, out_dir / CT2_DIR, dirs_exist_ok=True)
    times = steps.summary()
    log.info("converted %s (%s): %s; %s", model_dir, precision, parity.check, times)
    size = sum(p.stat().st_size for p in (out_dir / CT2_DIR).iterdir())
    return TranslationBuild(
        out_dir / CT2_DIR,
        out_dir / "tokenizer",
        max_length,
        precision,
        model_type,
        parity,
        size,
        limit,
    )


def reference_run(
    build: TranslationBuild, texts: Sequence[str], batch_size: int = 32
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Input lengths, unknown-token ratios and output lengths of the reference texts,
    translated as served with the default settings (greedy, the default length limit)."""
    import ctranslate2

    tokenizer = TextTokenizer.from_dir(build.tokenizer_dir, build.max_length)
    translator = ctranslate2.Translator(
        str(build.ct2_dir), device="cpu", compute_type=CPU_COMPUTE_TYPES[build.precision]
    )
    vocabulary = json.loads(next(build.ct2_dir.glob("*vocabulary.json")).read_text())
    lengths, unknown, generated = [], [], []
    for start in range(0, len(texts), batch_size):
        chunk = list(texts[start : start + batch_size])
        batch = tokenizer(chunk)
        ids, _ = translate_ct2(
            translator, tokenizer, chunk, vocabulary,
            max_decoding_length=min(DEFAULT_MAX_DECODING_LENGTH, build.max_decoding_length),
        )  # fmt: skip
        lengths.append(batch.lengths)
        unknown.append(batch.unknown_ratio)
        generated.append(np.array([len(row) for row in ids], dtype=np.int64))
    return np.concatenate(lengths), np.concatenate(unknown), np.concatenate(generated)

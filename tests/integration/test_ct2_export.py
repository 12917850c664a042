"""Translation's registration step in process: CTranslate2 converts tiny random Marian,
T5 and BART models, its greedy outputs are measured against transformers' ``generate``, a version
under the chrF threshold is refused with the figures, and folders that are not
translation models are refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infergate.errors import RegistrationError
from infergate.registration import ct2_export
from infergate.registration.reference_texts import DEFAULT_REFERENCE_TEXTS, read_texts
from tiny_models import tiny_bart, tiny_bert, tiny_marian, tiny_t5

TEXTS = read_texts(DEFAULT_REFERENCE_TEXTS)[:32]


def test_marian_at_fp32_translates_exactly_as_transformers(tmp_path: Path) -> None:
    built = ct2_export.build(
        tiny_marian(tmp_path / "marian"), "fp32", tmp_path / "out", texts=TEXTS, progress=False
    )
    assert built.parity.exact_match == 1.0 and built.parity.chrf == 100.0
    assert built.parity.n_samples == len(TEXTS) and built.parity.passed
    assert built.max_decoding_length == 63  # 64 positions, less the start token's
    assert (built.ct2_dir / "model.bin").is_file()
    assert (built.tokenizer_dir / "tokenizer.json").is_file()
    inputs, unknown, outputs = ct2_export.reference_run(built, TEXTS)
    assert (unknown >= 0).all()
    assert len(inputs) == len(outputs) == len(TEXTS) and (outputs <= 63).all()
    assert json.loads(json.dumps(built.parity.to_dict()))["passed"] is True


def test_marian_at_int8_passes_with_its_figures_recorded(tmp_path: Path) -> None:
    built = ct2_export.build(
        tiny_marian(tmp_path / "marian"), "int8", tmp_path / "out", texts=TEXTS, progress=False
    )
    parity = built.parity
    assert parity.compute_type == "int8" and parity.min_chrf == ct2_export.MIN_CHRF["int8"]
    assert parity.chrf >= parity.min_chrf and 0.0 < parity.exact_match <= 1.0
    assert parity.check.startswith(f"chrf {parity.chrf:.4g} >= 80")


def test_t5_converts_and_an_int8_version_under_the_threshold_is_refused(tmp_path: Path) -> None:
    folder = tiny_t5(tmp_path / "t5")
    built = ct2_export.build(folder, "fp32", tmp_path / "fp32", texts=TEXTS, progress=False)
    assert built.parity.exact_match == 1.0
    assert built.max_decoding_length == 512  # relative positions: the platform's cap
    # Its large random activations lose too much at int8: the registration stops, saying
    # what was measured against what, and writes nothing.
    with pytest.raises(RegistrationError, match=r"chrF [\d.]+ < 80 \(exact match"):
        ct2_export.build(folder, "int8", tmp_path / "int8", texts=TEXTS, progress=False)
    assert not (tmp_path / "int8").exists()


def test_bart_converts_through_a_config_its_converter_can_read(tmp_path: Path) -> None:
    folder = tiny_bart(tmp_path / "bart")
    built = ct2_export.build(folder, "fp32", tmp_path / "fp32", texts=TEXTS, progress=False)
    assert built.parity.exact_match == 1.0 and built.model_type == "bart"
    assert "normalize_before" not in (folder / "config.json").read_text()  # left as it was


def test_folders_that_are_not_translation_models_are_refused(tmp_path: Path) -> None:
    bert = tiny_bert(tmp_path / "bert", "text-classification")
    with pytest.raises(RegistrationError, match=r"'bert' .* not a translation model"):
        ct2_export.build(bert, "int8", tmp_path / "out", texts=TEXTS, progress=False)
    with pytest.raises(RegistrationError, match=r"no config\.json"):
        ct2_export.build(tmp_path, "int8", tmp_path / "out", texts=TEXTS, progress=False)
    with pytest.raises(RegistrationError, match="precision 'int4'"):
        ct2_export.build(bert, "int4", tmp_path / "out", texts=TEXTS, progress=False)

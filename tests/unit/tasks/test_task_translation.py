"""translation's pure parts: chrF and exact match, the decoding rows sent to Triton, the
answer detokenized from padded ids, its figures, and the parameters it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from infergate import tasks
from infergate.errors import InvalidInput
from infergate.observe.chrf import chrf, exact_match_rate
from infergate.serving.tokenization import TextTokenizer
from infergate.tasks.translation import (
    DECODING_INPUT,
    DEFAULT_MAX_DECODING_LENGTH,
    PAD_ID,
    output_lengths,
    unpad,
)

TRANSLATION = tasks.get("translation")


# Expected scores computed with sacreBLEU 2.6.0's CHRF() (defaults: character order 6,
# word order 0, beta 2) on the same texts.
@pytest.mark.parametrize(
    ("hypotheses", "references", "expected"),
    [
        (
            ["the cat sat on the mat", "hello world", "a b c"],
            ["the cat is on the mat", "hello there world", "abc"],
            54.19038527348552,
        ),
        (["i love this film"], ["i loved the film"], 39.64128464128464),
        (["xyz"], ["abc"], 0.0),
    ],
)
def test_chrf_equals_sacrebleu(hypotheses, references, expected):
    assert chrf(hypotheses, references) == pytest.approx(expected, abs=1e-9)


def test_chrf_is_100_for_identical_texts_and_ignores_whitespace():
    texts = ["a translation", "another one"]
    assert chrf(texts, texts) == 100.0
    assert chrf(["a  translation"], ["a translation"]) == 100.0
    assert chrf([""], [""]) == 100.0
    assert chrf([""], ["x"]) == 0.0


def test_exact_match_rate():
    assert exact_match_rate(["a", "b", "c", "d"], ["a", "b", "x", "d"]) == 0.75
    with pytest.raises(ValueError):
        exact_match_rate(["a"], ["a", "b"])


def tokenizer() -> TextTokenizer:
    vocab = {"<pad>": 0, "<unk>": 1, "hello": 2, "world": 3, "again": 4}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.decoder = decoders.WordPiece()  # joins words with spaces
    inner.add_special_tokens(["<pad>"])
    return TextTokenizer(inner, max_length=16)


def test_decoding_rows_carry_the_defaults_or_the_request_settings():
    batch = tokenizer()(["hello world", "again"])
    rows = TRANSLATION.inference_inputs(batch, {})[DECODING_INPUT]
    assert rows.dtype == np.int64
    assert rows.tolist() == [[1, DEFAULT_MAX_DECODING_LENGTH]] * 2
    asked = {"beam_size": 3, "max_decoding_length": 7}
    assert TRANSLATION.inference_inputs(batch, asked)[DECODING_INPUT].tolist() == [[3, 7]] * 2


def test_the_answer_is_the_detokenized_ids_and_figures_count_them():
    text_tokenizer = tokenizer()
    batch = text_tokenizer(["one", "two", "three"])
    raw = np.array([[2, 3, PAD_ID], [4, PAD_ID, PAD_ID], [2, 4, 3]], dtype=np.int64)
    assert unpad(raw) == [[2, 3], [4], [2, 4, 3]]
    assert output_lengths(raw).tolist() == [2, 1, 3]
    answer, kept = TRANSLATION.answer(raw, batch, ["one", "two", "three"], [], {}, text_tokenizer)
    assert answer == [
        {"translation_text": "hello world"},
        {"translation_text": "again"},
        {"translation_text": "hello again world"},
    ]
    assert kept is raw
    assert TRANSLATION.figures(raw, batch, []).values.tolist() == [2.0, 1.0, 3.0]


def test_an_empty_translation_is_an_empty_text():
    text_tokenizer = tokenizer()
    raw = np.full((1, 1), PAD_ID, dtype=np.int64)
    answer, _ = TRANSLATION.answer(raw, text_tokenizer(["x"]), ["x"], [], {}, text_tokenizer)
    assert answer == [{"translation_text": ""}]
    assert output_lengths(raw).tolist() == [0]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"beam_size": 0}, "'beam_size' is 0; use an integer from 1 to 8"),
        ({"beam_size": True}, "'beam_size' is True"),
        ({"max_decoding_length": 10_000}, "from 1 to 512"),
        ({"target_lang": "de"}, "translates one language pair"),
        ({"top_k": 3}, "'top_k' applies to sparse-embedding models"),
    ],
)
def test_bad_parameters_are_refused_with_what_to_send(parameters, message):
    with pytest.raises(InvalidInput, match=message):
        TRANSLATION.check_parameters(parameters, "opus")


def test_good_parameters_pass():
    TRANSLATION.check_parameters({"beam_size": 4, "max_decoding_length": 64}, "opus")


def test_reference_statistics_and_drift_follow_the_output_lengths():
    from infergate.observe.drift import DriftWindow
    from infergate.observe.reference import reference_stats
    from infergate.tasks import Figures

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 30, size=200)
    outputs = rng.integers(4, 40, size=200).astype(np.float64)
    reference = reference_stats(
        "translation", lengths, np.zeros(200), np.zeros((0, 0)), figures=Figures(outputs)
    )
    assert sum(reference["output_tokens"]["counts"]) == 200
    assert reference["output_tokens_mean"] == pytest.approx(outputs.mean())
    alike = DriftWindow(reference, "translation", min_texts=10)
    alike.add(lengths, np.zeros(200), np.zeros((200, 0)), figures=Figures(outputs))
    assert alike.scores()[("output_tokens", "psi")] < 0.01
    # A model that suddenly rambles to its length limit on every text drifts.
    rambling = DriftWindow(reference, "translation", min_texts=10)
    rambling.add(lengths, np.zeros(200), np.zeros((200, 0)), figures=Figures(np.full(200, 128.0)))
    assert rambling.scores()[("output_tokens", "psi")] > 0.25

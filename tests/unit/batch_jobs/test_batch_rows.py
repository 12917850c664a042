"""A chunk's rows: bad ones get predict's message in their row; answers become columns."""

from __future__ import annotations

import numpy as np

from infergate.batch.rows import Checked, answer_columns, check_rows, plain, result_columns
from infergate.protocols.wire import Limits
from infergate.tasks import get

LIMITS = Limits(max_body_bytes=1 << 20, max_texts=64, max_chars_per_text=10)


def test_bad_rows_get_errors_and_the_others_are_answered():
    checked = check_rows(["fine", "", None, 7, "x" * 11, " \n", "also ok"], None, LIMITS)
    assert checked.texts == ["fine", "also ok"] and checked.answered == [0, 6]
    assert checked.errors == {
        1: "the text is empty or only whitespace; send some text",
        2: "the text must be a string, got null",
        3: "the text must be a string, got a number",
        4: "the text has 11 characters; the limit is 10 per text",
        5: "the text is empty or only whitespace; send some text",
    }


def test_queries_are_checked_per_row_and_known_problems_kept():
    checked = check_rows(["a", "b", "c"], ["q", "", "q"], LIMITS, [None, None, "not JSON"])
    assert checked.texts == ["a"] and checked.queries == ["q"]
    assert checked.errors == {1: "the query is empty or only whitespace; send some text",
                              2: "not JSON"}  # fmt: skip


def test_answers_that_are_objects_become_a_column_per_key():
    outputs = [{"label": "pos", "score": np.float32(0.5), "scores": {"pos": 0.5}}]
    assert answer_columns(get("text-classification"), outputs) == {
        "label": ["pos"], "score": [0.5], "scores": [{"pos": 0.5}]
    }  # fmt: skip


def test_other_answers_become_the_tasks_column():
    vectors = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    assert answer_columns(get("feature-extraction"), vectors) == {
        "embedding": [[1.0, 0.0], [0.0, 1.0]]
    }
    assert answer_columns(get("token-classification"), [[], [{"word": "x"}]]) == {
        "entities": [[], [{"word": "x"}]]
    }


def test_results_align_with_the_rows_they_answer():
    checked = Checked(["a", "c"], None, [0, 2], {1: "empty"})
    outputs = [{"translation_text": "A"}, {"translation_text": "C"}]
    columns = result_columns(get("translation"), 3, checked, outputs, "4")
    assert columns == {
        "translation_text": ["A", None, "C"],
        "version": ["4", "4", "4"],
        "error": [None, "empty", None],
    }


def test_a_model_failure_is_the_error_of_every_answered_row():
    checked = Checked(["a", "c"], None, [0, 2], {1: "empty"})
    columns = result_columns(get("translation"), 3, checked, [], "4", "the model failed")
    assert columns == {
        "version": ["4"] * 3,
        "error": ["the model failed", "empty", "the model failed"],
    }


def test_plain_values():
    assert plain({"a": np.arange(2), "b": (np.int64(3),)}) == {"a": [0, 1], "b": [3]}

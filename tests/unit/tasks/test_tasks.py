"""The task registry: the command line offers exactly its tasks, and each task's output
names and metrics are its own."""

from infergate import tasks
from infergate.cli import build_parser
from infergate.observe import metrics
from infergate.triton.repository import OUTPUT_NAMES, TRANSLATION_OUTPUT


def test_the_command_line_offers_exactly_the_registered_tasks():
    register = build_parser()._subparsers._group_actions[0].choices["register"]  # type: ignore[union-attr]
    (task,) = [action for action in register._actions if action.dest == "task"]
    assert task.choices == list(tasks.TASKS)


def test_each_task_has_its_own_output_and_a_recorded_value_metric():
    outputs = [task.output_name for task in tasks.TASKS.values()]
    # translation's output is CTranslate2's token ids, not an ONNX graph's floats
    assert len(set(outputs)) == len(outputs)
    assert set(outputs) == {*OUTPUT_NAMES, TRANSLATION_OUTPUT}
    for task in tasks.TASKS.values():
        assert task.value_metric in metrics.FRONTEND
        assert task.category_metric is None or task.category_metric in metrics.FRONTEND
        per_token = task.time_per_token_metric
        assert per_token is None or per_token in metrics.FRONTEND


def test_an_unknown_task_is_named_in_the_error():
    try:
        tasks.get("summarization")
    except ValueError as error:
        assert "'summarization' is not supported" in str(error)
    else:
        raise AssertionError("no error")


def test_entities_are_redacted_by_their_type_and_other_tasks_refuse():
    import pytest

    from infergate.errors import InvalidInput

    text = "Alice Smith lives in London."
    answer = [
        {"entity": "PER", "score": 0.9, "start": 0, "end": 11, "word": "Alice Smith"},
        {"entity": "LOC", "score": 0.8, "start": 21, "end": 27, "word": "London"},
    ]
    ner = tasks.get("token-classification")
    assert ner.redacted(text, answer) == "[PER] lives in [LOC]."
    assert ner.redacted(text, []) == text
    for name in set(tasks.TASKS) - {"token-classification"}:
        with pytest.raises(InvalidInput, match="finds no spans in texts to redact"):
            tasks.get(name).redacted(text, None)

"""The task registry: every task the command line offers has its behaviour, and each
task's output names and metrics are its own."""

from infergate import metrics, tasks
from infergate.config import TASKS
from infergate.triton.repository import OUTPUT_NAMES


def test_the_registry_holds_exactly_the_tasks_of_the_command_line():
    assert tuple(tasks.TASKS) == TASKS


def test_each_task_has_its_own_output_and_a_recorded_value_metric():
    outputs = [task.output_name for task in tasks.TASKS.values()]
    assert len(set(outputs)) == len(outputs) and set(outputs) == set(OUTPUT_NAMES)
    for task in tasks.TASKS.values():
        assert task.value_metric in metrics.FRONTEND
        assert task.category_metric is None or task.category_metric in metrics.FRONTEND


def test_an_unknown_task_is_named_in_the_error():
    try:
        tasks.get("translation")
    except ValueError as error:
        assert "'translation' is not supported" in str(error)
    else:
        raise AssertionError("no error")

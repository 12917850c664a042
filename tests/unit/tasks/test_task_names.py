"""A task is one module: outside ``infergate.tasks`` no code asks which task it has.

What differs between tasks is an attribute or a method of the task, so adding a task
touches its module and the registry, not every place that once compared names. The
benchmarks are left out: they pick tasks to measure, by name.
"""

import ast
from pathlib import Path

import infergate
from infergate.tasks import TASKS

PACKAGE = Path(infergate.__file__).parent
LEFT_OUT = ("tasks", "bench")


def _modules() -> dict[Path, ast.Module]:
    return {
        path: ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in LEFT_OUT
    }


def _is_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in TASKS


def _aliases(modules: dict[Path, ast.Module]) -> set[str]:
    """Module-level names bound to a task's name, such as ``RANKING_TASK = "text-ranking"``."""
    names = set()
    for module in modules.values():
        for statement in module.body:
            if isinstance(statement, ast.Assign) and _is_name(statement.value):
                targets = statement.targets
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                targets = [statement.target] if _is_name(statement.value) else []
            else:
                continue
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _names_a_task(node: ast.expr, aliases: set[str]) -> bool:
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_task(element, aliases) for element in node.elts)
    if isinstance(node, ast.Name):
        return node.id in aliases
    if isinstance(node, ast.Attribute):
        return node.attr in aliases
    return _is_name(node)


def comparisons() -> list[str]:
    """``path:line`` of each comparison against a task's name or an alias of one."""
    modules = _modules()
    aliases = _aliases(modules)
    found = []
    for path, module in modules.items():
        for node in ast.walk(module):
            if isinstance(node, ast.Compare) and any(
                _names_a_task(operand, aliases) for operand in (node.left, *node.comparators)
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_the_walk_sees_a_comparison_and_an_alias():
    aliases = {"RANKING_TASK"}
    assert _names_a_task(ast.parse('"translation"', mode="eval").body, aliases)
    assert _names_a_task(ast.parse('("x", "text-ranking")', mode="eval").body, aliases)
    assert _names_a_task(ast.parse("rerank.RANKING_TASK", mode="eval").body, aliases)
    assert not _names_a_task(ast.parse('"logits"', mode="eval").body, aliases)


def test_no_code_outside_the_tasks_compares_task_names():
    found = comparisons()
    assert not found, f"{len(found)} comparisons against task names: {', '.join(found)}"

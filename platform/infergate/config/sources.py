"""Where each setting came from (the YAML file, an ``INFERGATE_*`` variable, the command
line), reading them, and one line for a wrong one: which setting, where it came from, what
it should be, and for a name that is no setting the nearest one that is."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from infergate.errors import InvalidConfig

ENV_PREFIX = "INFERGATE_"


Loc = tuple[str, ...]  # a setting's keys, section by section: ("triton", "grpc_port")


@dataclass(frozen=True)
class Origin:
    """Where a value came from, to name in an error: the YAML file, an environment
    variable, or (neither) the command line."""

    file: Path | None = None
    variable: str | None = None

    def __str__(self) -> str:
        if self.variable is not None:
            return f"from {self.variable}"
        return f"in {self.file}" if self.file is not None else "from the command line"

    def spelling(self, loc: Loc) -> str:
        """How the setting at ``loc`` is written where this value came from."""
        if self.variable is not None:
            return ENV_PREFIX + "__".join(loc).upper()
        return _dotted(loc)


Origins = dict[Loc, Origin]


def _dotted(loc: Loc) -> str:
    return ".".join(loc)


def note(origins: Origins, tree: Any, origin: Origin, loc: Loc = ()) -> None:
    """Record ``origin`` for every key of ``tree`` under ``loc``, nested keys too."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            child = (*loc, str(key))  # as pydantic names it in an error
            origins[child] = origin
            note(origins, value, origin, child)


def read_file(path: Path) -> dict[str, Any]:
    """The file's settings; ``InvalidConfig`` in one line when it cannot give any."""
    try:
        data = yaml.safe_load(path.read_bytes())
    except OSError as exc:
        raise InvalidConfig(f"cannot read the config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InvalidConfig(f"{path} is not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidConfig(
            f"{path} holds a {type(data).__name__}; it should be a mapping of settings"
        )
    return data


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())


def env_overrides(environ: Mapping[str, str], origins: Origins) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    # Sorted: INFERGATE_SERVE, a whole section, before INFERGATE_SERVE__PORT within it.
    for key, raw in sorted(environ.items()):
        if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX + "CONFIG":
            continue
        loc = _env_loc(key)
        origin = Origin(variable=key)
        tree = overrides
        for end in range(1, len(loc)):
            tree = tree.setdefault(loc[end - 1], {})
            if not isinstance(tree, dict):
                raise InvalidConfig(
                    f"{key} sets {_dotted(loc)}, inside {_dotted(loc[:end])}, which "
                    f"{origins[loc[:end]].variable} sets to {reprlib.repr(tree)}; unset one of them"
                )
            origins[loc[:end]] = origin
        tree[loc[-1]] = _env_value(raw)
        origins[loc] = origin
        note(origins, tree[loc[-1]], origin, loc)
    return overrides


def _env_loc(variable: str) -> Loc:
    """The setting an INFERGATE_<SECTION>__<FIELD> variable names."""
    return tuple(variable[len(ENV_PREFIX) :].lower().split("__"))


def _env_value(raw: str) -> Any:
    """The variable's text, which pydantic reads as its setting's type ("8101" an int,
    "false" a bool, "007" a token); read as YAML only for what text cannot be: a mapping
    or list (a whole section, say) or null. YAML's own reading made a token of digits an
    int that a string setting refuses, and "@..." a traceback."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return value if raw and (value is None or isinstance(value, (dict, list))) else raw


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# Pydantic's words for these speak of Python classes.
_EXPECTED = {
    "model_type": "it should be a mapping of settings",
    "path_type": "it should be a path",
}


def invalid(error: ValidationError, origins: Origins, root: type[BaseModel]) -> InvalidConfig:
    """One line for the first wrong setting: which it is, where it came from, and what it
    should be (or, for a name that is no setting, the nearest one that is)."""
    problems = error.errors()
    problem, loc = problems[0], tuple(str(key) for key in problems[0]["loc"])
    origin = _origin_of(origins, loc)
    if problem["type"] in ("extra_forbidden", "invalid_key"):
        message = _unknown(loc, origin, root)
    else:
        expected = _EXPECTED.get(problem["type"]) or _should_be(problem["msg"])
        message = f"{_dotted(loc)} {origin} is {reprlib.repr(problem['input'])}; {expected}"
    if len(problems) > 1:
        more = len(problems) - 1
        message += f" (and {more} more wrong setting{'s' if more > 1 else ''})"
    return InvalidConfig(message)


def _origin_of(origins: Origins, loc: Loc) -> Origin:
    """Where the value at ``loc`` came from, or else the section holding it."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in origins:
            return origins[loc[:end]]
    return Origin()


def _should_be(message: str) -> str:
    """Pydantic's "Input should be a valid integer" as "it should be a valid integer", and
    a check of several settings' own words without pydantic's "Value error, "."""
    if message.startswith("Value error, "):
        return message.removeprefix("Value error, ")
    return message.replace("Input ", "it ", 1) if message.startswith("Input ") else message


def _unknown(loc: Loc, origin: Origin, root: type[BaseModel]) -> str:
    """The line for a name that is no setting, with the nearest valid one or else the names
    valid there. A variable's whole name counts: INFERGATE_TRITN__GRPC_PORT is refused at
    ``tritn`` but means triton.grpc_port."""
    named = loc
    if origin.variable is not None:
        whole = _env_loc(origin.variable)
        named = whole if whole[: len(loc)] == loc else loc
    nearest = _nearest_setting(named, root)
    if nearest is not None:
        hint = f"did you mean {origin.spelling(nearest)}?"
    else:
        section = _section_at(loc[:-1], root)
        names = ", ".join(section.model_fields) if section is not None else "no settings"
        hint = f"{_dotted(loc[:-1]) or 'the top level'} has {names}"
    return f"{_dotted(named)} {origin} is not a setting; {hint}"


def _nearest_setting(loc: Loc, root: type[BaseModel]) -> Loc | None:
    """Each name of ``loc`` replaced by the nearest valid one at its level (difflib), or
    None where none is near. A single underscore where two belong (ADMIN_TOKEN) reads as
    the section and the setting it joins."""
    nearest: Loc = ()
    for key in loc:
        section = _section_at(nearest, root)
        if section is None:
            return None
        choices: dict[str, Loc] = {name: (name,) for name in section.model_fields}
        for name in section.model_fields:
            inner = _section_at((*nearest, name), root)
            if inner is not None:
                choices.update({f"{name}_{field}": (name, field) for field in inner.model_fields})
        close = difflib.get_close_matches(key.lower(), choices, n=1)
        if not close:
            return None
        nearest += choices[close[0]]
    return nearest


def _section_at(loc: Loc, root: type[BaseModel]) -> type[BaseModel] | None:
    """The settings model of the section at ``loc``; None where ``loc`` is a setting."""
    model: Any = root
    for key in loc:
        model = model.model_fields[key].annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None

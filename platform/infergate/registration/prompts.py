"""The named prompts a version is registered with: ``infergate register --prompt
NAME=TEXT --default-prompt NAME``, and those of a sentence-transformers folder's
``config_sentence_transformers.json`` (its ``prompts`` and ``default_prompt_name``), the
command line's winning where both name a prompt. They are written into the version's
spec (``infergate.versions.Spec``); serving puts the prompt a request names, or the
default, before each text (``infergate.serving.prompts``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infergate import tasks
from infergate.errors import RegistrationError

SENTENCE_TRANSFORMERS_CONFIG = "config_sentence_transformers.json"


def parse_prompt_options(options: Sequence[str]) -> dict[str, str]:
    """``NAME=TEXT`` options as a dict; the text is kept as it is (a trailing space
    matters: ``query: ``)."""
    prompts: dict[str, str] = {}
    for option in options:
        name, equals, text = option.partition("=")
        if not equals or not name.strip() or name != name.strip():
            raise RegistrationError(
                f"--prompt {option!r} is not NAME=TEXT; e.g. --prompt 'query=query: '"
            )
        if name in prompts:
            raise RegistrationError(f"--prompt names {name!r} twice")
        prompts[name] = text
    return prompts


def folder_prompts(folder: Path) -> tuple[dict[str, str], str | None]:
    """A sentence-transformers folder's prompts and default prompt name; none without
    its config file."""
    path = folder / SENTENCE_TRANSFORMERS_CONFIG
    if not path.is_file():
        return {}, None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RegistrationError(f"{path} is not readable JSON: {exc}") from None
    prompts = config.get("prompts") or {}
    default = config.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise RegistrationError(f"{path}: 'prompts' must map names to texts")
    if default is not None and not isinstance(default, str):
        raise RegistrationError(f"{path}: 'default_prompt_name' must be a name")
    return dict(prompts), default


def prompt_spec(
    task: str,
    folder: Path,
    options: dict[str, str] | None = None,
    default: str | None = None,
) -> dict[str, Any]:
    """The spec's entries for the prompts of a registration (none without prompts): the
    folder's, then the command line's over them; the default must be one of them. A
    folder's prompts are left out for a task that takes none (a sentence-transformers
    config may come with any model); the command line's are refused."""
    options = options or {}
    takes = tasks.get(task).takes_prompts
    if (options or default is not None) and not takes:
        users = " and ".join(t.name for t in tasks.TASKS.values() if t.takes_prompts)
        raise RegistrationError(
            f"prompts apply to {users} models; a {task} model takes none (leave out "
            "--prompt and --default-prompt)"
        )
    if not takes:
        return {}
    found, folder_default = folder_prompts(folder)
    # sentence-transformers may write empty prompts ({"query": "", "document": ""}):
    # nothing to put before a text.
    prompts = {**{name: text for name, text in found.items() if text}, **options}
    if default is None and folder_default in prompts:
        default = folder_default
    if default is not None and default not in prompts:
        known = ", ".join(repr(name) for name in sorted(prompts)) or "none"
        raise RegistrationError(
            f"--default-prompt {default!r} is not one of the prompts ({known}); add "
            f"--prompt '{default}=TEXT'"
        )
    spec: dict[str, Any] = {"prompts": prompts} if prompts else {}
    if default is not None:
        spec["default_prompt_name"] = default
    return spec

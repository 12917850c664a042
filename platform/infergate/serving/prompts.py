"""Named prompts: instruction prefixes a model was registered with (sentence-transformers'
``prompts``, such as ``query: `` and ``passage: ``), picked per request by name.

A request's ``prompt_name`` (a parameter on every protocol: the native ``parameters``,
OpenAI's and TEI's bodies) names one of the version's prompts; without one, the version's
default prompt, if it has one, applies. The prompt is put before each text before it is
tokenized, so its tokens count in usage and truncation as the text's own do.

Pure: the prompts come with the version's spec (``infergate.versions.Spec``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infergate.errors import InvalidInput
from infergate.versions import Spec

PROMPT_NAME = "prompt_name"  # the request parameter, as TEI and sentence-transformers call it


def split_prompt(parameters: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The prompt name a request asks for, and its other parameters."""
    rest = {key: value for key, value in parameters.items() if key != PROMPT_NAME}
    return parameters.get(PROMPT_NAME), rest


def prompt_for(spec: Spec, name: str | None, model: str) -> str:
    """The text to put before each text: the prompt called ``name``, else the default
    prompt, else none. An unknown name is refused with the names there are."""
    if name is None:
        return spec.prompts.get(spec.default_prompt_name or "", "")
    if not isinstance(name, str):
        raise InvalidInput(f"'{PROMPT_NAME}' must be a string, got {name!r}", param=PROMPT_NAME)
    if name not in spec.prompts:
        known = ", ".join(repr(key) for key in sorted(spec.prompts))
        hint = (
            f"its prompts are {known}"
            if known
            else "it was registered without prompts (infergate register --prompt NAME=TEXT)"
        )
        raise InvalidInput(
            f"model {model!r} has no prompt called {name!r}; {hint}", param=PROMPT_NAME
        )
    return spec.prompts[name]


def prompted(texts: list[str], prompt: str) -> list[str]:
    return [prompt + text for text in texts] if prompt else texts

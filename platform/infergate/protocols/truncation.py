"""``truncation_direction`` as Text Embeddings Inference spells it, for every body that
takes it (TEI's routes, ``tei_bodies``, and the top-level ``/rerank``, ``rerank``): which
end of a text too long for the model is cut, checked once here and turned into the
inference path's parameter (``infergate.serving.tokenization.TRUNCATION_DIRECTION``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from infergate.errors import InvalidInput
from infergate.protocols.wire import json_type
from infergate.serving.tokenization import LEFT, RIGHT, TRUNCATION_DIRECTION

# TEI spells the ends "Right" and "Left"; huggingface_hub's docs "right" and "left".
DIRECTIONS = {"Right": RIGHT, "right": RIGHT, "Left": LEFT, "left": LEFT}

DIRECTION_FIELD: Any = Field(
    "Right",
    description="Which end of a text too long for the model is cut: Right keeps its start, "
    "Left its end.",
)


def check_direction(value: Any) -> str | None:
    """``value`` (a body's ``truncation_direction``; None when absent) if it names an end,
    else a 422 saying which ends there are."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(
            f"'truncation_direction' must be a string, got {json_type(value)}",
            param=TRUNCATION_DIRECTION,
        )
    if value not in DIRECTIONS:
        raise InvalidInput(
            f"'truncation_direction' {value!r} is not one of TEI's ends; send 'Right' "
            "(the default: a long text's start is kept) or 'Left' (its end is kept)",
            param=TRUNCATION_DIRECTION,
        )
    return value


def direction_parameter(direction: str | None) -> dict[str, str]:
    """The inference path's parameter for ``direction`` (a checked spelling); empty for
    the default end, the right."""
    if direction is None or DIRECTIONS[direction] == RIGHT:
        return {}
    return {TRUNCATION_DIRECTION: DIRECTIONS[direction]}

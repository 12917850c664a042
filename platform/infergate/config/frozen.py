"""The base of every settings section: unknown names refused, values never changed."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

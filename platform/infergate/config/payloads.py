"""The payload log's settings (``frontend.payloads``; the log is
``infergate.observe.payloads``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from infergate.config.frozen import Frozen


class PayloadSampling(Frozen):
    """The share of calls the payload log keeps, per role of the version that answered."""

    champion: float = Field(
        0.01, ge=0, le=1, description="Of the calls a champion answers (most of the traffic)."
    )
    canary: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Of the calls a canary answers for clients during weighted steps: it gets "
        "a small share of the traffic and is the version under scrutiny.",
    )
    shadow: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Of the mirrored requests a canary in shadow answers (already a share of "
        "the champion's, the rollout's shadow share).",
    )


class PayloadSettings(Frozen):
    """The payload log: sampled requests and answers, written by every front-end replica as
    Parquet files (``infergate payloads``)."""

    # Off unless asked for: the texts clients send may be personal data, and keeping them
    # (even hashed) is the operator's decision, as is the storage it takes.
    enabled: bool = Field(False, description="Keep a payload log.")
    sample: PayloadSampling = PayloadSampling()
    url: str | None = Field(
        None,
        description="Folder the files go to: a local path or any URL pyarrow's filesystems "
        "take (s3://bucket/prefix, gs://...). Unset: STATE_DIR/payloads.",
    )
    max_total_mb: float = Field(
        1024.0,
        gt=0,
        description="The folder's size bound, all replicas together: past it the oldest "
        "files are deleted.",
    )
    texts: Literal["keep", "hash", "drop", "redact"] = Field(
        "hash",
        description="What a record keeps of the request's texts: the texts, their SHA-256 "
        "('sha256:<hex>', enough to count and match repeats), nothing, or the texts with "
        "the entities redact_model finds replaced by their type ('[NAME]').",
    )
    redact_model: str | None = Field(
        None,
        description="With texts: redact, the served token-classification model (its "
        "champion) that finds what to redact, e.g. the demo's PII model 'ner'.",
    )
    flush_interval_s: float = Field(
        10.0, gt=0, description="How often a replica writes what it holds, as a new file."
    )
    flush_records: int = Field(
        1000, ge=1, description="... or sooner, once it holds this many records."
    )

    @model_validator(mode="after")
    def _redaction_has_a_model(self) -> PayloadSettings:
        if self.texts == "redact" and not self.redact_model:
            raise ValueError("texts: redact needs redact_model, the model that finds entities")
        return self

"""Every metric the platform records, in one place.

Front-end replicas record through Ray's metrics API, so one scrape of each node's Ray
metrics agent reaches every replica on it. Ray prefixes application metrics with
``ray_``; the Prometheus scrape config (``deployments/prometheus.yml``) renames
``ray_infergate_*`` back to ``infergate_*`` (each histogram bucket's gauge back to its
``_bucket`` series) and drops Ray's per-session labels, so the names below are the names
in Prometheus, in the dashboards and in the alert rules.

Histograms are standard Prometheus histogram series (``_bucket``/``_sum``/``_count``)
with explicit buckets; replicas sum them (and their counters) in process and hand Ray the
totals as gauges (``infergate.observe.telemetry`` says why). Label sets are bounded (model,
version, stage, status, class, entity type, feature, method, role, decision).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "infergate_"

# Fine between 1 ms and 1 s, where this platform's latencies live.
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
TOKEN_BUCKETS = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
RATIO_BUCKETS = (0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
CONFIDENCE_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0)
NORM_BUCKETS = (0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 15.0, 20.0)
TEXTS_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# 0.5: the texts without any entity (Ray refuses a bucket boundary of 0).
ENTITY_BUCKETS = (0.5, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
TERMS_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# Seconds of the Triton call per generated token (translation): a few ms on a CPU.
PER_TOKEN_BUCKETS_S = (
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
SCORE_BUCKETS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


@dataclass(frozen=True)
class Stage:
    """A stage of a request: its ``stage`` label on the duration histogram (and so in the
    dashboards), and the response header that carries its milliseconds."""

    name: str
    header: str
    spent: str  # where the time goes, for the API documentation


TOTAL = Stage("total", "x-compute-time", "in the front-end and backend, whole pipeline")
TOKENIZE = Stage("tokenize", "x-tokenization-time", "tokenizing")
INFERENCE = Stage("inference", "x-inference-time", "in the Triton call")
POSTPROCESS = Stage("postprocess", "x-postprocess-time", "post-processing")
STAGES = (TOTAL, TOKENIZE, INFERENCE, POSTPROCESS)
# Seconds a request waited for its version to be loaded into Triton (load on demand).
COLD_START_HEADER = "x-cold-start"

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class Metric:
    name: str  # without the prefix
    kind: Kind
    description: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @property
    def full_name(self) -> str:
        return PREFIX + self.name


MV = ("model", "version")

REQUESTS = Metric("requests_total", "counter", "Requests by outcome.", (*MV, "status"))
DURATION = Metric(
    "request_duration_seconds",
    "histogram",
    "Time per stage of a request, in seconds.",
    (*MV, "stage"),
    LATENCY_BUCKETS_S,
)
TEXTS = Metric("texts_total", "counter", "Texts (sequences) predicted.", MV)
TEXTS_PER_REQUEST = Metric(
    "texts_per_request", "histogram", "Texts in one request.", MV, TEXTS_BUCKETS
)
INPUT_TOKENS = Metric(
    "input_tokens", "histogram", "Tokens per text, special tokens included.", MV, TOKEN_BUCKETS
)
UNKNOWN_TOKEN_RATIO = Metric(
    "unknown_token_ratio",
    "histogram",
    "Share of a text's tokens the vocabulary does not know.",
    MV,
    RATIO_BUCKETS,
)
TRUNCATED = Metric("truncated_texts_total", "counter", "Texts cut at max length.", MV)
PREDICTED_CLASS = Metric("predicted_class_total", "counter", "Predicted classes.", (*MV, "class"))
CONFIDENCE = Metric(
    "prediction_confidence",
    "histogram",
    "Probability of the predicted class.",
    MV,
    CONFIDENCE_BUCKETS,
)
EMBEDDING_NORM = Metric(
    "embedding_norm",
    "histogram",
    "L2 norm of the raw (not normalised) embedding.",
    MV,
    NORM_BUCKETS,
)
RELEVANCE_SCORE = Metric(
    "relevance_score",
    "histogram",
    "Relevance score of a (query, text) pair, 0 to 1 (text-ranking).",
    MV,
    SCORE_BUCKETS,
)
SPARSE_TERMS = Metric(
    "sparse_terms",
    "histogram",
    "Terms with a weight above 0 in a text's sparse embedding (sparse-embedding).",
    MV,
    TERMS_BUCKETS,
)
ENTITIES_PER_TEXT = Metric(
    "entities_per_text",
    "histogram",
    "Entities found in a text, grouped as the simple strategy does (token-classification).",
    MV,
    ENTITY_BUCKETS,
)
ENTITIES = Metric(
    "entities_total",
    "counter",
    "Entities found, by type (token-classification; the simple strategy's groups).",
    (*MV, "entity"),
)
OUTPUT_TOKENS = Metric(
    "output_tokens",
    "histogram",
    "Tokens of a generated text, the end token left out (translation).",
    MV,
    TOKEN_BUCKETS,
)
DECODING_TIME_PER_TOKEN = Metric(
    "decoding_seconds_per_token",
    "histogram",
    "Seconds of a request's Triton call per token it generated (translation).",
    MV,
    PER_TOKEN_BUCKETS_S,
)
DRIFT = Metric(
    "drift_score",
    "gauge",
    "Drift of live traffic against the registration reference (PSI and friends).",
    (*MV, "feature", "method"),
)
KEY_REQUESTS = Metric(
    "api_key_requests_total",
    "counter",
    "Requests by API key id (never the key) and outcome, when API keys are on.",
    ("key", "model", "status"),
)
ROLLOUT_WEIGHT = Metric(
    "rollout_weight", "gauge", "Traffic weight of a served version, percent.", (*MV, "role")
)
ROLLOUT_DECISIONS = Metric(
    "rollout_decisions_total", "counter", "Rollout decisions taken.", ("model", "decision")
)
# A canary in shadow (infergate.control.shadow): what the replicas compared, and where
# the control plane's sequential tests stand.
SHADOW_TEXTS = Metric(
    "shadow_texts_total", "counter",
    "Texts of mirrored requests a canary in shadow answered (or failed), compared with its "
    "champion's answers.", MV,
)  # fmt: skip
SHADOW_DISAGREEMENT = Metric(
    "shadow_disagreement_total", "counter",
    "Disagreement of a canary in shadow with its champion, summed over texts (0 to 1 each); "
    "over shadow_texts_total, the share of texts it disagrees on.", MV,
)  # fmt: skip
SHADOW_REQUESTS = Metric(
    "shadow_requests_total", "counter",
    "Requests mirrored to a canary in shadow, by outcome: compared, failed, slower (than the "
    "champion on the same request), dropped (too many under way).", (*MV, "outcome"),
)  # fmt: skip
SHADOW_TESTS = Metric(
    "rollout_shadow_llr", "gauge",
    "The shadow stage's sequential tests (agreement, latency): log-likelihood ratio of a bad "
    "canary over a good one; rolled back above log((1-a)/a), passed below its negative.",
    ("model", "test"),
)  # fmt: skip
PAYLOAD_RECORDS = Metric(
    "payload_records_total", "counter",
    "Payload log records of a replica by outcome: written, dropped (the writer fell two "
    "flushes behind), failed (the write raised: a full disk, an object store away).",
    ("outcome",),
)  # fmt: skip

# Load on demand (infergate.control.residency): recorded by the control plane.
LOAD_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0)
COLD_STARTS = Metric(
    "cold_starts_total",
    "counter",
    "Loads into Triton of a served version a request asked for (load on demand).",
    MV,
)
LOAD_DURATION = Metric(
    "model_load_seconds",
    "histogram",
    "Seconds a load on demand took, eviction of what made room included.",
    MV,
    LOAD_BUCKETS_S,
)
EVICTIONS = Metric(
    "model_unloads_total",
    "counter",
    "Served versions unloaded from Triton: 'room' for a version asked for (the least recently "
    "used first), 'idle' after triton.idle_unload_s.",
    ("reason",),
)
LOADED_VERSIONS = Metric(
    "loaded_versions", "gauge", "Served versions loaded in the fullest Triton now.", ()
)  # fmt: skip
RESIDENCY = (COLD_STARTS, LOAD_DURATION, EVICTIONS, LOADED_VERSIONS)

# What the front-end replicas record; the control plane counts the rollout decisions.
FRONTEND = (
    REQUESTS,
    DURATION,
    TEXTS,
    TEXTS_PER_REQUEST,
    INPUT_TOKENS,
    UNKNOWN_TOKEN_RATIO,
    TRUNCATED,
    PREDICTED_CLASS,
    CONFIDENCE,
    EMBEDDING_NORM,
    RELEVANCE_SCORE,
    SPARSE_TERMS,
    ENTITIES_PER_TEXT,
    ENTITIES,
    OUTPUT_TOKENS,
    DECODING_TIME_PER_TOKEN,
    DRIFT,
    KEY_REQUESTS,
    ROLLOUT_WEIGHT,
    SHADOW_TEXTS,
    SHADOW_DISAGREEMENT,
    SHADOW_REQUESTS,
    PAYLOAD_RECORDS,
)
ALL = (*FRONTEND, ROLLOUT_DECISIONS, SHADOW_TESTS, *RESIDENCY)

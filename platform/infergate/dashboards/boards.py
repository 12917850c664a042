"""The infergate dashboards: Overview, Model, Rollout (here) and Backend (``backend.py``).

Front-end metrics are recorded per replica (Ray keeps a ``WorkerId`` label), so every
query aggregates over replicas: counters and buckets are summed after ``rate()``, gauges
(drift, weights) take the worst or only replica with ``max``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from infergate.dashboards.backend import backend
from infergate.dashboards.builders import Dashboard, Panel, Query, Row, Threshold, Variable
from infergate.dashboards.promql import (
    MODEL_VERSION,
    RATE,
    heatmap,
    mean,
    quantile,
    rate,
    ratio,
    selector,
    sum_by,
)
from infergate.observe import metrics as m

MV = "model, version"
MV_LEGEND = "{{model}} v{{version}}"
MODEL_ONLY = ('model=~"$model"',)
MODEL_VAR = Variable("model", "Model", f"label_values({m.REQUESTS.full_name}, model)")
VERSION_VAR = Variable(
    "version", "Version", f'label_values({m.REQUESTS.full_name}{{model=~"$model"}}, version)'
)
LATENCY_SLO = (Threshold(0.25, "red"),)  # the p99 alert of deployments/alerts.yml
PSI_THRESHOLDS = (Threshold(0.1, "orange"), Threshold(0.25, "red"))  # the drift alerts
TOTAL = 'stage="total"'
PSI = 'method="psi"'
NOT_PSI = 'method!="psi"'


def per_version(metric: str, *matchers: str) -> Query:
    """Per-second rate of a counter, per model version."""
    return Query(sum_by(MV, rate(metric, *MODEL_VERSION, *matchers)), MV_LEGEND)


def percentiles(histogram: m.Metric, qs: tuple[float, ...], *matchers: str) -> tuple[Query, ...]:
    return tuple(
        Query(quantile(q, histogram, MV, *matchers), f"p{round(q * 100)} {MV_LEGEND}") for q in qs
    )


def error_rate(*matchers: str) -> str:
    """Share of requests answered 5xx, per model version; 0 (not "no data") when a
    version had no 5xx at all, since its 5xx series then does not exist."""
    total = sum_by(MV, rate(m.REQUESTS.full_name, *matchers))
    errors = sum_by(MV, rate(m.REQUESTS.full_name, *matchers, 'status=~"5.."'))
    return ratio(f"({errors} or 0 * {total})", total)


def class_shares(*matchers: str) -> str:
    """Share of each predicted class among a version's texts."""
    per_class = sum_by(f"{MV}, class", rate(m.PREDICTED_CLASS.full_name, *matchers))
    total = sum_by(MV, rate(m.PREDICTED_CLASS.full_name, *matchers))
    return f"{per_class}\n  / ignoring (class) group_left\n  {total}"


def entity_shares(*matchers: str) -> str:
    """Share of each entity type among a version's entities."""
    per_type = sum_by(f"{MV}, entity", rate(m.ENTITIES.full_name, *matchers))
    total = sum_by(MV, rate(m.ENTITIES.full_name, *matchers))
    return f"{per_type}\n  / ignoring (entity) group_left\n  {total}"


def drift(matcher: str) -> str:
    by = "model, version, feature" + ("" if matcher == PSI else ", method")
    return f"max by ({by}) ({selector(m.DRIFT.full_name, *MODEL_VERSION, matcher)})"


# -- the key panels, also rendered to PNG by `infergate dashboards snapshot` -------------

REQUESTS_PER_SECOND = Panel(
    "Requests per second",
    (per_version(m.REQUESTS.full_name),),
    unit="reqps",
    width=8,
    description="All requests that reached a model version, any outcome.",
)
LATENCY_PERCENTILES = Panel(
    "Latency p50 / p95 / p99 (whole request)",
    percentiles(m.DURATION, (0.5, 0.95, 0.99), *MODEL_VERSION, TOTAL),
    unit="s",
    thresholds=LATENCY_SLO,
    description="From the request_duration_seconds buckets, stage total; the line is the "
    "p99 alert threshold.",
)
CLASS_DISTRIBUTION = Panel(
    "Predicted class distribution",
    (Query(class_shares(*MODEL_VERSION), MV_LEGEND + " {{class}}"),),
    unit="percentunit",
    min_value=0,
    description="Share of each predicted class (text-classification versions).",
)
DRIFT_PSI = Panel(
    "Drift (PSI against the registration reference)",
    (Query(drift(PSI), MV_LEGEND + " {{feature}}"),),
    thresholds=PSI_THRESHOLDS,
    min_value=0,
    description="Population stability index per feature, worst replica; 0.1 moderate, "
    "0.25 major drift (the alert levels).",
)
KEY_PANELS = (REQUESTS_PER_SECOND, LATENCY_PERCENTILES, CLASS_DISTRIBUTION, DRIFT_PSI)


def overview() -> Dashboard:
    """Traffic, errors and latency of every model version."""
    traffic = (
        REQUESTS_PER_SECOND,
        Panel(
            "Error rate (5xx share)",
            (Query(error_rate(*MODEL_VERSION), MV_LEGEND),),
            unit="percentunit",
            width=8,
            min_value=0,
            thresholds=(Threshold(0.05, "red"),),
            description="The line is the error-rate alert threshold (5% for 5 minutes).",
        ),
        Panel(
            "Sequences per second",
            (per_version(m.TEXTS.full_name),),
            width=8,
            description="Texts predicted per second (a request may carry several).",
        ),
        Panel(
            "Responses by status",
            (Query(sum_by("status", rate(m.REQUESTS.full_name, *MODEL_VERSION)), "{{status}}"),),
            unit="reqps",
            stacking="normal",
        ),
        Panel(
            "Texts per request (p50 / p95)",
            percentiles(m.TEXTS_PER_REQUEST, (0.5, 0.95), *MODEL_VERSION),
        ),
    )
    latency = (
        LATENCY_PERCENTILES,
        Panel(
            "Latency heatmap (whole request)",
            (Query(heatmap(m.DURATION, *MODEL_VERSION, TOTAL)),),
            kind="heatmap",
            unit="s",
        ),
        Panel(
            "p95 latency by stage",
            (
                Query(
                    quantile(0.95, m.DURATION, "stage", *MODEL_VERSION, 'stage!="total"'),
                    "{{stage}}",
                ),
            ),
            unit="s",
            description="The stages of the x-*-time response headers.",
        ),
    )
    return Dashboard(
        "infergate-overview",
        "infergate / Overview",
        "Requests, errors and latency per model and version.",
        (Row("Traffic", traffic), Row("Latency", latency)),
        (MODEL_VAR, VERSION_VAR),
    )


def model() -> Dashboard:
    """What a model sees and answers, and how far that is from its reference."""
    mv = MODEL_VERSION
    outputs = (
        CLASS_DISTRIBUTION,
        Panel(
            "Confidence of the predicted class",
            (Query(heatmap(m.CONFIDENCE, *mv)),),
            kind="heatmap",
            unit="percentunit",
        ),
        Panel(
            "Mean confidence",
            (Query(mean(m.CONFIDENCE, MV, *mv), MV_LEGEND),),
            unit="percentunit",
        ),
        Panel(
            "Embedding norm (raw, before normalisation)",
            (Query(heatmap(m.EMBEDDING_NORM, *mv)),),
            kind="heatmap",
            description="feature-extraction versions.",
        ),
        Panel(
            "Relevance score (text-ranking)",
            (Query(heatmap(m.RELEVANCE_SCORE, *mv)),),
            kind="heatmap",
            unit="percentunit",
            description="Score of each (query, text) pair a cross-encoder ranked, 0 to 1.",
        ),
        Panel(
            "Sparse terms per text (p50 / p95, sparse-embedding)",
            percentiles(m.SPARSE_TERMS, (0.5, 0.95), *mv),
            description="Vocabulary terms with a weight above 0 in a text's SPLADE vector.",
        ),
        Panel(
            "Entities per text (p50 / p95, token-classification)",
            percentiles(m.ENTITIES_PER_TEXT, (0.5, 0.95), *mv),
            description="Entities found in a text, grouped as the simple strategy does.",
        ),
        Panel(
            "Entity types (token-classification)",
            (Query(entity_shares(*mv), MV_LEGEND + " {{entity}}"),),
            unit="percentunit",
            min_value=0,
            description="Share of each entity type among the entities found.",
        ),
        Panel(
            "Output tokens per text (p50 / p95, translation)",
            percentiles(m.OUTPUT_TOKENS, (0.5, 0.95), *mv),
            description="Tokens of each generated text, end token left out.",
        ),
        Panel(
            "Decoding time per output token (p50 / p95, translation)",
            percentiles(m.DECODING_TIME_PER_TOKEN, (0.5, 0.95), *mv),
            unit="s",
            description="A request's Triton call (CTranslate2) divided by the tokens it generated.",
        ),
    )
    inputs = (
        Panel(
            "Tokens per text (p50 / p95)", percentiles(m.INPUT_TOKENS, (0.5, 0.95), *mv), width=8
        ),
        Panel(
            "Unknown-token ratio (mean)",
            (Query(mean(m.UNKNOWN_TOKEN_RATIO, MV, *mv), MV_LEGEND),),
            unit="percentunit",
            width=8,
            description="Share of tokens the vocabulary does not know: new words, other "
            "languages, broken encodings.",
        ),
        Panel(
            "Truncated texts",
            (
                Query(
                    ratio(
                        sum_by(MV, rate(m.TRUNCATED.full_name, *mv)),
                        sum_by(MV, rate(m.TEXTS.full_name, *mv)),
                    ),
                    MV_LEGEND,
                ),
            ),
            unit="percentunit",
            width=8,
            description="Share of texts cut at the model's max length.",
        ),
    )
    scores = (
        DRIFT_PSI,
        Panel(
            "Other drift scores",
            (Query(drift(NOT_PSI), MV_LEGEND + " {{feature}} {{method}}"),),
            description="unknown_token_ratio ratio_delta: live mean minus reference mean; "
            "centroid cosine_distance: 0 same direction, 2 opposite.",
        ),
    )
    return Dashboard(
        "infergate-model",
        "infergate / Model",
        "Inputs, outputs and drift of one model's versions.",
        (
            Row("Outputs", outputs),
            Row("Inputs", inputs),
            Row("Drift against the registration reference", scores),
        ),
        (MODEL_VAR, VERSION_VAR),
    )


def _with_role(expr: str, role: str) -> str:
    """Keep the series of the version that currently has ``role``."""
    weight = selector(m.ROLLOUT_WEIGHT.full_name, *MODEL_ONLY, f'role="{role}"')
    return f"({expr})\n  and on (model, version) max by (model, version) ({weight})"


def rollout() -> Dashboard:
    """Champion and canary side by side, and what the rollout decided.

    No ``version`` variable: the roles pick the versions.
    """
    weights = selector(m.ROLLOUT_WEIGHT.full_name, *MODEL_ONLY)
    decisions = selector(m.ROLLOUT_DECISIONS.full_name, *MODEL_ONLY)
    split = (
        Panel(
            "Traffic weight",
            (Query(f"max by (model, version, role) ({weights})", MV_LEGEND + " ({{role}})"),),
            unit="percent",
            min_value=0,
            max_value=100,
        ),
        Panel(
            "Rollout decisions",
            (Query(sum_by("model, decision", f"increase({decisions}[{RATE}])"), "{{decision}}"),),
            bars=True,
            description="advance, promote, rollback, hold, wait: what the analysis decided.",
        ),
    )
    compared: list[Panel] = []
    for title, expr, legend, unit in (
        ("error rate", error_rate(*MODEL_ONLY), MV_LEGEND, "percentunit"),
        ("p95 latency", quantile(0.95, m.DURATION, MV, *MODEL_ONLY, TOTAL), MV_LEGEND, "s"),
        ("class distribution", class_shares(*MODEL_ONLY), MV_LEGEND + " {{class}}", "percentunit"),
    ):
        compared += [
            Panel(
                f"{role.capitalize()}: {title}",
                (Query(_with_role(expr, role), legend),),
                unit=unit,
                min_value=0,
            )
            for role in ("champion", "canary")  # champion left, canary right
        ]
    return Dashboard(
        "infergate-rollout",
        "infergate / Rollout",
        "Champion (left) against canary (right) while a canary rolls out.",
        (
            Row("Traffic split", split),
            Row("Shadow stage", shadow_panels()),
            Row("Champion vs canary", tuple(compared)),
            Row("Payload log", (payload_panel(),)),
        ),
        (MODEL_VAR,),
    )


def shadow_panels() -> tuple[Panel, ...]:
    """A canary in shadow: how often it agrees with its champion on the same texts, what
    became of the mirrored requests, and where the sequential tests stand."""
    texts = rate(m.SHADOW_TEXTS.full_name, *MODEL_ONLY)
    disagreement = rate(m.SHADOW_DISAGREEMENT.full_name, *MODEL_ONLY)
    agreement = f"1 - {ratio(sum_by(MV, disagreement), sum_by(MV, texts))}"
    outcomes = sum_by("model, outcome", rate(m.SHADOW_REQUESTS.full_name, *MODEL_ONLY))
    tests = f"max by (model, test) ({selector(m.SHADOW_TESTS.full_name, *MODEL_ONLY)})"
    bound = math.log(99)  # the default false_rollback, 1 %
    return (
        Panel(
            "Shadow agreement",
            (Query(agreement, MV_LEGEND),),
            unit="percentunit",
            min_value=0,
            max_value=1,
            description="Share of mirrored texts on which the canary's answer agrees with the "
            "champion's answer to the same text (the task's measure).",
            width=8,
        ),
        Panel(
            "Mirrored requests",
            (Query(outcomes, "{{model}} {{outcome}}"),),
            unit="reqps",
            description="compared, failed, slower than the champion, dropped (replica busy).",
            width=8,
        ),
        Panel(
            "Sequential tests",
            (Query(tests, "{{model}} {{test}}"),),
            thresholds=(Threshold(-bound, "green"), Threshold(bound, "red")),
            base_color="blue",
            description=f"Log-likelihood ratio of a bad canary over a good one: rolled back "
            f"above {bound:.1f}, passed below {-bound:.1f} (false_rollback 1 %).",
            width=8,
        ),
    )


def payload_panel() -> Panel:
    """What became of the payload log's records: a rollout's figures can be recomputed
    from the log only while none are lost."""
    records = sum_by("outcome", rate(m.PAYLOAD_RECORDS.full_name))
    return Panel(
        "Payload log records",
        (Query(records, "{{outcome}}"),),
        unit="cps",
        min_value=0,
        description="Records the replicas wrote, dropped (the writer fell behind) or lost "
        "to a failed write (docs/monitoring.md, Payload log).",
    )


# File name (without .json) -> dashboard.
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "overview": overview,
    "model": model,
    "rollout": rollout,
    "backend": lambda: backend((MODEL_VAR, VERSION_VAR)),
}

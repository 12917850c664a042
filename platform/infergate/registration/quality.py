"""What a client of each task feels of an optimised model, and the budget it must meet.

Parity (``infergate.registration.parity``) catches a broken graph on a few sample texts. Quality is
measured on the reference texts, hundreds of them, against the original PyTorch model, in
the figures a user of the task would notice: for embeddings the cosine to the original
and whether each text keeps its nearest neighbours among the others (what retrieval
returns); for classifiers whether labels stay and how far probabilities move; for a
reranker whether pairs keep their order. A budget sets a floor (or, for a change, a
ceiling) on some of them; registration keeps the fastest setting that meets it
(``infergate.registration.quantise``) and records the figures with the version.

Pure: numpy and the post-processing functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from infergate.serving.postprocess import l2_normalize, softmax
from infergate.tasks import TASKS
from infergate.tasks.ranking import relevance

NEIGHBOURS = 10  # recall@k of the nearest neighbours


@dataclass(frozen=True)
class Figure:
    """One quality figure: what it says, and which way is better."""

    description: str
    higher_is_better: bool = True


FIGURES: dict[str, Figure] = {
    "cosine_mean": Figure("mean cosine similarity to the original's output"),
    "cosine_worst": Figure("lowest cosine similarity to the original's output"),
    "nn_agreement": Figure("share of texts whose nearest neighbour is the original's"),
    "recall_at_10": Figure(f"share of the original's {NEIGHBOURS} nearest neighbours kept"),
    "label_agreement": Figure("share of labels (per text, or per token) the same"),
    "probability_max_change": Figure("largest change of a probability", False),
    "probability_mean_change": Figure("mean change of the top label's probability", False),
    "score_max_change": Figure("largest change of a relevance score", False),
    "rank_agreement": Figure("share of pairs of texts kept in the same order"),
}

# What a registration must meet unless told otherwise, by the graph's output: each task's
# quality_budget.
DEFAULT_BUDGETS: dict[str, dict[str, float]] = {
    task.output_name: dict(task.quality_budget) for task in TASKS.values() if task.quality_budget
}


@dataclass(frozen=True)
class Budget:
    """Limits on quality figures: a floor for a figure where higher is better, else a
    ceiling. Empty: anything passes."""

    limits: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def default(cls, output_name: str) -> Budget:
        return cls(dict(DEFAULT_BUDGETS.get(output_name, {})))

    @classmethod
    def parse(cls, text: str, output_name: str) -> Budget:
        """``"default"``, ``"none"`` or ``"name=value,name=value"`` (names of ``FIGURES``).

        Raises:
            ValueError: an unknown figure, or a value that is not a number.
        """
        text = text.strip()
        if text in ("", "default"):
            return cls.default(output_name)
        if text == "none":
            return cls()
        limits: dict[str, float] = {}
        for item in text.split(","):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in FIGURES:
                raise ValueError(
                    f"quality budget item {item.strip()!r} is not NAME=VALUE with NAME one of "
                    f"{sorted(FIGURES)}; or use 'default' or 'none'"
                )
            try:
                limits[name] = float(value)
            except ValueError:
                raise ValueError(f"quality budget {name}={value!r}: not a number") from None
        return cls(limits)

    def misses(self, figures: Mapping[str, float]) -> list[str]:
        """Each limit ``figures`` does not meet, as ``"nn_agreement 0.897 < 0.97"``. A
        figure the task does not measure is a miss: the budget names the wrong task."""
        missed = []
        for name, limit in self.limits.items():
            value = figures.get(name)
            if value is None:
                missed.append(f"{name} is not measured for this task ({sorted(figures)})")
            elif FIGURES[name].higher_is_better and not value >= limit:  # NaN misses
                missed.append(f"{name} {value:.4g} < {limit:g}")
            elif not FIGURES[name].higher_is_better and not value <= limit:
                missed.append(f"{name} {value:.4g} > {limit:g}")
        return missed

    def describe(self) -> str:
        if not self.limits:
            return "none"
        return ", ".join(
            f"{name} {'>=' if FIGURES[name].higher_is_better else '<='} {limit:g}"
            for name, limit in self.limits.items()
        )


def measure(output_name: str, original: np.ndarray, optimised: np.ndarray) -> dict[str, float]:
    """The task's quality figures of ``optimised`` against ``original``: ``[texts, n]``
    outputs (``[tokens, labels]`` rows for token classification), the same texts in the
    same order."""
    if original.shape != optimised.shape:
        raise ValueError(f"output shapes differ: {original.shape} and {optimised.shape}")
    ref, got = original.astype(np.float64), optimised.astype(np.float64)
    if output_name in ("embeddings", "term_weights"):
        return _vectors(ref, got)
    if output_name == "scores":
        ref_scores, got_scores = relevance(ref)[0], relevance(got)[0]
        return {
            "score_max_change": float(np.abs(ref_scores - got_scores).max()),
            "rank_agreement": rank_agreement(ref_scores, got_scores),
        }
    ref_p, got_p = softmax(ref), softmax(got)
    top = ref_p.argmax(axis=1)
    rows = np.arange(len(top))
    return {
        "label_agreement": float((top == got_p.argmax(axis=1)).mean()),
        "probability_max_change": float(np.abs(ref_p - got_p).max()),
        "probability_mean_change": float(np.abs(ref_p[rows, top] - got_p[rows, top]).mean()),
    }


def _vectors(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    ref_unit, got_unit = l2_normalize(ref), l2_normalize(got)
    cosines = (ref_unit * got_unit).sum(axis=1)
    figures = {"cosine_mean": float(cosines.mean()), "cosine_worst": float(cosines.min())}
    if len(ref) >= 3:  # a nearest neighbour among at least two others
        ref_sim, got_sim = ref_unit @ ref_unit.T, got_unit @ got_unit.T
        np.fill_diagonal(ref_sim, -np.inf)
        np.fill_diagonal(got_sim, -np.inf)
        figures["nn_agreement"] = float((ref_sim.argmax(1) == got_sim.argmax(1)).mean())
        if len(ref) > NEIGHBOURS:
            k = NEIGHBOURS
            ref_top = np.argpartition(-ref_sim, k, axis=1)[:, :k]
            got_top = np.argpartition(-got_sim, k, axis=1)[:, :k]
            kept = [len(set(a) & set(b)) for a, b in zip(ref_top, got_top, strict=True)]
            figures["recall_at_10"] = float(np.mean(kept) / k)
    return figures


def rank_agreement(ref: np.ndarray, got: np.ndarray) -> float:
    """Share of pairs of samples that both score in the same order (Kendall's concordance),
    what a reranker's client sees; 1.0 with fewer than two samples."""
    i, j = np.triu_indices(len(ref), k=1)
    if not len(i):
        return 1.0
    return float((np.sign(ref[i] - ref[j]) == np.sign(got[i] - got[j])).mean())


@dataclass(frozen=True)
class Attempt:
    """One setting tried at registration, with its figures and what it missed."""

    setting: str
    figures: dict[str, float]
    misses: list[str]


@dataclass(frozen=True)
class QualityReport:
    """The setting kept, why, and every setting tried; stored with the version."""

    setting: str
    budget: str
    n_texts: int
    attempts: list[Attempt]

    @property
    def figures(self) -> dict[str, float]:
        return next(a.figures for a in self.attempts if a.setting == self.setting)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in self.figures.items())
        return f"{self.setting}: {shown} over {self.n_texts} reference texts"

"""chrF, the character n-gram F-score, and the exact-match rate: how far one translation
system's outputs are from another's.

chrF is defined in Maja Popović, "chrF: character n-gram F-score for automatic MT
evaluation", WMT 2015 (https://aclanthology.org/W15-3049/): character n-grams of orders
1 to 6, whitespace removed, precision and recall each averaged over the orders, then
combined as an F-score with beta 2 (recall weighs twice as much). Corpus-level, as
sacreBLEU computes it by default: n-gram counts are summed over all sentences before the
precisions and recalls are taken. Scale 0 to 100.

Pure Python; no dependency.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

CHAR_ORDER = 6
BETA = 2.0


def _ngrams(text: str, n: int) -> Counter[str]:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def chrf(hypotheses: Sequence[str], references: Sequence[str], order: int = CHAR_ORDER) -> float:
    """Corpus chrF (0-100) of ``hypotheses`` against ``references``, one reference each.

    Orders no text is long enough for are left out of the averages; if none is left (all
    texts empty), the score is 100 when every hypothesis equals its reference, else 0.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    matches, hyp_total, ref_total = [0] * order, [0] * order, [0] * order
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        hyp, ref = "".join(hypothesis.split()), "".join(reference.split())
        for n in range(1, order + 1):
            hyp_grams, ref_grams = _ngrams(hyp, n), _ngrams(ref, n)
            matches[n - 1] += sum((hyp_grams & ref_grams).values())
            hyp_total[n - 1] += sum(hyp_grams.values())
            ref_total[n - 1] += sum(ref_grams.values())
    precisions, recalls = [], []
    for n in range(order):
        if hyp_total[n] == 0 and ref_total[n] == 0:
            continue  # no text has n characters: this order says nothing
        precisions.append(matches[n] / hyp_total[n] if hyp_total[n] else 0.0)
        recalls.append(matches[n] / ref_total[n] if ref_total[n] else 0.0)
    if not precisions:
        return 100.0 if list(hypotheses) == list(references) else 0.0
    precision, recall = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    if precision + recall == 0:
        return 0.0
    beta2 = BETA * BETA
    return 100.0 * (1 + beta2) * precision * recall / (beta2 * precision + recall)


def exact_match_rate(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Share of hypotheses equal to their reference, 0 to 1."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not hypotheses:
        raise ValueError("exact match of no texts")
    same = sum(h == r for h, r in zip(hypotheses, references, strict=True))
    return same / len(hypotheses)

"""Quality metrics of the benchmarks, as pure functions (see DESIGN.md, "Quality metrics").

- `f1_score` / `max_f1`: SQuAD token F1 after SQuAD normalisation (lowercase, drop punctuation and the
  articles a/an/the, collapse whitespace), maximised over the gold answers.
- `kl_divergence(p_logits, q_logits)`: KL(p ‖ q) of the two next-token distributions from their (float32)
  logits, in float64: the calibration's own (app/calibration/scoring.py), so a benchmark's KL and a
  calibration record's are the same figure.
- `benefit_retained`: how much of the context's NLL improvement a method keeps, computed means-first:
  (mean NLL_no_context − mean NLL_method) ÷ (mean NLL_no_context − mean NLL_full).
- `bootstrap_interval`: a percentile interval of any statistic of the examples, by resampling the examples
  with replacement (seeded). A ratio of means over 20 examples moves by several hundredths from one draw
  of examples to the next; the interval says whether a figure's distance from a target is more than that.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from app.calibration.scoring import kl_divergence as kl_divergence  # the one KL (re-exported)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, strip punctuation, remove articles, collapse whitespace."""
    lowered = text.lower()
    no_punct = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punct)
    return " ".join(no_articles.split())


def f1_score(prediction: str, reference: str) -> float:
    """Token F1 of two strings after normalisation. Two empty answers agree (1.0); one empty gives 0.0."""
    pred_tokens = normalize_answer(prediction).split()
    ref_tokens = normalize_answer(reference).split()
    if not pred_tokens or not ref_tokens:
        return float(pred_tokens == ref_tokens)
    num_same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def max_f1(prediction: str, references: Sequence[str]) -> float:
    """Best F1 of `prediction` against any of the gold answers (0.0 when there are none)."""
    return max((f1_score(prediction, ref) for ref in references), default=0.0)


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; NaN for no values (so an empty mode is visible, not zero)."""
    items = list(values)
    return math.fsum(items) / len(items) if items else math.nan


def mean_token_nll(token_nlls: Sequence[float]) -> float:
    """Mean per-token NLL of one teacher-forced answer."""
    if not token_nlls:
        raise ValueError("an answer has at least one token")
    return math.fsum(token_nlls) / len(token_nlls)


def benefit_retained(nll_no_context: float, nll_full: float, nll_method: float) -> float:
    """(NLL_no_context − NLL_method) ÷ (NLL_no_context − NLL_full); pass the *mean* NLLs (means first).

    1.0: the method keeps all of what the context gave full prefill; 0.0: as if it had no context.
    NaN when the context did not help full prefill at all (the ratio is undefined).
    """
    gain_full = nll_no_context - nll_full
    if gain_full == 0:
        return math.nan
    return (nll_no_context - nll_method) / gain_full


def agreement(a: Sequence[object], b: Sequence[object]) -> float:
    """Share of positions where two equally long sequences hold equal items (e.g. greedy answers)."""
    if len(a) != len(b):
        raise ValueError(f"sequences differ in length: {len(a)} vs {len(b)}")
    if not a:
        return math.nan
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) like numpy's default; NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    items = sorted(values)
    if not items:
        return math.nan
    rank = (len(items) - 1) * q / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(items) - 1)
    return items[lo] + (items[hi] - items[lo]) * (rank - lo)


def bootstrap_interval(
    statistic: Callable[[Sequence[int]], float],
    num_examples: int,
    *,
    num_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over `num_examples` examples.

    `statistic` gets a list of example indices (a resample, with repeats) and returns the figure computed
    on those examples, e.g. a means-first ratio. Every mode of a run is resampled with the same seed, so
    the intervals are paired: the same draws of examples for each mode. Resamples whose statistic is NaN
    (e.g. a ratio whose denominator vanished on that draw) are left out; (NaN, NaN) if all are.
    """
    if num_examples < 1:
        raise ValueError("a bootstrap needs at least one example")
    if not 0 < level < 1:
        raise ValueError(f"level must be within (0, 1), got {level}")
    rng = random.Random(seed)
    values = []
    for _ in range(num_resamples):
        value = statistic([rng.randrange(num_examples) for _ in range(num_examples)])
        if not math.isnan(value):
            values.append(value)
    tail = (1 - level) / 2 * 100
    return percentile(values, tail), percentile(values, 100 - tail)

from __future__ import annotations

import math

import pytest
import torch

from bench.metrics import (
    agreement,
    benefit_retained,
    bootstrap_interval,
    f1_score,
    kl_divergence,
    max_f1,
    mean,
    mean_token_nll,
    normalize_answer,
    percentile,
)


def test_normalize_answer_squad_rules() -> None:
    assert normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    # articles only as whole words: "theater" and "analog" keep their letters
    assert normalize_answer("Theater analog") == "theater analog"
    assert normalize_answer("  \t\n") == ""


def test_f1_known_values() -> None:
    assert f1_score("Exeter College", "Exeter College") == 1.0
    assert f1_score("the Exeter College, Oxford", "Exeter College") == pytest.approx(0.8)  # p=2/3, r=1
    assert f1_score("Paris", "London") == 0.0
    # p = 1/2, r = 1/3 -> 2·(1/6)/(5/6) = 0.4
    assert f1_score("barack obama", "president barack h") == pytest.approx(0.4)
    # repeated tokens count once per occurrence in both (Counter intersection): common = 1, p=1/2, r=1
    assert f1_score("yes yes", "yes") == pytest.approx(2 / 3)


def test_f1_empty_answers() -> None:
    assert f1_score("", "") == 1.0
    assert f1_score("the", "") == 1.0  # both normalise to nothing
    assert f1_score("", "Paris") == 0.0
    assert f1_score("Paris", "") == 0.0


def test_max_f1_over_answers() -> None:
    assert max_f1("Wilhelm Röntgen", ["Wilhelm Conrad Röntgen", "Röntgen"]) == pytest.approx(0.8)
    assert max_f1("x", []) == 0.0


def test_kl_identical_is_zero() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1000)
    assert kl_divergence(logits, logits.clone()) == 0.0
    # a constant shift of the logits leaves the distribution unchanged
    assert kl_divergence(logits, logits + 3.0) == pytest.approx(0.0, abs=1e-6)


def test_kl_hand_computed() -> None:
    p = torch.tensor([0.5, 0.5])
    q = torch.tensor([0.9, 0.1])
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # 0.5108256…
    assert kl_divergence(p.log(), q.log()) == pytest.approx(expected, rel=1e-6)
    # asymmetric: KL(q ‖ p) differs
    reverse = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)  # 0.3680642…
    assert kl_divergence(q.log(), p.log()) == pytest.approx(reverse, rel=1e-6)


def test_kl_zero_probability_terms() -> None:
    p = torch.tensor([0.0, float("-inf")])  # p = (1, 0)
    q = torch.tensor([0.0, 0.0])  # q = (1/2, 1/2)
    assert kl_divergence(p, q) == pytest.approx(math.log(2), rel=1e-6)
    assert kl_divergence(q, p) == math.inf


def test_kl_rejects_shapes() -> None:
    with pytest.raises(ValueError):
        kl_divergence(torch.zeros(3), torch.zeros(4))


def test_benefit_retained_math() -> None:
    # no context 3.0, full 1.0: a method at 1.5 keeps (3 - 1.5) / (3 - 1) = 0.75
    assert benefit_retained(3.0, 1.0, 1.5) == pytest.approx(0.75)
    assert benefit_retained(3.0, 1.0, 1.0) == 1.0
    assert benefit_retained(3.0, 1.0, 3.0) == 0.0
    assert benefit_retained(3.0, 1.0, 4.0) == pytest.approx(-0.5)  # worse than no context
    assert math.isnan(benefit_retained(2.0, 2.0, 1.0))


def test_benefit_retained_is_means_first() -> None:
    nc, full, method = [4.0, 2.0], [1.0, 1.9], [2.0, 1.95]
    means_first = benefit_retained(mean(nc), mean(full), mean(method))
    # (3 - 1.975) / (3 - 1.45) = 1.025 / 1.55
    assert means_first == pytest.approx(1.025 / 1.55)
    ratio_of_each = mean(benefit_retained(a, b, c) for a, b, c in zip(nc, full, method, strict=True))
    assert ratio_of_each != pytest.approx(means_first)  # (2/3 + 0.5) / 2 = 0.5833…


def test_means_and_nll() -> None:
    assert mean([1.0, 2.0, 4.0]) == pytest.approx(7 / 3)
    assert math.isnan(mean([]))
    assert mean_token_nll([0.5, 1.5, 1.0]) == 1.0
    with pytest.raises(ValueError):
        mean_token_nll([])


def test_agreement_and_percentile() -> None:
    assert agreement(["a", "b", "c", "d"], ["a", "x", "c", "y"]) == 0.5
    with pytest.raises(ValueError):
        agreement([1], [1, 2])
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert math.isnan(percentile([], 50))


def test_bootstrap_interval_of_two_examples_spans_both() -> None:
    # a resample of [0, 1] has mean 0, 0.5 or 1 (a quarter of draws each at the ends): the 95% interval is [0, 1]
    values = [0.0, 1.0]
    assert bootstrap_interval(lambda ids: mean(values[i] for i in ids), 2) == (0.0, 1.0)


def test_bootstrap_interval_narrows_around_the_statistic() -> None:
    values = [float(i % 2) for i in range(200)]  # mean 0.5, standard error ≈ 0.035
    lo, hi = bootstrap_interval(lambda ids: mean(values[i] for i in ids), len(values))
    assert 0.4 < lo < 0.5 < hi < 0.6
    # seeded: the same draws every time, so every mode of a run is resampled alike (paired intervals)
    assert bootstrap_interval(lambda ids: mean(values[i] for i in ids), len(values)) == (lo, hi)
    assert bootstrap_interval(lambda ids: 0.25, len(values)) == (0.25, 0.25)


def test_bootstrap_interval_leaves_out_undefined_resamples() -> None:
    # undefined (NaN) whenever the resample holds example 0: the interval comes from the others
    values = [5.0, 1.0, 1.0]
    lo, hi = bootstrap_interval(lambda ids: math.nan if 0 in ids else mean(values[i] for i in ids), 3)
    assert (lo, hi) == (1.0, 1.0)
    assert all(math.isnan(x) for x in bootstrap_interval(lambda ids: math.nan, 3))
    with pytest.raises(ValueError):
        bootstrap_interval(lambda ids: 0.0, 0)
    with pytest.raises(ValueError):
        bootstrap_interval(lambda ids: 0.0, 3, level=1.0)

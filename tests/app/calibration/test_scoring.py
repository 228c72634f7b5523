"""The one answer check and the one first-token KL, shared by calibration and bench."""

from __future__ import annotations

import math

import pytest
import torch

from app.calibration.scoring import is_right, kl_divergence, normalized
from bench.metrics import kl_divergence as bench_kl


def test_the_answer_check_compares_letters_and_digits_only() -> None:
    assert normalized("Code: QX-7741.") == "codeqx7741"
    assert is_right("The access code is qx 7741.", "QX-7741")
    assert not is_right("QX-7714", "QX-7741")
    assert is_right("It opens on 3 March.", "3 March") and not is_right("It opens in March.", "3 March")


def test_kl_is_the_float64_divergence_and_bench_reads_the_same_function() -> None:
    p = torch.log(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))
    q = torch.log(torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64))
    assert kl_divergence(p, q) == pytest.approx(0.5 * math.log(2) + 0.25 * math.log(0.5), abs=1e-12)
    assert kl_divergence(p, p) == 0.0
    assert bench_kl is kl_divergence
    with pytest.raises(ValueError, match="vocab"):
        kl_divergence(p, q[:2])

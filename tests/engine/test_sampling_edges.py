"""Sampling parameters at the edges of float32 never crash: they degrade to greedy / the top token."""

from __future__ import annotations

import torch

from engine.sampling import Sampler
from engine.types import SamplingParams


def _logits() -> torch.Tensor:
    logits = torch.linspace(-5.0, 5.0, 50)
    logits[17] = 30.0  # the clear argmax
    return logits


def test_near_zero_temperature_is_greedy() -> None:
    params = SamplingParams(temperature=1e-40, seed=3)
    assert params.greedy
    assert Sampler(params, torch.device("cpu"))(_logits()) == 17


def test_tiny_top_p_keeps_the_top_token() -> None:
    for top_p in (1e-300, 1e-45, 1e-8):
        sampler = Sampler(SamplingParams(temperature=1.0, top_p=top_p, seed=5), torch.device("cpu"))
        assert [sampler(_logits()) for _ in range(5)] == [17] * 5


def test_small_but_real_temperature_still_samples() -> None:
    params = SamplingParams(temperature=0.5, seed=0)
    assert not params.greedy
    flat = torch.zeros(50)
    picks = {Sampler(SamplingParams(temperature=0.5, seed=s), torch.device("cpu"))(flat) for s in range(20)}
    assert len(picks) > 5

"""How an answer and a first token are scored, the same way in calibration and in every benchmark.

- `is_right(answer, expected)`: the expected answer (a code, a date, a name) appears in the answer, compared
  on lowercase letters and digits only, so "Code: QX-7741." holds "qx7741".
- `kl_divergence(p_logits, q_logits)`: KL(p ‖ q) in nats of two next-token distributions from their (vocab,)
  logits, p the reference (full prefill). log_softmax and the sum run in float64: in float32 the rounding
  of the normaliser alone puts ~1e-7…1e-6 of noise (of either sign) on a 49k-token vocabulary, as large as
  the divergences of blend@1.0 vs full that must be resolved (target < 1e-6).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_NOT_ALNUM = re.compile(r"[^0-9a-z]")


def normalized(text: str) -> str:
    """`text` lowercased, with everything but ASCII letters and digits dropped."""
    return _NOT_ALNUM.sub("", text.lower())


def is_right(answer: str, expected: str) -> bool:
    """True when the expected answer appears in `answer` (letters and digits, case-insensitive)."""
    return normalized(expected) in normalized(answer)


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p ‖ q) in nats for two (vocab,) logit vectors; p is the reference (full prefill)."""
    import torch

    if p_logits.shape != q_logits.shape or p_logits.dim() != 1:
        raise ValueError(
            f"expected two (vocab,) logit vectors, got {tuple(p_logits.shape)} and {tuple(q_logits.shape)}"
        )
    log_p = torch.log_softmax(p_logits.detach().double(), dim=-1)
    log_q = torch.log_softmax(q_logits.detach().double(), dim=-1)
    # p·(log p − log q); terms with p == 0 contribute 0 (0·log 0 = 0), even where q == 0 too.
    terms = torch.where(log_p > -math.inf, log_p.exp() * (log_p - log_q), torch.zeros_like(log_p))
    return float(terms.sum())

"""What one peer of `bench peers` did with one prompt: its first token, and the tokens it decoded after it.

Every peer (llama.cpp, transformers, blendrag) prefills the prompt, picks the first token and then decodes
greedily, one token per step, EOS ignored. The time of each token is taken when the peer hands it over
(`time.perf_counter()`), so decode alone is the span from the first token to the last: the prompt pass is
before the first token and never in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PeerRun:
    """One peer on one prompt."""

    ttft_s: float  # prompt pass and the first token, as the peer measures it
    tokens: tuple[int, ...]  # the first token, then the decoded ones
    # perf_counter() when each token was handed over (one per token), or () from a peer timed to its first
    # token only (its TTFT is all it reports)
    token_times: tuple[float, ...]

    @property
    def first_token(self) -> int:
        return self.tokens[0]

    @property
    def decode_tokens_per_s(self) -> float | None:
        """The decode rate of this answer; None with fewer than two tokens (nothing decoded)."""
        return decode_tokens_per_s(self.token_times)


def decode_tokens_per_s(token_times: Sequence[float]) -> float | None:
    """Tokens after the first ÷ the seconds from the first token to the last (None for fewer than two
    tokens, or no time between them)."""
    if len(token_times) < 2:
        return None
    span = token_times[-1] - token_times[0]
    return (len(token_times) - 1) / span if span > 0 else None

"""Next-token choice (greedy, temperature + top-p with a seeded generator), repetition control, and
streamed detokenization.

Repetition control (RepetitionControl) is what keeps a small model from looping one sentence until
max_tokens: a repetition penalty on the tokens already generated, a ban on generating any n-gram twice,
and a stop once the answer loops (engine/repetition.py tells a loop from a legitimate repeat). It acts on
the generated tokens only (never the prompt, whose words an answer should be free to copy), so it is the
same in every mode.

Text is produced incrementally from token ids: a delta is only released once it decodes to complete
characters (a multi-byte character split over several byte-level tokens shows up as U+FFFD until its
last byte arrives), and text that could still turn out to be the start of a stop string is held back.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.repetition import ends_in_loop
from engine.types import SamplingParams


class RepetitionControl:
    """Logit adjustments and the stop test of SamplingParams' repetition settings."""

    def __init__(self, params: SamplingParams) -> None:
        self.penalty = params.repetition_penalty
        self.ngram = params.no_repeat_ngram_size
        self.stop_on_repeated_line = params.stop_on_repeated_line

    @property
    def adjusts_logits(self) -> bool:
        return self.penalty != 1.0 or self.ngram > 0

    def adjust(self, logits: torch.Tensor, generated: Sequence[int]) -> torch.Tensor:
        """logits (vocab,) → a new tensor with repeated tokens penalised and repeated n-grams banned."""
        if not generated or not self.adjusts_logits:
            return logits
        out = logits.clone()
        if self.penalty != 1.0:
            ids = torch.tensor(sorted(set(generated)), dtype=torch.int64, device=out.device)
            seen = out[ids]
            # As in CTRL (Keskar et al. 2019): shrink positive logits, push negative ones further down.
            out[ids] = torch.where(seen > 0, seen / self.penalty, seen * self.penalty)
        if self.ngram > 0 and len(generated) >= self.ngram:
            banned = banned_ngram_tokens(generated, self.ngram)
            if banned:
                out[torch.tensor(sorted(banned), dtype=torch.int64, device=out.device)] = float("-inf")
        return out

    def should_stop(self, text: str) -> bool:
        return self.stop_on_repeated_line and ends_in_loop(text)


def banned_ngram_tokens(generated: Sequence[int], n: int) -> set[int]:
    """Tokens that would complete an n-gram already present in `generated`."""
    if n == 1:
        return set(generated)
    context = tuple(generated[len(generated) - n + 1 :])
    return {generated[i + n - 1] for i in range(len(generated) - n + 1) if tuple(generated[i : i + n - 1]) == context}


class Sampler:
    def __init__(self, params: SamplingParams, device: torch.device) -> None:
        self.params = params
        self.repetition = RepetitionControl(params)
        self.generator: torch.Generator | None = None
        if not params.greedy:
            seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
            # Sampling runs on the CPU so a seed gives the same tokens on any device.
            self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.device = device

    def __call__(self, logits: torch.Tensor, generated: Sequence[int] = ()) -> int:
        """logits: (vocab,) float32, generated: the token ids sampled so far → token id."""
        logits = self.repetition.adjust(logits, generated)
        if self.params.greedy:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float().cpu() / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Drop tokens once the mass before them already reaches top_p (the first token always stays).
            drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= self.params.top_p
            drop[0] = False  # a top_p below float32's smallest number must still keep the top token
            sorted_probs[drop] = 0.0
            choice = torch.multinomial(sorted_probs, 1, generator=self.generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self.generator))


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never split a character."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._prefix_offset = 0  # decode from here so that leading-space handling stays in context
        self._read_offset = 0  # text of tokens before this was already released

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        self.token_ids.append(token_id)
        prefix_text = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.token_ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.token_ids)
            return delta
        return ""


@dataclass
class StopResult:
    text: str  # text that may be released now
    stopped: bool  # a stop string was found; nothing after its start is ever released


class StopStringFilter:
    """Holds back the tail that could be the beginning of a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._pending = ""

    def push(self, text: str) -> StopResult:
        if not self.stops:
            return StopResult(text, False)
        self._pending += text
        cut = min((i for i in (self._pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self._pending = self._pending[:cut], ""
            return StopResult(out, True)
        hold = self._partial_stop_len(self._pending)
        out, self._pending = self._pending[: len(self._pending) - hold], self._pending[len(self._pending) - hold :]
        return StopResult(out, False)

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest tail of `text` that is the beginning of some stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out

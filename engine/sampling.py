"""Next-token choice (greedy, temperature + top-p with a seeded generator), repetition control, and
streamed detokenization.

Repetition control (RepetitionControl) is what keeps a small model from looping one sentence until
max_tokens: a repetition penalty on the tokens already generated, a ban on generating any n-gram twice,
and a stop once a completed sentence or line repeats an earlier one. It acts on the generated tokens
only (never the prompt, whose words an answer should be free to copy), so it is the same in every mode.

Text is produced incrementally from token ids: a delta is only released once it decodes to complete
characters (a multi-byte character split over several byte-level tokens shows up as U+FFFD until its
last byte arrives), and text that could still turn out to be the start of a stop string is held back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.types import SamplingParams

# A sentence ends at . ! or ? followed by white space; a line at a newline.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")
_SPACES = re.compile(r"\s+")
MIN_REPEATED_LINE_CHARS = 8  # shorter repeats ("Yes.", list markers) are not treated as a loop …
SHORT_LINE_RUN = 4  # … unless one of them comes this many times in a row ("Ç¨\n\n" × 363 ran to the token cap)
# A loop inside one line ("`test_client.get` and `test_client.get` and …"): the line ends with one unit
# repeated back to back. Its smallest period must be this long and hold a letter or digit, so table rules
# ("| --- | --- |"), rows of zeros ("| 0 | 0 | 0 |") and "....." are never loops; and it must come this many
# times, so a value written out three times in a list ("[1, 2, 3, 1, 2, 3, 1, 2, 3]") is not one either.
MIN_LOOP_UNIT_CHARS = 8
MIN_LOOP_COPIES = 4
# Held from this many characters of a possible second copy: at most three characters of a loop's repeats are
# sent; ordinary text is delayed only while its last characters echo the line so far.
_HOLD_REPEATED_CHARS = 4
_LOOP_WINDOW_CHARS = 2048  # of the current line searched (a loop is found long before it grows past this)


def _normalize(sentence: str) -> str:
    return _SPACES.sub(" ", sentence.strip().lower())


def ends_with_repeated_line(text: str, min_chars: int = MIN_REPEATED_LINE_CHARS) -> bool:
    """True when the sentence or line that `text` has just completed already occurred earlier in it."""
    stripped = text.rstrip(" \t")
    if not stripped or (stripped[-1] not in ".!?" and not stripped.endswith("\n")):
        return False  # the last sentence is still being written
    parts = [_normalize(p) for p in _SENTENCE_BREAK.split(stripped)]
    parts = [p for p in parts if p]
    if len(parts) >= 2 and len(parts[-1]) < min_chars:
        return _ends_with_short_run(parts)
    if len(parts) < 2:
        return False
    return parts[-1] in parts[:-1]


def _ends_with_short_run(parts: list[str], run: int = SHORT_LINE_RUN) -> bool:
    """True when the last `run` completed sentences or lines are one and the same short one: a loop, however
    short its line (a short line repeated once or twice, "Yes." or a list marker, is not)."""
    return len(parts) >= run and len(set(parts[-run:])) == 1


@dataclass(frozen=True)
class InlineLoop:
    start: int  # index in the text where the first copy of the unit begins
    period: int  # the unit's length in characters
    num_copies: float  # how many times it occurs back to back (the last copy may be partial)


def find_inline_loop(text: str, min_copies: float = MIN_LOOP_COPIES, min_repeated_chars: int = 0) -> InlineLoop | None:
    """The loop the current line of `text` ends in: its smallest period p repeated at least `min_copies`
    times with at least `min_repeated_chars` after the first copy (p ≥ MIN_LOOP_UNIT_CHARS, the unit
    holding a letter or digit), else None."""
    line_start = max(text.rfind("\n") + 1, len(text) - _LOOP_WINDOW_CHARS)
    line = text[line_start:]
    n = len(line)
    for p in range(MIN_LOOP_UNIT_CHARS, min(int(n // min_copies), n - min_repeated_chars) + 1):
        i = n - 1
        while i >= p and line[i] == line[i - p]:
            i -= 1
        total = n - 1 - i + p  # the periodic tail: one unit plus every character equal to the one p before it
        if total / p < min_copies or total - p < min_repeated_chars:
            continue
        unit = line[n - p :]
        # Found at the smallest p ≥ MIN_LOOP_UNIT_CHARS; a unit that is itself a shorter repeat ("0 | 0 | ")
        # or holds no letter or digit ("--------") is a rule or a row of values, not a loop.
        shortest = next(q for q in range(1, p + 1) if p % q == 0 and unit == unit[:q] * (p // q))
        if shortest < MIN_LOOP_UNIT_CHARS or not any(c.isalnum() for c in unit):
            return None
        return InlineLoop(start=line_start + n - total, period=p, num_copies=total / p)
    return None


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
        return self.stop_on_repeated_line and (ends_with_repeated_line(text) or find_inline_loop(text) is not None)


_BOUNDARY = re.compile(r"[.!?](?=\s|$)|\n")
_FENCE_LINE = re.compile(r"^ {0,3}(```|~~~)", re.MULTILINE)


def _could_become_a_repeat(text: str) -> bool:
    """Whether the sentence `text` is in the middle of is, so far, the start of an earlier sentence (only
    then can it still turn out to repeat one)."""
    parts = [_normalize(p) for p in _SENTENCE_BREAK.split(text)]
    current = parts[-1] if parts else ""
    if not current:
        return False
    return any(earlier.startswith(current) for earlier in parts[:-1] if len(earlier) >= MIN_REPEATED_LINE_CHARS)


class RepeatedLineGuard:
    """Holds back the sentence or line being written until it is known not to repeat an earlier one, and
    a line's repeated tail until it is known not to be a loop inside the line.

    With `stop_on_repeated_line`, a loop must end *before* its first repeated line reaches the client. A
    sentence in progress can only become a repeat while it is the start of an earlier sentence, so only
    then is it held (until it completes or departs from every earlier one): new text streams at once, and
    a loop lags by at most the sentence being checked.
    `push` returns the text that may be sent and whether the sentence just completed repeats an earlier one
    (the caller then finishes with reason "repetition" and never sends it). Disabled, it passes text through.
    Inside one line, once its tail repeats what came a unit earlier (a second copy may have begun) that
    copy is held; at MIN_LOOP_COPIES copies the answer ends after the first copy, so of a loop's repeats
    at most their first character is ever sent.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._sent = ""  # every character released so far
        self._held = ""  # written but not yet released: the sentence in progress

    def push(self, text: str) -> tuple[str, bool]:
        if not self.enabled:
            return text, False
        self._held += text
        release = 0
        for boundary in _BOUNDARY.finditer(self._held):
            end = boundary.end()
            if ends_with_repeated_line(self._sent + self._held[:end]):
                out = self._held[:release]
                self._sent += out
                self._held = ""
                return out, True
            if end < len(self._held) or self._held[end - 1] == "\n":
                release = end  # a confirmed boundary (followed by white space, or a line break)
        text = self._sent + self._held
        loop = find_inline_loop(text)
        if loop is not None:  # the line loops: keep its first copy, drop the rest
            out = self._held[: max(0, loop.start + loop.period - len(self._sent))]
            self._sent += out
            self._held = ""
            return out, True
        if not _could_become_a_repeat(text):
            release = len(self._held)  # new words stream at once; only a possible repeat waits
        maybe = find_inline_loop(text, min_copies=1, min_repeated_chars=_HOLD_REPEATED_CHARS)
        if maybe is not None:  # a second copy may have begun: hold it until it departs or the loop is found
            release = min(release, max(0, maybe.start + maybe.period - len(self._sent)))
        out, self._held = self._held[:release], self._held[release:]
        self._sent += out
        return out, False

    def flush(self) -> str:
        """What is held, at a finish that is not a repetition (EOS, a stop string, max_tokens)."""
        out, self._held = self._held, ""
        self._sent += out
        return out

    def closing_fence(self) -> str:
        """Text that closes a code fence the released answer left open (empty if none is open), so a
        repetition stop inside a code block does not leave the rest of a rendered page in code."""
        fences = _FENCE_LINE.findall(self._sent)
        if len(fences) % 2 == 0:
            return ""
        return ("" if self._sent.endswith("\n") else "\n") + fences[-1]


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

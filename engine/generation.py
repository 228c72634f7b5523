"""One request's state from submission to finish: plain state, no engine, no compute.

    run = RequestRun(request, tokenizer, eos_token_ids, device)   # WAITING
    run.start_prompt()                        # PROMPT_PASS: the engine runs the prompt pass of its mode
    events = run.accept_prompt(result)        # DECODING: first token sampled from the pass's logits
    while not run.finished:
        # the engine feeds run.pending_token through the model against run.cache (alone or batched)
        events = run.accept_logits(logits)    # the next token; FINISHED on EOS, stop, length or repetition

`Engine.run_prompt(run)` and `Engine.decode(runs)` do the compute and call these; the scheduler decides which
run goes next and hands the events to its consumer. A consumer that goes away sets `cancel_requested`;
whoever executes the run notices it at the next layer boundary or decode step and calls `cancel()`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.repetition import RepeatedLineGuard
from engine.sampling import IncrementalDetokenizer, Sampler, StopStringFilter
from engine.types import (
    FinishEvent,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    PromptResult,
    RepeatedLine,
    TokenEvent,
)

if TYPE_CHECKING:
    import torch

    from engine.working_cache import WorkingCache

logger = logging.getLogger(__name__)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    PROMPT_PASS = "prompt_pass"
    DECODING = "decoding"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


_DONE = (RequestStatus.FINISHED, RequestStatus.CANCELLED, RequestStatus.FAILED)


class RequestRun:
    """Status, sampler, detokenizer, working cache and pending token of one request (see module docstring).

    Identity matters (eq=False semantics): the scheduler's lists hold each run once.
    """

    def __init__(
        self,
        request: GenerationRequest,
        tokenizer: Any,
        eos_token_ids: frozenset[int],
        device: torch.device,
        arrival_time: float | None = None,
    ) -> None:
        self.request = request
        self.arrival_time = arrival_time if arrival_time is not None else time.perf_counter()
        self.status = RequestStatus.WAITING
        # Set from any thread when the consumer goes away; the executing thread acts on it.
        self.cancel_requested = threading.Event()
        self.sampler = Sampler(request.sampling, device)
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stops = StopStringFilter(request.sampling.stop)
        self.lines = RepeatedLineGuard(request.sampling.stop_on_repeated_line)
        self.eos_token_ids = eos_token_ids
        self.result: PromptResult | None = None  # its cache is the working cache decode extends
        self.text_parts: list[str] = []
        self.num_completion_tokens = 0
        self.first_token_time: float | None = None
        self._next_token: int | None = None  # sampled, not yet fed through the model
        # Gives the working cache back to the pool it came from (engine/cache_pool.py) when the run is done; set by
        # whoever ran the run's prompt pass into a pooled cache (`Engine.run_prompt`), None when the run does not
        # own its cache (`Engine.answer` decodes from a caller's pass).
        self.cache_release: Callable[[WorkingCache], None] | None = None

    # ------------------------------------------------------------------------------------ state
    @property
    def finished(self) -> bool:
        return self.status in _DONE

    @property
    def pending_token(self) -> int:
        """The last sampled token, which the next decode step feeds through the model."""
        assert self._next_token is not None and not self.finished
        return self._next_token

    @property
    def cache(self) -> WorkingCache:
        """The working cache the next decode step extends."""
        assert self.result is not None and not self.finished
        return self.result.cache

    # ------------------------------------------------------------------------------- transitions
    def start_prompt(self) -> None:
        self.status = RequestStatus.PROMPT_PASS

    def accept_prompt(self, result: PromptResult) -> list[GenerationEvent]:
        """The prompt pass is done: keep its cache and sample the first token from its logits."""
        self.result = result
        self.status = RequestStatus.DECODING
        token_id = self.sampler(result.logits, self.detok.token_ids)
        self.first_token_time = time.perf_counter()
        return self._accept(token_id)

    def accept_logits(self, logits: torch.Tensor) -> list[GenerationEvent]:
        """Sample from the logits (vocab,) of a decode step that fed `pending_token` (alone or batched)."""
        return self._accept(self.sampler(logits, self.detok.token_ids))

    def cancel(self) -> FinishEvent:
        self.status = RequestStatus.CANCELLED
        return self._finish("cancelled")

    def fail(self) -> None:
        self.status = RequestStatus.FAILED
        self.release()

    def release(self) -> None:
        """Drop the working cache (memory) once the request is done: a pooled one goes back to its size class
        for the next request."""
        result, self.result = self.result, None
        if result is not None and self.cache_release is not None:
            self.cache_release(result.cache)

    # --------------------------------------------------------------------------------- internals
    def _accept(self, token_id: int) -> list[GenerationEvent]:
        self.num_completion_tokens += 1
        sampling = self.request.sampling
        if token_id in self.eos_token_ids and not sampling.ignore_eos:
            return [self._token(self.lines.flush() + self.stops.flush(), token_id), self._finish("stop")]
        released = self.stops.push(self.detok.add(token_id))
        text, repeated = self.lines.push(released.text)
        if repeated is not None:
            # The model began to loop: end before the repeat is sent, closing an open code fence, and say what
            # was withheld (the answer itself never shows what tripped the stop).
            logger.info(
                "request %s: repetition stop after %d tokens, withheld %r (repeats the answer from character %d)",
                self.request.request_id,
                self.num_completion_tokens,
                repeated.text,
                repeated.earlier_start,
            )
            return [self._token(text + self.lines.closing_fence(), token_id), self._finish("repetition", repeated)]
        if released.stopped:
            return [self._token(text + self.lines.flush(), token_id), self._finish("stop")]
        if self.num_completion_tokens >= sampling.max_tokens:
            tail = self.lines.flush() + self.stops.flush()  # in stream order: the guard's text comes first
            return [self._token(text + tail, token_id), self._finish("length")]
        self._next_token = token_id
        return [self._token(text, token_id)]

    def _token(self, text: str, token_id: int) -> TokenEvent:
        self.text_parts.append(text)
        return TokenEvent(text=text, token_id=token_id)

    def _finish(self, reason: FinishReason, repeated: RepeatedLine | None = None) -> FinishEvent:
        if self.status != RequestStatus.CANCELLED:
            self.status = RequestStatus.FINISHED
        now = time.perf_counter()
        res = self.result
        layout = self.request.layout
        self._next_token = None
        if res is not None and reason == "cancelled":
            self.release()
        return FinishEvent(
            finish_reason=reason,
            num_prompt_tokens=layout.num_tokens,
            num_completion_tokens=self.num_completion_tokens,
            num_recomputed_tokens=res.num_recomputed_tokens if res else 0,
            recompute_ratio=res.recompute_ratio if res else 0.0,
            ttft_s=(self.first_token_time or now) - self.arrival_time,
            total_s=now - self.arrival_time,
            mode=res.mode if res else self.request.mode,
            selector=res.selector if res else None,
            num_context_tokens=layout.num_context_tokens,
            text="".join(self.text_parts),
            repeated_line=repeated,
        )

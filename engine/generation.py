"""One request from prompt pass to finish, as a step-wise state machine the scheduler can interleave.

run = RequestRun(engine, request)       # WAITING: the one status of this request lives here
events = run.prefill()                   # prompt pass of the request's mode + first token
while not run.finished:
    events = run.step()                  # one decode step

The scheduler batches decode steps of several runs: it feeds each run's `pending_token` through
`engine.batched_decode.decode_batch` against `run.cache` and hands the logits back with `advance`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.phases import decode
from engine.sampling import IncrementalDetokenizer, Sampler, StopStringFilter
from engine.types import (
    FinishEvent,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    PromptResult,
    RequestCancelled,
    TokenEvent,
)
from engine.working_cache import WorkingCache

if TYPE_CHECKING:
    from engine.engine import Engine


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


class RequestRun:
    def __init__(
        self,
        engine: Engine,
        request: GenerationRequest,
        arrival_time: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.engine = engine
        self.request = request
        self.arrival_time = arrival_time if arrival_time is not None else time.perf_counter()
        self.should_stop = should_stop
        self.status = RequestStatus.WAITING
        self.sampler = Sampler(request.sampling, engine.device)
        self.detok = IncrementalDetokenizer(engine.tokenizer)
        self.stops = StopStringFilter(request.sampling.stop)
        self.result: PromptResult | None = None
        self.text_parts: list[str] = []
        self.num_completion_tokens = 0
        self.first_token_time: float | None = None
        self._next_token: int | None = None  # sampled, not yet fed through the model

    @property
    def finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.CANCELLED, RequestStatus.FAILED)

    def prefill(self) -> list[GenerationEvent]:
        req = self.request
        self.status = RequestStatus.PREFILLING
        try:
            self.result = self.engine.prompt_pass(
                req.layout,
                req.kv_source,
                req.mode,
                req.blend,
                extra_capacity=req.sampling.max_tokens,
                should_stop=self.should_stop,
            )
        except RequestCancelled:
            return [self.cancel()]
        finally:
            if req.kv_source is not None:
                req.kv_source.close()
        self.status = RequestStatus.DECODING
        token_id = self.sampler(self.result.logits)
        self.first_token_time = time.perf_counter()
        return self._accept(token_id)

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

    def step(self) -> list[GenerationEvent]:
        """Feed the last sampled token and sample the next one."""
        if self.should_stop is not None and self.should_stop():
            return [self.cancel()]
        return self.advance(decode(self.engine.transformer, self.cache, self.pending_token))

    def advance(self, logits) -> list[GenerationEvent]:
        """Sample from the logits of a decode step that fed `pending_token` (one or batched)."""
        return self._accept(self.sampler(logits))

    def fail(self) -> None:
        self.status = RequestStatus.FAILED
        self.release()

    def cancel(self) -> FinishEvent:
        self.status = RequestStatus.CANCELLED
        return self._finish("cancelled")

    def _accept(self, token_id: int) -> list[GenerationEvent]:
        self.num_completion_tokens += 1
        sampling = self.request.sampling
        if token_id in self.engine.eos_token_ids and not sampling.ignore_eos:
            return [self._token(self.stops.flush(), token_id), self._finish("stop")]
        released = self.stops.push(self.detok.add(token_id))
        if released.stopped:
            return [self._token(released.text, token_id), self._finish("stop")]
        if self.num_completion_tokens >= sampling.max_tokens:
            return [self._token(released.text + self.stops.flush(), token_id), self._finish("length")]
        self._next_token = token_id
        return [self._token(released.text, token_id)]

    def _token(self, text: str, token_id: int) -> TokenEvent:
        self.text_parts.append(text)
        return TokenEvent(text=text, token_id=token_id)

    def _finish(self, reason: FinishReason) -> FinishEvent:
        if self.status != RequestStatus.CANCELLED:
            self.status = RequestStatus.FINISHED
        now = time.perf_counter()
        res = self.result
        layout = self.request.layout
        self._next_token = None
        if res is not None:
            self.result = None if reason == "cancelled" else res
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
        )

    def release(self) -> None:
        """Drop the working cache (memory) once the request is done."""
        self.result = None

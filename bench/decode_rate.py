"""Aggregate decode tokens/s of N concurrent requests on the app's own scheduler (in-process only).

Each of N requests is one question over its passages (blended from their stored KV, as /ask does), all
submitted at once with a fixed answer length (EOS ignored). The steady state is the window in which all
N decode together: from the last request's first token to the first request's last token. Aggregate
decode rate = tokens emitted in that window ÷ its length. With one request the window is its whole
decode (first token → last token). Prompt passes and chunk precomputes fall outside the window, so the
figure is the decode steps alone, batched by the scheduler across requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from bench.harness import load_avg

if TYPE_CHECKING:
    from app.state import AppState
    from bench.data import Example

logger = logging.getLogger(__name__)


async def _request(
    state: AppState,
    example: Example,
    num_passages: int,
    chunk_tokens: int,
    ratio: float,
    max_tokens: int,
    kv_cache: dict[tuple[int, ...], Any],
):
    from engine.scheduler import PrecomputePriority
    from engine.types import GenerationRequest
    from kvcache.types import InMemoryLayerSource

    engine, scheduler = state.services.engine, state.scheduler
    chunks = [
        engine.tokenizer.encode(p.text, add_special_tokens=False)[:chunk_tokens]
        for p in example.passages[:num_passages]
    ]
    todo = [c for c in chunks if tuple(c) not in kv_cache]
    computed = await asyncio.to_thread(scheduler.precompute_chunks, todo, priority=PrecomputePriority.QUESTION)
    kv_cache.update({tuple(c): kv for c, kv in zip(todo, computed, strict=True)})
    kvs = [kv_cache[tuple(c)] for c in chunks]
    settings = state.settings.engine
    return GenerationRequest(  # as AskService builds it (the passages in their rank order)
        request_id=str(uuid.uuid4()),
        layout=engine.prompt.layout_ranked(chunks, example.question),
        kv_source=InMemoryLayerSource(kvs),
        mode="blend",
        blend=settings.blend_config(recompute_ratio=ratio),
        # A fixed answer length: no EOS and no repeated-line stop (a small model repeats itself within
        # 128 tokens, and the server's stop would end that request early and close the window).
        sampling=settings.sampling_params(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, stop_on_repeated_line=False
        ),
    )


async def _one_round(state: AppState, requests: list) -> dict[str, Any]:
    from engine.types import FinishEvent, TokenEvent

    async def consume(request) -> list[float]:
        stamps = []
        async for event in state.scheduler.submit(request):
            if isinstance(event, TokenEvent):
                stamps.append(time.perf_counter())
            elif isinstance(event, FinishEvent) and event.finish_reason != "length":
                raise RuntimeError(f"decode request ended with {event.finish_reason}")
        return stamps

    stamps = await asyncio.gather(*(consume(r) for r in requests))
    start = max(s[0] for s in stamps)  # every request has its first token: all decode from here
    end = min(s[-1] for s in stamps)  # … until the first one is done
    tokens = sum(1 for s in stamps for t in s if start < t <= end)
    window = end - start
    return {
        "clients": len(requests),
        "window_s": window,
        "window_tokens": tokens,
        "decode_tokens_per_s": tokens / window if window > 0 and tokens else None,
        "tokens_per_request": len(stamps[0]),
    }


async def measure(
    state: AppState,
    examples: list[Example],
    clients: list[int],
    num_passages: int,
    chunk_tokens: int,
    ratio: float,
    max_tokens: int,
) -> dict[str, Any]:
    """Decode rate at each client count; `speedup` is the largest count's rate ÷ one client's."""
    results: dict[str, Any] = {}
    kv_cache: dict[tuple[int, ...], Any] = {}  # chunk token ids → KV, computed once for all rounds
    for n in clients:
        picked = [examples[i % len(examples)] for i in range(n)]
        requests = [await _request(state, e, num_passages, chunk_tokens, ratio, max_tokens, kv_cache) for e in picked]
        load = load_avg()
        round_ = await _one_round(state, requests)
        results[str(n)] = round_ | {"load_avg": load}
        logger.info(
            "decode with %d client(s): %s tok/s over %.1fs (load %s)",
            n,
            round_["decode_tokens_per_s"],
            round_["window_s"],
            load,
        )
    one, most = results.get("1", {}).get("decode_tokens_per_s"), results[str(max(clients))]["decode_tokens_per_s"]
    return {
        "per_clients": results,
        "max_tokens": max_tokens,
        "speedup": most / one if one and most and max(clients) > 1 else None,
    }

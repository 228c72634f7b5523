"""Aggregate decode tokens/s of N concurrent requests on the app's own scheduler (in-process only).

Each of N requests is one question over its passages (blended from their stored KV, as /ask does), all
submitted at once (EOS ignored). The steady state is the window in which all N decode together: it opens
at the last request's first token and closes once every request has decoded `window_tokens` more tokens
(then the requests are cancelled). Aggregate decode rate = tokens emitted in that window ÷ its length.
With one request the window is its first `window_tokens` tokens after the first one. Prompt passes and
chunk precomputes fall outside the window, so the figure is the decode steps alone, batched by the
scheduler across requests.

The window opens whatever the prompt length: the earlier requests decode while the later ones' prompt
passes run (one step at most per layer boundary, engine/scheduler.py: the query selector's scoring layers
and then every layer, at most 2 · num_layers boundaries, plus one step after the pass), so each request
may emit up to (N - 1) · (2 · num_layers + 1) tokens before the window opens; its answer cap leaves that
much room on top of the window's tokens.
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
    """The GenerationRequest of one client, with room for `max_tokens` tokens (its chunks' KV computed first)."""
    from engine.scheduler import PrecomputePriority
    from engine.types import GenerationRequest
    from kvcache.types import InMemoryLayerReader

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
        kv_reader=InMemoryLayerReader(kvs),
        mode="blend",
        blend=settings.blend_config(recompute_ratio=ratio),
        # A fixed answer length: no EOS and no repeated-line stop (a small model repeats itself within
        # 128 tokens, and the server's stop would end that request early and close the window).
        sampling=settings.sampling_params(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, stop_on_repeated_line=False
        ),
    )


def answer_cap(window_tokens: int, num_clients: int, num_layers: int) -> int:
    """Tokens a request may decode: the window's, plus what it can decode while the others' prompts run."""
    return window_tokens + 1 + (num_clients - 1) * (2 * num_layers + 1)


async def _one_round(state: AppState, requests: list, window_tokens: int) -> dict[str, Any]:
    from engine.types import FinishEvent, TokenEvent

    num_clients = len(requests)
    stamps: list[list[float]] = [[] for _ in requests]
    opened_at: list[float] = []  # set once: the last request's first token

    async def consume(i: int, request) -> None:
        mine = stamps[i]
        async with state.scheduler.submit(request) as stream:  # leaving the block cancels the request
            async for event in stream:
                if isinstance(event, TokenEvent):
                    mine.append(time.perf_counter())
                    if len(mine) == 1 and sum(1 for s in stamps if s) == num_clients:
                        opened_at.append(mine[0])
                    if opened_at and sum(1 for t in mine if t > opened_at[0]) >= window_tokens:
                        return
                elif isinstance(event, FinishEvent):
                    raise RuntimeError(
                        f"decode request ended ({event.finish_reason}) after {len(mine)} tokens, before its "
                        f"window of {window_tokens} tokens closed"
                    )

    await asyncio.gather(*(consume(i, r) for i, r in enumerate(requests)))
    start = opened_at[0]  # every request has its first token: all decode from here
    end = min(s[-1] for s in stamps)  # … until the first one has its window's tokens
    tokens = sum(1 for s in stamps for t in s if start < t <= end)
    window = end - start
    return {
        "clients": num_clients,
        "window_s": window,
        "window_tokens": tokens,
        "decode_tokens_per_s": tokens / window if window > 0 and tokens else None,
        "tokens_before_window": [sum(1 for t in s if t <= start) for s in stamps],
    }


async def measure(
    state: AppState,
    examples: list[Example],
    clients: list[int],
    num_passages: int,
    chunk_tokens: int,
    ratio: float,
    window_tokens: int,
) -> dict[str, Any]:
    """Decode rate at each client count (`window_tokens` per request in the all-decoding window); `speedup`
    is the largest count's rate ÷ one client's."""
    results: dict[str, Any] = {}
    kv_cache: dict[tuple[int, ...], Any] = {}  # chunk token ids → KV, computed once for all rounds
    for n in clients:
        picked = [examples[i % len(examples)] for i in range(n)]
        cap = answer_cap(window_tokens, n, state.services.engine.num_layers)
        requests = [await _request(state, e, num_passages, chunk_tokens, ratio, cap, kv_cache) for e in picked]
        load = load_avg()
        round_ = await _one_round(state, requests, window_tokens)
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
        "window_tokens_per_request": window_tokens,
        "speedup": most / one if one and most and max(clients) > 1 else None,
    }

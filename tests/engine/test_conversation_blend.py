"""A conversation's earlier turns are blended like chunks: at r = 1 the blend of stored chunk and turn KV
equals full prefill of the multi-turn prompt, behind the server's system prompt or a client's own."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.prompt import Turn
from engine.types import BlendConfig
from kvcache.types import InMemoryLayerReader

ATOL = 1e-4
TURNS = [Turn("who jumps over the dog?", "the quick brown fox."), Turn("and the dog?", "it is lazy.")]


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([23, 40, 17], seed=5)


@pytest.mark.parametrize(
    "cfg",
    [
        BlendConfig(recompute_ratio=1.0, selector="query"),
        BlendConfig(recompute_ratio=1.0, selector="deviation", check_layers=(1,)),
    ],
    ids=["query", "deviation"],
)
@pytest.mark.parametrize("system", [None, "Start every answer with Arr!"], ids=["server-prompt", "client-prompt"])
def test_blend_r1_with_reused_history_equals_full(tiny_engine, chunks, cfg, system) -> None:
    builder = tiny_engine.prompt.for_system_prompt(system)
    history = [tiny_engine.prompt.turn_ids(t) for t in TURNS]
    layout = builder.layout(chunks, "what does the fox do?", history)
    assert layout.num_history_segments == 2
    # Every segment's KV computed behind the *server's* prefix, as the store holds it.
    stored = tiny_engine.precompute_chunks([*chunks, *history])
    full = tiny_engine.prompt_pass(layout, None, "full")
    blended = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "blend", cfg)
    assert blended.num_context_tokens == layout.num_context_tokens
    assert blended.num_recomputed_tokens == layout.num_context_tokens
    torch.testing.assert_close(blended.logits, full.logits, atol=ATOL, rtol=0)


def test_reused_history_is_not_full_prefill(tiny_engine, chunks) -> None:
    # The opposite check: at r = 0 stale turn KV changes the logits, so the test above can fail.
    history = [tiny_engine.prompt.turn_ids(t) for t in TURNS]
    layout = tiny_engine.prompt.layout(chunks, "what does the fox do?", history)
    stored = tiny_engine.precompute_chunks([*chunks, *history])
    full = tiny_engine.prompt_pass(layout, None, "full")
    reuse = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "reuse")
    assert (reuse.logits - full.logits).abs().max().item() > 1e-3


def test_prefix_mode_behind_a_client_prompt_reuses_the_prefix_alone(tiny_engine, chunks) -> None:
    # Chunk 1's stored KV was computed behind the server's prefix: behind a client's it is not exact, so
    # `prefix` recomputes it (and everything after the prefix) and equals full prefill.
    client = tiny_engine.prompt.for_system_prompt("Start every answer with Arr!")
    layout = client.layout(chunks, "what does the fox do?")
    assert not layout.segments_behind_prefix and tiny_engine.prompt.layout(chunks, "q").segments_behind_prefix
    stored = tiny_engine.precompute_chunks(chunks)
    full = tiny_engine.prompt_pass(layout, None, "full")
    prefix = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "prefix")
    torch.testing.assert_close(prefix.logits, full.logits, atol=ATOL, rtol=0)
    # Behind the server's own prefix, chunk 1 is reused as stored (exact too, by construction).
    server = tiny_engine.prompt.layout(chunks, "what does the fox do?")
    server_prefix = tiny_engine.prompt_pass(server, InMemoryLayerReader(stored), "prefix")
    torch.testing.assert_close(
        server_prefix.logits, tiny_engine.prompt_pass(server, None, "full").logits, atol=ATOL, rtol=0
    )

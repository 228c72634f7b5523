"""`settle`: a question's engine values decided once, from the request and the engine's settings in force."""

from __future__ import annotations

import pytest

from app.services.ask.resolve import settle
from app.services.ask.types import AskRequest
from engine.config import EngineSettings
from engine.types import BlendConfig, PromptLayout
from kvcache.types import ChunkKV, InMemoryLayerReader

CONTEXT = 100
WITH_CHUNKS = PromptLayout([1, 2], [[3, 4, 5], [6, 7]], [8, 9])  # 9 tokens
BARE = PromptLayout([1, 2], [], [8, 9])
IN_FORCE = EngineSettings(mode="blend", max_new_tokens=40, temperature=0.0, blend={"recompute_ratio": 0.25})


def test_the_settings_in_force_fill_what_the_request_leaves() -> None:
    settled = settle(AskRequest("q"), WITH_CHUNKS, IN_FORCE, CONTEXT)
    assert (settled.mode, settled.opens_kv, settled.blend) == ("blend", True, IN_FORCE.blend)
    assert (settled.sampling.max_tokens, settled.sampling.temperature) == (40, 0.0)
    assert settled.sampling.stop_on_repeated_line is IN_FORCE.stop_on_repeated_line


def test_the_request_s_own_values_win() -> None:
    request = AskRequest("q", mode="reuse", recompute_ratio=0.5, selector="first_k", max_tokens=7, temperature=0.3)
    settled = settle(request, WITH_CHUNKS, IN_FORCE, CONTEXT)
    assert (settled.mode, settled.blend.recompute_ratio, settled.blend.selector) == ("reuse", 0.5, "first_k")
    assert (settled.sampling.max_tokens, settled.sampling.temperature) == (7, 0.3)
    assert settled.blend == IN_FORCE.blend.replace(recompute_ratio=0.5, selector="first_k")


def test_no_stored_segment_is_full_mode_and_opens_no_kv() -> None:
    for mode in (None, "blend", "prefix", "reuse", "full"):
        settled = settle(AskRequest("q", mode=mode), BARE, IN_FORCE, CONTEXT)
        assert (settled.mode, settled.opens_kv) == ("full", False)
        assert settled.generation("r", None).mode == "full"


def test_the_answer_takes_what_the_prompt_leaves_of_the_context() -> None:
    settled = settle(AskRequest("q", max_tokens=500), WITH_CHUNKS, IN_FORCE, CONTEXT)
    assert settled.sampling.max_tokens == CONTEXT - WITH_CHUNKS.num_tokens == 91


def test_a_submission_adds_only_its_id_and_reader() -> None:
    import torch

    settled = settle(AskRequest("q"), WITH_CHUNKS, IN_FORCE, CONTEXT)
    reader = InMemoryLayerReader([ChunkKV(k=torch.zeros(1, 1, 5, 2), v=torch.zeros(1, 1, 5, 2))])
    request = settled.generation("r1", reader)
    assert (request.request_id, request.kv_reader, request.layout, request.mode) == ("r1", reader, WITH_CHUNKS, "blend")
    assert (request.blend, request.sampling) == (settled.blend, settled.sampling)
    with pytest.raises(ValueError, match="mode 'blend' needs KV reader"):
        settled.generation("r2", None)
    assert isinstance(settled.blend, BlendConfig)

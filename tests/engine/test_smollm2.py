"""The real built-in model (SmolLM2-135M-Instruct): same invariants on a small prompt."""

from __future__ import annotations

import pytest
import torch

from engine.config import DEFAULT_SYSTEM_PROMPT
from engine.types import BlendConfig, GenerationRequest, SamplingParams, TokenEvent
from kvcache.types import InMemoryLayerReader

pytestmark = pytest.mark.slow

PASSAGES = [
    "The Danube flows through ten countries, more than any other river in the world.",
    "Vienna, the capital of Austria, lies on the Danube and is known for its coffee houses.",
    "Budapest was formed in 1873 by uniting Buda and Óbuda on the west bank with Pest on the east bank.",
]


@pytest.fixture(scope="module")
def setup(smollm2_engine):
    from ingest.chunker import encode_chunk_text

    engine = smollm2_engine
    chunks = [encode_chunk_text(engine.tokenizer, p) for p in PASSAGES]
    layout = engine.prompt.layout(chunks, "Which city lies on the Danube and has coffee houses?")
    return engine, layout, engine.precompute_chunks(chunks)


def test_prompt_layout(setup) -> None:
    engine, layout, _ = setup
    tok = engine.tokenizer
    assert tok.decode(layout.prefix_ids) == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
    )
    assert tok.decode(layout.suffix_ids).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert engine.eos_token_ids == frozenset({2})  # <|im_end|>
    assert (engine.num_layers, engine.num_kv_heads, engine.head_dim) == (30, 3, 64)


def test_full_matches_transformers_and_blend_one_equals_full(setup, smollm2_dir) -> None:
    from transformers import AutoModelForCausalLM

    engine, layout, kvs = setup
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([layout.all_ids()])).logits[0, -1].float()
    full = engine.prompt_pass(layout, None, "full").logits
    torch.testing.assert_close(full, ref, atol=1e-4, rtol=0)
    blend = engine.prompt_pass(layout, InMemoryLayerReader(kvs), "blend", BlendConfig(recompute_ratio=1.0)).logits
    torch.testing.assert_close(blend, full, atol=1e-4, rtol=0)
    prefix = engine.prompt_pass(layout, InMemoryLayerReader(kvs), "prefix").logits
    torch.testing.assert_close(prefix, full, atol=1e-4, rtol=0)


def test_greedy_decode_after_blend_equals_full(setup) -> None:
    engine, layout, kvs = setup

    def greedy(source, mode):
        req = GenerationRequest(
            "s", layout, source, mode, BlendConfig(recompute_ratio=1.0), SamplingParams(max_tokens=12)
        )
        return [e.token_id for e in engine.generate(req) if isinstance(e, TokenEvent)]

    assert greedy(InMemoryLayerReader(kvs), "blend") == greedy(None, "full")

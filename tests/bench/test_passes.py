"""run_pass measures three things from one prompt pass (Engine.score, then Engine.answer); each must equal
what a separate pass gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.data import build_prompt, load_dataset
from bench.metrics import kl_divergence
from bench.passes import ModeSpec, blend_name, mode_specs, parse_ratios, run_pass
from bench.prepared import PreparedPrompt
from engine.types import FinishEvent, GenerationRequest, SamplingParams, TokenEvent


@pytest.fixture
def prompt(tiny_engine, dataset_path: Path):
    return build_prompt(tiny_engine.prompt, tiny_engine.tokenizer, load_dataset(dataset_path)[0], 3)


def test_mode_specs_and_names(tiny_engine) -> None:
    specs = mode_specs(tiny_engine, parse_ratios("0.15,1"))
    assert [s.name for s in specs] == ["full", "prefix", "reuse", "blend@0.15", "blend@1.0"]
    assert [s.mode for s in specs] == ["full", "prefix", "reuse", "blend", "blend"]
    assert specs[3].blend.recompute_ratio == 0.15 and specs[4].blend.recompute_ratio == 1.0
    assert blend_name(0.3) == "blend@0.3"
    with pytest.raises(ValueError):
        parse_ratios("0.1,1.5")


def test_teacher_forced_nll_matches_a_whole_sequence_pass(tiny_engine, prompt) -> None:
    """NLL after the prompt pass == log-probs of a full prefill of prompt + answer (a different path)."""
    out = run_pass(tiny_engine, prompt.layout, None, ModeSpec("full", "full"), prompt.answer_ids, max_tokens=4)
    ids = prompt.layout.all_ids() + prompt.answer_ids
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_engine.settings.model, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
    n = len(prompt.answer_ids)
    logprobs = torch.log_softmax(logits[-n - 1 : -1], dim=-1)
    expected = -logprobs.gather(1, torch.tensor(prompt.answer_ids)[:, None]).squeeze(1)
    assert out.answer_nlls == pytest.approx(expected.tolist(), abs=2e-4)
    assert kl_divergence(logits[-n - 1], out.first_logits) < 1e-8


def test_greedy_answer_after_scoring_equals_plain_generation(tiny_engine, prompt) -> None:
    """Rewinding the cache after teacher forcing must leave decode exactly as if nothing was scored."""
    kvs = PreparedPrompt.compute(tiny_engine, prompt)
    spec = mode_specs(tiny_engine, [0.5], baselines=())[0]
    out = run_pass(tiny_engine, prompt.layout, kvs.source("fp16"), spec, prompt.answer_ids, max_tokens=6)
    request = GenerationRequest(
        "t", prompt.layout, kvs.source("fp16"), "blend", spec.blend, SamplingParams(max_tokens=6, ignore_eos=False)
    )
    events = list(tiny_engine.generate(request))
    assert out.answer_ids == [
        e.token_id for e in events if isinstance(e, TokenEvent) and e.token_id not in tiny_engine.eos_token_ids
    ]
    finish = next(e for e in events if isinstance(e, FinishEvent))
    assert out.answer_text == finish.text.strip()
    assert out.num_recomputed_tokens == finish.num_recomputed_tokens


def test_blend_at_one_is_full_and_storage_dtypes_serve_rounded_kv(tiny_engine, prompt) -> None:
    kvs = PreparedPrompt.compute(tiny_engine, prompt)
    full = run_pass(tiny_engine, prompt.layout, None, ModeSpec("full", "full"), [], max_tokens=1)
    blend1 = mode_specs(tiny_engine, [1.0], baselines=())[0]
    out = run_pass(tiny_engine, prompt.layout, kvs.source("int8"), blend1, [], max_tokens=1)
    assert kl_divergence(full.first_logits, out.first_logits) < 1e-6
    assert out.num_recomputed_tokens == prompt.layout.num_context_tokens
    # fp32 serves the engine's tensors as they are; fp16 rounds them; int8 stores 1 byte + 4-byte row scales
    k32, _ = kvs.source("fp32").layer(0)
    k16, _ = kvs.source("fp16").layer(0)
    assert torch.equal(k32, torch.cat([kv.k[0] for kv in kvs.kvs], dim=1))
    assert torch.equal(k16, k32.half().float())
    cfg = tiny_engine.config
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads
    assert kvs.stored_bytes("fp16") == per_token * cfg.head_dim * 2 * kvs.num_tokens
    assert kvs.stored_bytes("int8") == per_token * (cfg.head_dim + 4) * kvs.num_tokens
    assert kvs.serialized_bytes("fp16") > kvs.stored_bytes("fp16")  # plus safetensors headers


def test_the_repeated_line_stop_ends_the_answer_and_compare_keeps_the_uncontrolled_one(
    tiny_engine, prompt, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.repetition import RepeatedLineGuard
    from engine.types import RepeatedLine

    spec = ModeSpec("full", "full")
    monkeypatch.setattr(tiny_engine, "eos_token_ids", frozenset())  # the random model never ends by itself
    free = run_pass(tiny_engine, prompt.layout, None, spec, [], max_tokens=8)
    assert (len(free.answer_ids), free.finish_reason, free.uncontrolled) == (8, "length", None)
    # Pretend the third token completed a repeated line (the engine's guard sees each token's text once).
    calls: list[str] = []

    def push(self: RepeatedLineGuard, text: str) -> tuple[str, RepeatedLine | None]:
        if not self.enabled:
            return text, None
        calls.append(text)
        return ("", RepeatedLine(text, 0)) if len(calls) == 3 else (text, None)

    monkeypatch.setattr(RepeatedLineGuard, "push", push)
    stopped = run_pass(tiny_engine, prompt.layout, None, spec, [], max_tokens=8)
    calls.clear()
    compared = run_pass(tiny_engine, prompt.layout, None, spec, [], max_tokens=8, compare_uncontrolled=True)
    for out in (stopped, compared):
        assert (out.finish_reason, out.answer_ids) == ("repetition", free.answer_ids[:3])
    assert compared.uncontrolled == (free.answer_text, "length")

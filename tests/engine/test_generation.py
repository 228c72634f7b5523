"""Decode: seeded sampling, EOS, stop strings, max_tokens, and text deltas that never split a character."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.sampling import IncrementalDetokenizer, Sampler, StopStringFilter
from engine.types import FinishEvent, GenerationRequest, SamplingParams, TokenEvent
from kvcache.types import InMemoryLayerReader


@pytest.fixture(scope="module")
def layout(tiny_engine):
    return tiny_engine.prompt.layout(random_chunks([20, 25], seed=21), "what happens next?")


def _run(engine, layout, sampling: SamplingParams, mode="full", source=None):
    events = list(engine.generate(GenerationRequest("t", layout, source, mode, sampling=sampling)))
    assert isinstance(events[-1], FinishEvent) and all(isinstance(e, TokenEvent) for e in events[:-1])
    return events[:-1], events[-1]


def test_greedy_length_finish(tiny_engine, layout) -> None:
    tokens, fin = _run(tiny_engine, layout, SamplingParams(max_tokens=7, ignore_eos=True))
    assert len(tokens) == 7 and fin.finish_reason == "length" and fin.num_completion_tokens == 7
    assert fin.num_prompt_tokens == layout.num_tokens and fin.mode == "full"
    assert 0 < fin.ttft_s <= fin.total_s
    assert fin.text == "".join(t.text for t in tokens)
    # A character the last tokens leave unfinished (bytes of a multi-byte UTF-8 character cut by the length
    # limit) is never released: the answer ends before it, where a plain decode shows U+FFFD.
    decoded = tiny_engine.tokenizer.decode([t.token_id for t in tokens], skip_special_tokens=True)
    assert fin.text == decoded.rstrip("\ufffd") and decoded.startswith(fin.text)


def test_seeded_sampling_is_reproducible(tiny_engine, layout) -> None:
    def sample(seed: int) -> list[int]:
        params = SamplingParams(max_tokens=16, temperature=1.5, top_p=0.95, seed=seed, ignore_eos=True)
        return [t.token_id for t in _run(tiny_engine, layout, params)[0]]

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    sampler = Sampler(SamplingParams(temperature=1.0, top_p=0.7, seed=0), torch.device("cpu"))
    assert {sampler(logits) for _ in range(200)} == {0, 1}  # 0.5 + 0.3 >= 0.7: tokens 2 and 3 never
    greedy = Sampler(SamplingParams(), torch.device("cpu"))
    assert greedy(logits) == 0


def test_eos_stops(tiny_engine, layout, monkeypatch) -> None:
    free, _ = _run(tiny_engine, layout, SamplingParams(max_tokens=10, ignore_eos=True))
    ids = [t.token_id for t in free]
    eos = ids[4]  # pretend the 5th greedy token is the end of the turn
    monkeypatch.setattr(tiny_engine, "eos_token_ids", frozenset({eos}))
    tokens, fin = _run(tiny_engine, layout, SamplingParams(max_tokens=10))
    assert fin.finish_reason == "stop"
    assert [t.token_id for t in tokens] == ids[: ids.index(eos) + 1]
    assert tokens[-1].text == "" and fin.num_completion_tokens == len(tokens)
    assert fin.text == "".join(t.text for t in free[: ids.index(eos)])


def test_stop_string_cuts_text(tiny_engine, layout) -> None:
    free, _ = _run(tiny_engine, layout, SamplingParams(max_tokens=24, ignore_eos=True))
    text = "".join(t.text for t in free)
    assert len(text) >= 8
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    tokens, fin = _run(tiny_engine, layout, SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,)))
    assert fin.finish_reason == "stop"
    assert fin.text == text[: text.find(stop)]
    assert "".join(t.text for t in tokens) == fin.text
    assert len(tokens) < 24


def test_detokenizer_never_splits_characters(tiny_engine) -> None:
    text = "café naïve 東京 🙂 résumé"
    ids = tiny_engine.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # multi-byte characters span several byte-level tokens
    detok = IncrementalDetokenizer(tiny_engine.tokenizer)
    deltas = [detok.add(i) for i in ids]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # some tokens carried only part of a character


def test_stop_filter_holds_back_partial_matches() -> None:
    f = StopStringFilter(("</answer>",))
    out = [f.push(t) for t in ["The fox", " jumps</", "ans", "wer> and more"]]
    assert [o.text for o in out] == ["The fox", " jumps", "", ""]
    assert [o.stopped for o in out] == [False, False, False, True]
    g = StopStringFilter(("STOP",))
    assert g.push("aS").text == "a" and g.push("x").text == "Sx" and g.flush() == ""
    assert StopStringFilter(()).push("anything").text == "anything"


def test_generate_with_cached_chunks_reports_recompute(tiny_engine) -> None:
    chunks = random_chunks([30, 30], seed=3)
    layout = tiny_engine.prompt.layout(chunks, "q")
    source = InMemoryLayerReader(tiny_engine.precompute_chunks(chunks))
    from engine.types import BlendConfig

    events = list(
        tiny_engine.generate(
            GenerationRequest(
                "b",
                layout,
                source,
                "blend",
                BlendConfig(recompute_ratio=0.25, match_window=0),
                SamplingParams(max_tokens=3, ignore_eos=True),
            )
        )
    )
    fin = events[-1]
    assert isinstance(fin, FinishEvent)
    assert fin.num_recomputed_tokens == 15 and fin.recompute_ratio == 0.25 and fin.num_context_tokens == 60

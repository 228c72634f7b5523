"""`stale_key_scope: unnamed`: the stale-key bias lands on the segments the question does not name only
(engine/blend/plan.py `_key_bias`, engine/blend/key_bias.py)."""

from __future__ import annotations

import pytest

from engine.config import EngineSettings
from engine.types import BlendConfig, PromptLayout
from kvcache.types import InMemoryLayerReader


def _layout(tiny_engine, question: list[str]) -> tuple[PromptLayout, list[list[int]]]:
    """Three segments of one-character tokens; 'Z' (a name) stands in the second only."""
    tok = tiny_engine.tokenizer
    a, b, c, z, dot, space, one = (tok.convert_tokens_to_ids(t) for t in ("a", "b", "c", "Z", ".", "Ġ", "1"))
    chunks = [[c, b, a] * 10, [a] * 10 + [z, one, dot, space] + [b, c] * 13, [a, b, c, dot, space] * 6]  # 30, 40, 30
    prefix = tiny_engine.prompt.layout(chunks, "q").prefix_ids
    return PromptLayout(prefix, chunks, [tok.convert_tokens_to_ids(t) for t in question]), chunks


def _biased(tiny_engine, question: list[str], scope: str) -> dict[int, float] | None:
    """{position: bias} of the keys the pass biases, None when it biases none."""
    layout, chunks = _layout(tiny_engine, question)
    stored = tiny_engine.precompute_chunks(chunks)
    config = BlendConfig(
        recompute_ratio=0.2, selector="first_k", match_window=0, stale_key_bias=1.5, stale_key_scope=scope
    )  # type: ignore[arg-type]
    res = tiny_engine.prompt_pass(layout, InMemoryLayerReader(stored), "blend", config)
    p = layout.num_prefix_tokens
    # first_k's 20 rows of 100: each chunk's first 6, then the 7th of the first two
    assert res.selected_positions.tolist() == [p + o for o in (*range(0, 7), *range(30, 37), *range(70, 76))]
    if res.cache.key_bias is None:
        return None
    bias = res.cache.key_bias
    return {i - p: float(bias[i]) for i in bias.nonzero().flatten().tolist()}


def test_the_named_segment_keeps_its_stale_keys_unbiased(tiny_engine) -> None:
    # the first segment is exact (computed behind this prefix) and never biased; the second holds 'Z'
    assert _biased(tiny_engine, ["a", "Z", "b"], "unnamed") == {o: -1.5 for o in range(76, 100)}
    assert _biased(tiny_engine, ["a", "Z", "b"], "all") == {o: -1.5 for o in (*range(37, 70), *range(76, 100))}


def test_a_question_that_names_no_segment_gets_no_bias(tiny_engine) -> None:
    assert _biased(tiny_engine, ["a", "b"], "unnamed") is None  # 'a' and 'b' stand in every segment
    assert _biased(tiny_engine, ["a", "b"], "all") == {o: -1.5 for o in (*range(37, 70), *range(76, 100))}


def test_a_bad_scope_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="stale_key_scope"):
        BlendConfig(stale_key_scope="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stale_key_scope"):
        EngineSettings(stale_key_scope="some")  # type: ignore[arg-type]
    assert EngineSettings(stale_key_scope="unnamed").blend_config().stale_key_scope == "unnamed"

"""`plan_blend`: the host-side plan of every mode, pinned for fixed inputs (no model runs).

The plans below were the rows the engine recomputed before the blend had a package of its own (engine/phases.py);
a change to them changes what every shipped calibration record recomputes, so it must be deliberate.
"""

from __future__ import annotations

import pytest
import torch

from engine.blend.config import BlendConfig
from engine.blend.plan import KeyBiasPlan, plan_blend
from engine.blend.select import choose_upfront
from engine.blend.selectors import make_selector
from engine.blend.spans import sentence_ends
from engine.types import EngineError, PromptLayout

NUM_LAYERS = 30
# The values of two shipped records (Qwen2.5-Coder-0.5B bfloat16; 1.5B float32, with a stale-key bias), written
# out here so that a recalibration does not move this test.
RECORD_05B_BF16 = {"history_ratio": 1.0, "recompute_ratio": 0.25, "score_layers": (6, 12, 18), "selector": "query"}
RECORD_15B_F32 = {
    "history_ratio": 1.0,
    "recompute_ratio": 0.15,
    "score_layers": (5, 9, 14, 19, 23),
    "selector": "query",
    "stale_key_bias": 0.5,
}


def _layout(history: bool = False) -> PromptLayout:
    """Six similar 20-token pages behind a 3-token prefix; the question names 77 and 78, which stand together in
    page 2 only (77 alone in page 4); token 9 ends a sentence."""
    chunks = [[100 + 20 * i + j for j in range(20)] for i in range(6)]
    chunks[2][5], chunks[2][6], chunks[2][10] = 77, 78, 9
    chunks[4][12], chunks[4][15] = 77, 9
    if history:  # a follow-up: four pages and one earlier turn naming 77
        chunks = [*chunks[:4], [60, 61, 77, 62, 9, 63]]
    return PromptLayout([1, 2, 3], chunks, [50, 77, 78, 51], num_history_segments=1 if history else 0)


def _ends(layout: PromptLayout) -> frozenset[int]:
    return sentence_ends(layout.chunk_ids, lambda t: ". " if t == 9 else "a ")


def _groups(plan) -> list[tuple]:
    return [(g.num_budget, g.num_extra, g.priority, len(g.candidates)) for g in plan.groups]


def test_modes_other_than_blend_are_fixed_rows() -> None:
    layout = _layout()  # P = 3, N = 120, T = 127
    config = BlendConfig()
    assert plan_blend(layout, "full", config, NUM_LAYERS).fresh == range(0, 127)
    prefix = plan_blend(layout, "prefix", config, NUM_LAYERS)
    assert (prefix.fresh, prefix.num_stored_tokens) == (range(23, 127), 20)  # the exact first page is reused
    reuse = plan_blend(layout, "reuse", config, NUM_LAYERS)
    assert (reuse.fresh, reuse.num_stored_tokens, reuse.selector) == (range(123, 127), 120, None)
    deviation = plan_blend(
        layout, "blend", BlendConfig(selector="deviation", check_layers=(1, 3), ratio_schedule=(0.5, 0.15)), NUM_LAYERS
    )
    assert deviation.fresh == range(3, 127)
    assert [(c.layer, c.num_keep) for c in deviation.checks] == [(1, 60), (3, 18)]


@pytest.mark.parametrize(
    ("values", "history", "score_layers", "groups", "key_bias"),
    [
        (RECORD_05B_BF16, False, (6, 12, 18), [(30, 6, (45, 46, 47, 48, 49, 50), 114)], None),
        (
            RECORD_05B_BF16,
            True,
            (6, 12, 18),
            [(20, 6, (45, 46, 47, 48, 49, 50), 74), (6, 3, (82, 83, 84), 3)],
            None,
        ),
        (
            RECORD_15B_F32,
            False,
            (5, 9, 14, 19, 23),
            [(18, 6, (45, 46, 47, 48, 49, 50), 114)],
            KeyBiasPlan(0.5, ((23, 123),)),
        ),
        (
            RECORD_15B_F32,
            True,
            (5, 9, 14, 19, 23),
            [(12, 6, (45, 46, 47, 48, 49, 50), 74), (6, 3, (82, 83, 84), 3)],
            KeyBiasPlan(0.5, ((23, 89),)),
        ),
    ],
)
def test_shipped_records_plan_the_same_rows(values, history, score_layers, groups, key_bias) -> None:
    # Budgets: round(0.25 · 120) = 30; with a conversation, round(0.25 · 80) = 20 for the pages and the turn's
    # own round(1.0 · 6) = 6 (its 3 span rows forced, its other 3 candidates all kept). The spans: 77 and
    # 78 at page 2's offsets 5-6 (context 45-46) to the end of their sentence (9 at offset 50): six rows on top of
    # the budget (match_extra 0.1 · N = 12, as far as the matches go); page 4 (77 alone) is not singled out.
    layout = _layout(history)
    plan = plan_blend(layout, "blend", BlendConfig(**values), NUM_LAYERS, _ends(layout))
    assert plan.upfront and plan.score_layers == score_layers
    assert _groups(plan) == groups
    assert plan.key_bias == key_bias


def test_first_k_completes_the_plan_to_exact_positions() -> None:
    layout = _layout()
    config = BlendConfig(selector="first_k", recompute_ratio=0.1, sink_tokens=1)
    plan = plan_blend(layout, "blend", config, NUM_LAYERS, _ends(layout))
    # round(0.1 · 120) = 12 rows and the six span rows on top: the six page openings (sinks) and the spans are
    # forced, first_k's 6 picks are each page's next token.
    assert _groups(plan) == [(12, 6, (0, 20, 40, 60, 80, 100, 45, 46, 47, 48, 49, 50), 108)]
    positions = choose_upfront(plan, make_selector(config), None, torch.device("cpu"))
    offsets = [p - 3 for p in positions.tolist()]
    assert offsets == [0, 1, 20, 21, 40, 41, 45, 46, 47, 48, 49, 50, 60, 61, 80, 81, 100, 101]


def test_adaptive_budget_is_read_from_the_scores() -> None:
    layout = _layout()
    config = BlendConfig(attention_share=0.5, match_window=0)
    plan = plan_blend(layout, "blend", config, NUM_LAYERS)
    (group,) = plan.groups
    assert group.num_budget is None and group.adaptive is not None
    assert (group.adaptive.num_min, group.adaptive.num_max, group.adaptive.num_scored) == (6, 36, 120)
    scores = torch.zeros(120)
    scores[[7, 70]] = 1.0  # all the attention on two tokens: the floor of round(0.05 · 120) = 6 rows holds it
    positions = choose_upfront(plan, make_selector(config), scores, torch.device("cpu"))
    assert len(positions) == 6 and {3 + 7, 3 + 70} <= set(positions.tolist())


def test_a_plan_the_model_cannot_carry_out_is_refused() -> None:
    layout = _layout()
    with pytest.raises(EngineError, match="check layer 30"):
        plan_blend(layout, "blend", BlendConfig(selector="deviation", check_layers=(30,)), NUM_LAYERS)
    with pytest.raises(EngineError, match="sentence ends"):
        plan_blend(layout, "blend", BlendConfig(), NUM_LAYERS)

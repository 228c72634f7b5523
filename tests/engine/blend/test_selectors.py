"""Token selectors pick what they promise, at exactly the requested budget."""

from __future__ import annotations

import torch

from engine.blend.selectors import DeviationSelector, FirstKSelector, RandomSelector, SelectionInput, kv_deviation


def _input(num_keep: int, fresh: torch.Tensor, cached: torch.Tensor, chunk_index: list[int]) -> SelectionInput:
    n = fresh.shape[1]
    return SelectionInput(
        layer=1,
        positions=torch.arange(10, 10 + n),
        chunk_index=torch.tensor(chunk_index),
        fresh=fresh,
        cached=cached,
        num_keep=num_keep,
    )


def test_deviation_is_squared_l2_over_heads_and_dims() -> None:
    cached = torch.zeros(2, 3, 4)
    fresh = torch.zeros(2, 3, 4)
    fresh[0, 1, 0] = 2.0
    fresh[1, 1, 3] = 1.0
    fresh[1, 2, 2] = -3.0
    assert kv_deviation(fresh, cached).tolist() == [0.0, 5.0, 9.0]


def test_deviation_selector_keeps_largest_in_position_order() -> None:
    cached = torch.zeros(1, 6, 2)
    fresh = torch.tensor([[[0.1, 0], [5, 0], [0, 0.2], [0, 9], [0.3, 0], [4, 4]]])
    picked = DeviationSelector().select(_input(3, fresh, cached, [0, 0, 0, 1, 1, 1]))
    assert picked.tolist() == [1, 3, 5]
    assert DeviationSelector().select(_input(6, fresh, cached, [0] * 6)).tolist() == list(range(6))


def test_first_k_spreads_budget_over_chunks() -> None:
    x = torch.zeros(1, 7, 2)
    picked = FirstKSelector().select(_input(4, x, x, [0, 0, 0, 1, 1, 2, 2]))
    assert picked.tolist() == [0, 1, 3, 5]  # first of each chunk, then the second of the first chunk
    assert FirstKSelector().select(_input(3, x, x, [0, 0, 0, 1, 1, 2, 2])).tolist() == [0, 3, 5]


def test_random_selector_seeded() -> None:
    x = torch.zeros(1, 50, 2)
    a = RandomSelector(seed=3).select(_input(10, x, x, [0] * 50))
    assert a.numel() == 10 and torch.equal(a, a.sort().values) and a.unique().numel() == 10
    assert torch.equal(a, RandomSelector(seed=3).select(_input(10, x, x, [0] * 50)))
    assert not torch.equal(a, RandomSelector(seed=4).select(_input(10, x, x, [0] * 50)))


def test_equal_budget_across_selectors_in_engine(tiny_engine) -> None:
    from enginetest_tiny import random_chunks

    from engine.types import BlendConfig
    from kvcache.types import InMemoryLayerReader

    chunks = random_chunks([20, 30, 25], seed=9)
    layout = tiny_engine.prompt.layout(chunks, "q")
    kvs = tiny_engine.precompute_chunks(chunks)
    counts = {}
    for ratio, expected in ((0.2, 15), (0.02, 2), (0.1, 8), (0.5, 38)):  # round(r · 75), halves up
        for name in ("query", "deviation", "first_k", "random"):
            res = tiny_engine.prompt_pass(
                layout, InMemoryLayerReader(kvs), "blend", BlendConfig(recompute_ratio=ratio, selector=name)
            )
            counts[(ratio, name)] = res.num_recomputed_tokens
            assert res.selector == name
        assert {counts[(ratio, name)] for name in ("query", "deviation", "first_k", "random")} == {expected}
    p = layout.num_prefix_tokens
    res = tiny_engine.prompt_pass(
        layout, InMemoryLayerReader(kvs), "blend", BlendConfig(recompute_ratio=0.2, selector="first_k")
    )
    assert res.selected_positions.tolist() == [p + i for i in range(5)] + [p + 20 + i for i in range(5)] + [
        p + 50 + i for i in range(5)
    ]


def test_gradual_filtering_shrinks_selection(tiny_engine) -> None:
    from enginetest_tiny import random_chunks

    from engine.types import BlendConfig
    from kvcache.types import InMemoryLayerReader

    chunks = random_chunks([20, 30], seed=10)
    layout = tiny_engine.prompt.layout(chunks, "q")
    kvs = tiny_engine.precompute_chunks(chunks)
    cfg = BlendConfig(selector="deviation", check_layers=(0, 1, 2), ratio_schedule=(0.6, 0.4, 0.2))
    res = tiny_engine.prompt_pass(layout, InMemoryLayerReader(kvs), "blend", cfg)
    assert res.num_recomputed_tokens == 10
    wide = tiny_engine.prompt_pass(
        layout,
        InMemoryLayerReader(kvs),
        "blend",
        BlendConfig(selector="deviation", check_layers=(0, 1), ratio_schedule=(0.6, 0.4)),
    )
    # Later filters only choose among the tokens that survived the earlier ones.
    assert set(res.selected_positions.tolist()) <= set(wide.selected_positions.tolist())

"""How many tensors a prompt pass allocates per layer, pinned: a new allocation inside the layer loop (a staging
buffer, a mask rebuilt per layer, a copy of the stored context) shows here before it shows on a GPU profile.

Counted with a TorchDispatchMode: every op output whose storage is not one of its inputs' (views and in-place
writes are not allocations). Float32 on the tiny Llama, so the count is the same on every CPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from enginetest_tiny import random_chunks
from torch.utils._python_dispatch import TorchDispatchMode

from engine.types import BlendConfig, Mode
from kvcache.types import InMemoryLayerReader


class _Allocations(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = set()
        for a in [*args, *(kwargs or {}).values()]:
            for t in a if isinstance(a, (list, tuple)) else (a,):
                if isinstance(t, torch.Tensor):
                    inputs.add(t.untyped_storage().data_ptr())
        for o in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs:
                self.count += 1
        return out


def _per_boundary(engine, mode: Mode, config: BlendConfig, sync_free: bool) -> list[int]:
    chunks = random_chunks([37, 22, 41], seed=1)
    layout = engine.prompt.layout(chunks, "what is the code?")
    stored = engine.precompute_chunks(chunks)
    tf = engine.transformer
    before, tf.sync_free = tf.sync_free, sync_free
    try:
        engine.prompt_pass(layout, InMemoryLayerReader(stored), mode, config)  # the prefix KV, computed once
        counter, marks = _Allocations(), []
        with counter:
            engine.prompt_pass(
                layout, InMemoryLayerReader(stored), mode, config, between_layers=lambda: marks.append(counter.count)
            )
    finally:
        tf.sync_free = before
    return [b - a for a, b in zip(marks, marks[1:], strict=False)]


@pytest.mark.parametrize("sync_free", [False, True], ids=["cpu-path", "device-path"])
def test_allocations_per_layer_are_pinned(tiny_engine, sync_free: bool) -> None:
    # Between two layer boundaries: a layer of fresh rows allocates 28 tensors (norms, projections, RoPE,
    # attention, MLP); a layer that also fills the stored context 4 more (the source's K and V, RoPE's two
    # products). The blend's first two boundaries are the scoring pass (the selection falls in the second).
    # On the CPU path the rows after the prefix attend the keys before them unmasked in a call of their own
    # (engine/layers.py `AttentionBlock.shared_until`): 5 more (the GQA rows' copy, the second call's output and
    # log-sum-exp, the merge).
    split = 0 if sync_free else 5
    assert _per_boundary(tiny_engine, "full", BlendConfig(), sync_free) == [28, 28, 28]
    assert _per_boundary(tiny_engine, "reuse", BlendConfig(), sync_free) == [32 + split] * 3
    blend = _per_boundary(tiny_engine, "blend", BlendConfig(recompute_ratio=0.15, score_layers=(1,)), sync_free)
    assert blend[0] == 32 + split and blend[2:] == [28 + split, 28 + split, 32 + split]

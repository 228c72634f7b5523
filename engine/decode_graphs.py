"""Decode captured in CUDA graphs: one graph per (slab, batch class), replayed for every step after the first.

On a GPU a decode step of a small model is bound by its kernel launches, not by the device: ~20 kernels a
layer plus a cache write and an attention call per request, each a few microseconds of host time for a few
microseconds of GPU work. A CUDA graph records the whole step once and replays it with one launch.

A graph replays fixed kernels on fixed addresses, so the step it records works on static buffers only:

- the requests' caches are slots of one slab (engine/cache_pool.py), so a batch is a set of slot indices into one
  (layers, slots, kv_heads, capacity, D) tensor; every request of a slab has the slab's capacity;
- `StaticDecode.inputs` (3, batch) int64 holds each row's token id, position (its cache's length) and slot; a
  batch of n requests runs in the graph of the next batch class (a power of two ≥ n), its padding rows write
  position 0 of the slab's scratch slot and are dropped;
- attention covers all `capacity` keys of a row's slot with an additive mask built inside the step from the
  positions (-inf past a row's position) and the slot's key bias (a blend's `stale_key_bias`, copied into the
  slab's bias bank once per request, when it first decodes);
- the RoPE table the step reads is the one at capture time (kept alive by the step: the engine may grow it).

The same step runs without capture on any device (`DecodeGraphs(capture=False)`): that is how the CPU tests
check it against the eager step (engine/batched_decode.py). Requests whose cache is not in a slot (unpooled,
or grown past its class) decode eagerly beside the captured groups. A capture that fails turns graphs off for
the engine, logged once: decode goes on eagerly.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from engine.cache_slab import Slab
from engine.layers import Transformer
from engine.working_cache import WorkingCache

logger = logging.getLogger(__name__)

DecodeGraphsSetting = Literal["auto", "off"]
# Eager runs before a capture: lazy initialisation (cuBLAS handles and workspaces, kernel selection) must not
# happen inside the capture.
_WARMUP_STEPS = 2
_TOKEN, _POSITION, _SLOT = 0, 1, 2  # the rows of StaticDecode.inputs

EagerDecode = Callable[[Transformer, list[WorkingCache], list[int]], torch.Tensor]


def use_decode_graphs(setting: DecodeGraphsSetting, device: torch.device) -> bool:
    """Which decode path: captured on CUDA unless the setting is off; eager on every other device."""
    return setting == "auto" and device.type == "cuda"


def batch_class(num_rows: int) -> int:
    """The batch size of the graph a step of `num_rows` requests replays: the least power of two ≥ it."""
    if num_rows < 1:
        raise ValueError(f"a decode step needs at least one row, got {num_rows}")
    size = 1
    while size < num_rows:
        size *= 2
    return size


def step_inputs(caches: list[WorkingCache], token_ids: list[int], batch: int, scratch: int) -> torch.Tensor:
    """(3, batch) int64 on the host: token id, position and slot of each row; rows past the requests are padding
    (token 0 at position 0 of the `scratch` slot). Every cache must be in a slot (`WorkingCache.in_slot`)."""
    if len(caches) != len(token_ids) or not 0 < len(caches) <= batch:
        raise ValueError(f"{len(caches)} caches and {len(token_ids)} tokens for a batch of {batch}")
    inputs = torch.zeros(3, batch, dtype=torch.int64)
    inputs[_SLOT] = scratch
    for b, (cache, token) in enumerate(zip(caches, token_ids, strict=True)):
        if not cache.in_slot:
            raise ValueError("a captured decode step needs caches in pool slots")
        inputs[_TOKEN, b] = token
        inputs[_POSITION, b] = cache.length
        inputs[_SLOT, b] = cache.slot.index  # type: ignore[union-attr]
    return inputs


@dataclass(eq=False)
class _SlabState:
    """What decode keeps beside a slab: each slot's key bias and the steps captured over the slab."""

    key_bias: torch.Tensor  # (slots, capacity) additive bias per slot, in the compute dtype; 0: none
    # The cache (weakly: it must not outlive its request, its slot returns when it dies) and the key bias each
    # slot's row was loaded for, so the row is written once per request.
    bias_source: list[tuple[weakref.ref[WorkingCache], torch.Tensor | None] | None]
    steps: dict[tuple[int, int], StaticDecode] = field(default_factory=dict)  # by (id(transformer), batch)


class StaticDecode:
    """The decode step of `batch` rows over one slab, on static buffers: what a CUDA graph records.

    It holds the slab's tensors, never the `Slab` itself: the decode state of a slab lives as long as the pool
    keeps the slab (`DecodeGraphs._slabs` is keyed weakly by it), and an evicted slab's graphs go with it."""

    def __init__(self, tf: Transformer, slab: Slab, key_bias: torch.Tensor, batch: int) -> None:
        self.tf = tf
        self.k, self.v = slab.k, slab.v  # (layers, slots, kv_heads, capacity, D) each
        self.scratch = slab.scratch
        self.key_bias = key_bias  # the slab's bias bank (_SlabState.key_bias)
        self.batch = batch
        self.inputs = torch.zeros(3, batch, dtype=torch.int64, device=tf.device)
        # A pinned host copy of the inputs: each step's are written here and copied without a sync. The event
        # marks the copy done, so the next step never overwrites the host buffer while it is still being read.
        on_cuda = tf.device.type == "cuda"
        self._host_inputs = torch.zeros(3, batch, dtype=torch.int64, pin_memory=on_cuda)
        self._copied = torch.cuda.Event() if on_cuda else None
        self.key_positions = torch.arange(slab.capacity, device=tf.device)  # (capacity,)
        # The tables at capture time, kept even after the engine grows its own: the model's, and the sliding-window
        # layers' (Gemma 3) when they rotate with another base.
        self.tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for idx in range(tf.cfg.num_layers):
            rope = tf.layer_rope(idx)
            rope.ensure(slab.capacity)
            self.tables.setdefault(id(rope), (rope.cos, rope.sin))
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # (batch, vocab) float32: the captured step's output

    def load(self, inputs: torch.Tensor) -> None:
        """Copy a step's inputs (`step_inputs`) into the static buffer, queued on the stream (no host wait)."""
        if self._copied is not None:
            self._copied.synchronize()  # long done in practice: the last step's logits were sampled since
        self._host_inputs.copy_(inputs)
        self.inputs.copy_(self._host_inputs, non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def step(self) -> torch.Tensor:
        """One token for each row through the model against its slot: next-token logits (batch, vocab) float32.

        Reads only `inputs`, the slab, its bias bank, the RoPE table and the weights; writes each row's K/V at its
        position in its slot. No value is read back to the host and every shape is fixed by (batch, capacity).
        """
        tf, cfg = self.tf, self.tf.cfg
        bsz, heads, kv_heads, d = self.batch, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        tokens, positions, slots = self.inputs[_TOKEN], self.inputs[_POSITION], self.inputs[_SLOT]  # (B,) each
        # (B, 1, 1, D/2) per table: over (B, 1, heads, D)
        rotations = {
            key: (cos.index_select(0, positions)[:, None, None], sin.index_select(0, positions)[:, None, None])
            for key, (cos, sin) in self.tables.items()
        }
        # Row b sees its slot's keys 0…positions[b] (its own included), each with the slot's key bias; in a
        # sliding-window layer only those after positions[b] - window.
        later = self.key_positions[None, :] > positions[:, None]  # (B, capacity)
        bias = self.key_bias.index_select(0, slots)
        # (B, 1, 1, capacity) by window
        masks: dict[int | None, torch.Tensor] = {None: bias.masked_fill(later, float("-inf"))[:, None, None]}
        for window in {w for w in tf.windows if w is not None}:
            old = self.key_positions[None, :] <= positions[:, None] - window
            masks[window] = bias.masked_fill(later | old, float("-inf"))[:, None, None]
        h = tf.embed(tokens)[:, None]  # (B, 1, hidden)
        for idx in range(cfg.num_layers):
            rope, mask = tf.layer_rope(idx), masks[tf.windows[idx]]
            q, _, k, v = tf.qkv(idx, h, *rotations[id(rope)])  # q (B, 1, heads, D); k (RoPE'd), v (B, 1, kv_heads, D)
            slab_k, slab_v = self.k[idx], self.v[idx]  # (slots, kv_heads, capacity, D)
            slab_k[slots, :, positions] = k[:, 0]  # row b's key at (slots[b], :, positions[b])
            slab_v[slots, :, positions] = v[:, 0]
            keys = slab_k.index_select(0, slots)  # (B, kv_heads, capacity, D)
            values = slab_v.index_select(0, slots)
            # As `batched_decode.attend_one`: the query heads of a KV head attend as rows of that head.
            q = q.view(bsz, kv_heads, heads // kv_heads, d)  # (B, kv_heads, group, D)
            # (B, kv_heads, group, D)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=cfg.attn_scale)
            h = tf.output_and_mlp(idx, h, o.reshape(bsz, 1, heads * d))
        return tf.logits(h[:, 0])

    def capture(self) -> None:
        """Record `step` in a CUDA graph. The warm-up runs and the capture see padding rows only (the scratch
        slot): they write nothing a request reads."""
        if self.k.device.type != "cuda":  # a graph of work on another device would record nothing and replay nothing
            raise RuntimeError(f"a CUDA graph records CUDA work; this step runs on {self.k.device.type}")
        padding = torch.zeros(3, self.batch, dtype=torch.int64)
        padding[_SLOT] = self.scratch  # type: ignore[assignment]
        self.load(padding)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_STEPS):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a capture between two layers of a prompt pass must not fail on what the pass's background
        # thread (reading and rotating the next layer's stored KV) does on the device meanwhile.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.logits = self.step()
        self.graph = graph

    def run(self, inputs: torch.Tensor) -> torch.Tensor:
        """The step for these inputs: replayed when captured, else run as is. (batch, vocab) float32, a tensor
        the next step does not overwrite."""
        self.load(inputs)
        if self.graph is None:
            return self.step()
        self.graph.replay()
        return self.logits.clone()  # type: ignore[union-attr]


class DecodeGraphs:
    """Decode steps of requests in pool slots through `StaticDecode`, captured when `capture` is set (CUDA)."""

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.enabled = True  # False once a capture failed: every later step is eager
        self._slabs: weakref.WeakKeyDictionary[Slab, _SlabState] = weakref.WeakKeyDictionary()

    def decode(
        self, tf: Transformer, caches: list[WorkingCache], token_ids: list[int], eager: EagerDecode
    ) -> torch.Tensor:
        """Feed token_ids[b] after caches[b]'s last position; next-token logits (B, vocab) float32, as `eager`
        (`batched_decode.decode_batch`) gives them. The caches of one slab run as one static step; the others
        (and all of them once graphs are off) run through `eager` together."""
        groups: dict[Slab, list[int]] = {}
        rest: list[int] = []
        for b, cache in enumerate(caches):
            slot = cache.slot
            if self.enabled and slot is not None and cache.in_slot and slot.slab.scratch is not None:
                groups.setdefault(slot.slab, []).append(b)
            else:
                rest.append(b)
        rows: dict[int, torch.Tensor] = {}
        for slab, members in groups.items():
            logits = self._static_step(tf, slab, [caches[b] for b in members], [token_ids[b] for b in members])
            if logits is None:
                rest.extend(members)
                continue
            rows.update(zip(members, logits, strict=True))
        if rest:
            rest.sort()
            logits = eager(tf, [caches[b] for b in rest], [token_ids[b] for b in rest])
            rows.update(zip(rest, logits, strict=True))
        return torch.stack([rows[b] for b in range(len(caches))])

    def _static_step(
        self, tf: Transformer, slab: Slab, caches: list[WorkingCache], token_ids: list[int]
    ) -> torch.Tensor | None:
        """Logits (n, vocab) of one slab's requests, their caches one position longer; None when the capture
        fails (graphs go off, logged once) and the caller decodes them eagerly."""
        state = self._slabs.get(slab)
        if state is None:
            bank = torch.zeros(slab.k.shape[1], slab.capacity, dtype=tf.dtype, device=tf.device)
            state = self._slabs[slab] = _SlabState(key_bias=bank, bias_source=[None] * slab.k.shape[1])
        for cache in caches:
            self._load_key_bias(state, cache)
        batch = batch_class(len(caches))
        static = state.steps.get((id(tf), batch))
        if static is None:
            static = StaticDecode(tf, slab, state.key_bias, batch)
            if self.capture:
                try:
                    static.capture()
                except Exception:
                    self.enabled = False
                    logger.warning("decode graphs off: capturing the decode step failed; eager decode", exc_info=True)
                    return None
                logger.info("decode graph captured: batch %d, %d-token caches", batch, slab.capacity)
            state.steps[(id(tf), batch)] = static
        logits = static.run(step_inputs(caches, token_ids, batch, slab.scratch))  # type: ignore[arg-type]
        for cache in caches:
            cache.length += 1
        return logits[: len(caches)]

    @staticmethod
    def _load_key_bias(state: _SlabState, cache: WorkingCache) -> None:
        """The slot's row of the bias bank holds this cache's key bias (or 0): copied when the slot's request
        changed, so a later request never inherits an earlier one's bias."""
        index = cache.slot.index  # type: ignore[union-attr]
        source = state.bias_source[index]
        if source is not None and source[0]() is cache and source[1] is cache.key_bias:
            return
        row = state.key_bias[index]
        if cache.key_bias is None:
            row.zero_()
        else:
            row.copy_(cache.key_bias[: row.shape[0]])
        state.bias_source[index] = (weakref.ref(cache), cache.key_bias)

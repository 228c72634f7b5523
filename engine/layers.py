"""The transformer itself: RMSNorm, RoPE, GQA attention with an exact causal mask, SwiGLU MLP (GeGLU for Gemma).

One function per layer, readable top to bottom. A layer runs for an arbitrary, ascending set of rows
(`Rows`): all prompt tokens (full prefill), a chunk (ingest), the tokens selected for recompute
(blend), or one new token (decode). Keys are whatever the working cache holds in 0…kv_len-1, and
whether a query may see a key is decided from their absolute positions alone (key_pos <= query_pos), so
a recomputed token never sees a later token, whichever subset of rows is being computed. A sliding-window
layer (Gemma 3's local layers) also hides the keys at or before query_pos - window, in every row set, and
rotates with a RoPE base of its own: `Rows.local` carries those layers' cos/sin and blocks.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.model import SLIDING_ATTENTION, LoadedModel, ModelWeights
from engine.packed_linear import linear
from engine.rope import RopeTable, apply_rope, rope_inv_freq
from engine.threads import SERIAL_MAX_ELEMENTS, parallel, serial
from engine.working_cache import WorkingCache

if TYPE_CHECKING:
    from engine.model import Weight

# SDPA's CPU flash kernel, called directly because it also returns each row's log-sum-exp of the logits
# (B, heads, rows) float32, which merging two calls over disjoint keys needs. A row whose keys are all masked
# gets output 0 and log-sum-exp 0 (not -inf): `_attention_blocks` never builds one.
_flash_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

# Selected rows are attended in blocks so that each block only reads keys up to its last position:
# roughly halves attention work compared with one (rows × all keys) call, at a few calls per layer. With the
# keys before a block's first row attended without a mask (`AttentionBlock.shared_until`), more blocks leave
# less masked work: twelve measured best on a 3.5k-token blend (docs/benchmarks.md). Rows whose blocks are not
# split (a sliding-window layer's, an accelerator's) keep six: their figures were measured with six.
_MAX_ATTENTION_BLOCKS = 6
_MAX_SPLIT_BLOCKS = 12
_MIN_BLOCK_ROWS = 64
# A block's keys before its first row are seen by every row of it: on a CPU they are attended without the causal
# mask, in a call of their own, when there are at least this many (`AttentionBlock.shared_until`).
_MIN_SHARED_KEYS = 32
# Padding a contiguous block of rows with up to this share of extra (causal) attention work still beats
# attending with an explicit mask, which cannot skip the masked half.
_MAX_PAD_SHARE = 0.1


@dataclass
class AttentionBlock:
    rows: slice  # which of the Rows' queries
    kv_len: int  # keys kv_start…kv_len-1
    mask: torch.Tensor | None  # (num_rows, kv_len - kv_start) additive: 0 may attend, -inf may not; None: all keys
    is_causal: bool = False  # rows are exactly positions pad_rows…kv_len-1: SDPA's own causal kernel
    pad_rows: int = 0  # zero query rows put in front so that the rows line up with SDPA's causal mask
    kv_start: int = 0  # keys before it are outside every row's sliding window: not read at all
    # > kv_start: keys kv_start…shared_until-1 are seen by every row. They are attended without the causal mask
    # (`shared_bias`: the key bias over them, or None), the keys shared_until…kv_len-1 with `mask`, in the GQA
    # row layout (group · rows, kv_len - shared_until), and the two merged by their log-sum-exp (`attend`).
    shared_until: int = 0
    shared_bias: torch.Tensor | None = None  # (shared_until - kv_start,) additive


@dataclass
class Rows:
    """The rows a layer computes: their absolute positions plus everything derived from them once
    (RoPE cos/sin, attention masks), reused by every layer instead of being rebuilt per layer."""

    positions: torch.Tensor  # (n,) int64, strictly ascending
    span: slice | None  # the same positions as a slice when they are contiguous (cheaper cache writes)
    cos: torch.Tensor  # (n, 1, head_dim/2): broadcasts over heads in the (B, n, heads, D) layout
    sin: torch.Tensor  # (n, 1, head_dim/2)
    blocks: list[AttentionBlock]
    # The same rows as the sliding-window layers see them (their RoPE base, their window in the masks); None for
    # a model without such layers, and in the `local` itself.
    local: Rows | None = None

    @property
    def num_rows(self) -> int:
        return self.positions.shape[0]


def gqa_rows(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q (B, heads, n, D) as (B, kv_heads, group · n, D): the query heads sharing a KV head are consecutive (HF's
    repeat_interleave order), so they stack into the rows of one GEMM or attention call against that head's keys."""
    bsz, heads, n, d = q.shape
    return q.reshape(bsz, num_kv_heads, (heads // num_kv_heads) * n, d)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32 like the reference implementation, then scale in the model dtype.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class Transformer:
    """Stateless forward pass over a loaded model; safe to use from several threads at once."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.cfg = model.config
        self.w = model.weights
        self.device = model.device
        self.dtype = model.dtype
        cfg = self.cfg
        initial = min(cfg.max_position_embeddings, 8192)
        # Per layer: its sliding window, None for full attention (every layer of a Llama-family model).
        self.windows: tuple[int | None, ...] = cfg.layer_windows or (None,) * cfg.num_layers
        # A model with sliding-window layers (Gemma 3) keeps a RoPE per layer type: the full layers' in `rope`,
        # the sliding layers' in `rope_local`.
        typed = bool(cfg.layer_windows)
        inv_freq, scaling = rope_inv_freq(model.hf_config, cfg.head_dim, "full_attention" if typed else None)
        self.rope = RopeTable(inv_freq, scaling, model.dtype, model.device, initial_positions=initial)
        self.rope_local: RopeTable | None = None
        if any(w is not None for w in self.windows):
            local_freq, local_scaling = rope_inv_freq(model.hf_config, cfg.head_dim, SLIDING_ATTENTION)
            self.rope_local = RopeTable(local_freq, local_scaling, model.dtype, model.device, initial_positions=initial)
        # Gemma scales embeddings by √hidden, rounded to the model dtype as Gemma3TextScaledWordEmbedding does.
        self.embed_scale = (
            None
            if cfg.embed_scale is None
            else torch.tensor(cfg.embed_scale, dtype=torch.float32).to(device=model.device, dtype=model.dtype)
        )
        # One thread beside the compute that reads and rotates the next layer's stored context KV while a
        # layer computes (engine/stored_context.py); shared by the requests, it starts on first use.
        self.background = ThreadPoolExecutor(1, thread_name_prefix="kv-rotate")
        # On an accelerator a row set is described without reading a device value back (engine/host_sync.py):
        # rows chosen on the device attend in one block over all keys with an exact mask, instead of blocks cut
        # at their first and last positions (which the host would have to read). On a CPU reading is free and
        # the blocks skip up to half the attention work. Tests switch it on to run the device path on a CPU.
        self.sync_free = self.device.type != "cpu"
        # The transformer decode steps run on: this one, or a copy that reads decode's compact weights
        # (engine/decode_weights.py) and shares everything else.
        self.decoder: Transformer = self

    def with_decode_weights(self, weights: ModelWeights) -> None:
        """Decode steps read `weights` (the same layers with compact GEMM weights) from now on; the prompt
        pass keeps the model's own."""
        if weights is self.w:
            self.decoder = self
            return
        decoder = copy.copy(self)
        decoder.w = weights
        decoder.decoder = decoder
        self.decoder = decoder

    def layer_rope(self, idx: int) -> RopeTable:
        """The RoPE table layer `idx` rotates with (a sliding-window layer's own, else the model's)."""
        return self.rope_local if self.windows[idx] is not None and self.rope_local is not None else self.rope

    def layer_rows(self, idx: int, rows: Rows) -> Rows:
        """`rows` as layer `idx` sees them: a sliding-window layer's RoPE and window masks, else as they are."""
        return rows.local if self.windows[idx] is not None and rows.local is not None else rows

    # ----------------------------------------------------------------------------------------- rows
    def rows(self, positions: torch.Tensor | range, kv_len: int, key_bias: torch.Tensor | None = None) -> Rows:
        """Describe the query rows at `positions` (ascending) attending to keys 0…kv_len-1.

        `key_bias` (≥ kv_len,), a working cache's `key_bias`, is folded into every block's additive mask
        once here, so each row adds it to its attention logits in every layer at no extra cost per layer.
        A model with sliding-window layers gets their view of the same rows in `Rows.local`.
        """
        rows = self._rows(positions, kv_len, key_bias, self.rope, None)
        if self.rope_local is not None:
            window = self.cfg.sliding_window
            rows.local = self._rows(positions, kv_len, key_bias, self.rope_local, window)
        return rows

    def _rows(
        self,
        positions: torch.Tensor | range,
        kv_len: int,
        key_bias: torch.Tensor | None,
        rope: RopeTable,
        window: int | None,
    ) -> Rows:
        if isinstance(positions, range):
            span: slice | None = slice(positions.start, positions.stop)
            pos = torch.arange(positions.start, positions.stop, device=self.device)
        elif self.sync_free:
            pos = positions.to(self.device, torch.int64)
            cos, sin = rope.at(pos, bound=kv_len)  # every query position is below kv_len
            return Rows(
                positions=pos,
                span=None,
                cos=cos[:, None],
                sin=sin[:, None],
                blocks=[self._one_masked_block(pos, kv_len, key_bias, window)] if pos.numel() else [],
            )
        else:
            pos = positions.to(self.device, torch.int64)
            n = pos.numel()
            first = int(pos[0]) if n else 0
            contiguous = n > 0 and int(pos[-1]) - first + 1 == n
            span = slice(first, first + n) if contiguous else None
        cos, sin = rope.at(span if span is not None else pos)
        return Rows(
            positions=pos,
            span=span,
            cos=cos[:, None],
            sin=sin[:, None],
            blocks=self._attention_blocks(pos, span, kv_len, key_bias, window),
        )

    def _one_masked_block(
        self, pos: torch.Tensor, kv_len: int, key_bias: torch.Tensor | None, window: int | None = None
    ) -> AttentionBlock:
        """All rows at device positions `pos` against keys 0…kv_len-1 in one attention call, with the exact
        causal mask from absolute positions (and the key bias) built on the device: (rows, kv_len) additive.
        A sliding `window` also hides the keys at or before each row's position - window."""
        key_pos = torch.arange(kv_len, device=self.device)
        later = key_pos[None, :] > pos[:, None]  # (rows, kv_len): may not see
        if window is not None and kv_len > window:
            later |= key_pos[None, :] <= pos[:, None] - window  # outside the window: may not see either
        if key_bias is None:
            base = torch.zeros(later.shape, dtype=self.dtype, device=self.device)
        else:
            base = key_bias[:kv_len].to(self.device, self.dtype)[None, :].expand(later.shape).clone()
        return AttentionBlock(rows=slice(0, pos.numel()), kv_len=kv_len, mask=base.masked_fill_(later, float("-inf")))

    def _attention_blocks(
        self,
        pos: torch.Tensor,
        span: slice | None,
        kv_len: int,
        key_bias: torch.Tensor | None = None,
        window: int | None = None,
    ) -> list[AttentionBlock]:
        n = pos.numel()
        if n == 0:
            return []
        if window is not None and kv_len <= window:
            window = None  # no query is `window` positions past any key: the window hides nothing
        bias = None if key_bias is None else key_bias[:kv_len].to(self.device, self.dtype)  # (kv_len,)
        if (
            bias is None
            and window is None
            and span is not None
            and span.stop == kv_len
            and span.start**2 <= _MAX_PAD_SHARE * kv_len**2
        ):
            # Contiguous rows that end at the last key (full prefill, chunk prefill behind the prefix, the
            # early blend layers): SDPA's causal kernel skips the masked half and builds no mask. Its mask
            # is top-left aligned, so the rows are shifted down by `start` zero rows whose output is dropped.
            return [AttentionBlock(rows=slice(0, n), kv_len=kv_len, mask=None, is_causal=True, pad_rows=span.start)]
        num_blocks = _MAX_SPLIT_BLOCKS if window is None and not self.sync_free else _MAX_ATTENTION_BLOCKS
        block_rows = max(_MIN_BLOCK_ROWS, -(-n // num_blocks))
        blocks = []
        key_pos = torch.arange(kv_len, device=self.device)
        for start in range(0, n, block_rows):
            q_pos = pos[start : start + block_rows]  # (rows,)
            first, last = (
                (int(q_pos[0]), int(q_pos[-1]))
                if span is None
                else (span.start + start, span.start + start + q_pos.numel() - 1)
            )
            block_kv = min(kv_len, last + 1)
            # A sliding window: keys at or before the first row's position - window are hidden from every row.
            kv_start = 0 if window is None else max(0, first - window + 1)
            # Exact causal mask from absolute positions (never "bottom-right aligned").
            # A biased cache gives every block a mask (the bias plus the causal part), even one row that sees
            # every key.
            mask = None
            windowed = window is not None and last - window >= kv_start  # some key of the range is too old
            # On a CPU the keys before the first row, seen by every row, go without a mask when there are enough
            # of them (the key `first` stays in the masked part, so that no row of it has every key masked).
            # The split calls SDPA's CPU kernel: an accelerator's contiguous rows keep one masked call.
            split = not self.sync_free and not windowed and first - kv_start >= _MIN_SHARED_KEYS
            shared_until = first if split else 0
            masked_from = shared_until or kv_start
            if bias is not None or first + 1 < block_kv or windowed:
                # Additive float mask, built once per row set: SDPA would convert a bool mask per call. A few
                # element-wise passes over (rows × keys): on one thread, like the layers' small ops.
                small = q_pos.numel() * (block_kv - masked_from) <= SERIAL_MAX_ELEMENTS
                with serial(self.device.type == "cpu" and small):
                    keys = key_pos[masked_from:block_kv][None, :]
                    later = keys > q_pos[:, None]  # (rows, block_kv - masked_from): may not see
                    if windowed:
                        later |= keys <= q_pos[:, None] - window  # outside the row's window
                    base = (
                        torch.zeros(later.shape, dtype=self.dtype, device=self.device)
                        if bias is None
                        else bias[None, masked_from:block_kv].expand(later.shape).clone()
                    )
                    mask = base.masked_fill_(later, float("-inf"))
                    if shared_until:
                        mask = mask.repeat(self.cfg.num_heads // self.cfg.num_kv_heads, 1)  # the GQA row layout
            blocks.append(
                AttentionBlock(
                    rows=slice(start, start + q_pos.numel()),
                    kv_len=block_kv,
                    mask=mask,
                    kv_start=kv_start,
                    shared_until=shared_until,
                    shared_bias=None if bias is None or not shared_until else bias[kv_start:shared_until],
                )
            )
        return blocks

    # ------------------------------------------------------------------------------------- helpers
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_scale is not None:
            return self.w.embed[token_ids] * self.embed_scale  # (…, hidden)
        return self.w.embed[token_ids]  # (…, hidden)

    def serial_small(self, h: torch.Tensor):
        """Serialise the element-wise ops of a layer over few rows (see engine/threads.py)."""
        numel = h.shape[0] * h.shape[1] * self.cfg.intermediate_size  # the MLP's widest activation
        return serial(self.device.type == "cpu" and numel <= SERIAL_MAX_ELEMENTS)

    @staticmethod
    def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        with parallel():
            if isinstance(weight, torch.Tensor):
                return linear(x, weight, bias)  # a plain or a oneDNN-packed weight (engine/packed_linear.py)
            out = weight.matmul(x)  # decode's int8/int4 copy (engine/decode_weights.py)
            return out if bias is None else out + bias

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Next-token logits (float32) for hidden states (…, hidden) after the last layer."""
        return self.linear(rms_norm(h, self.w.final_norm, self.cfg.rms_norm_eps), self.w.lm_head).float()

    def attend(self, q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, rows: Rows) -> torch.Tensor:
        """q (B, heads, n, D) against cache_k/v (B, kv_heads, capacity, D) → (B, n, heads, D).

        The output comes back row-major (ready for the output projection) so that the blocks are
        assembled with one copy.
        """
        gqa = self.cfg.num_heads != self.cfg.num_kv_heads
        scale = self.cfg.attn_scale  # None: SDPA's head_dim^-½
        outs = []
        for b in rows.blocks:
            if b.shared_until:
                outs.append(self._attend_shared_and_masked(q[:, :, b.rows], cache_k, cache_v, b))
                continue
            k, v = cache_k[:, :, b.kv_start : b.kv_len], cache_v[:, :, b.kv_start : b.kv_len]
            if b.pad_rows:
                padded = torch.cat([q.new_zeros(q.shape[0], q.shape[1], b.pad_rows, q.shape[3]), q], dim=2)
                with parallel():
                    out = F.scaled_dot_product_attention(padded, k, v, is_causal=True, enable_gqa=gqa, scale=scale)
                out = out[:, :, b.pad_rows :]
            else:
                with parallel():
                    out = F.scaled_dot_product_attention(
                        q[:, :, b.rows], k, v, attn_mask=b.mask, is_causal=b.is_causal, enable_gqa=gqa, scale=scale
                    )
            outs.append(out.transpose(1, 2))  # (B, rows, heads, D)
        return outs[0].contiguous() if len(outs) == 1 else torch.cat(outs, dim=1)

    def _attend_shared_and_masked(
        self, q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, b: AttentionBlock
    ) -> torch.Tensor:
        """A block's rows q (B, heads, rows, D) over its keys in two calls → (B, rows, heads, D).

        The keys kv_start…shared_until-1 precede every row: attended with no causal mask, so the kernel does all
        of that work and none of a mask's (reading it, masking half of the last key tiles). Only the keys from
        the block's first row on carry the mask. Each call returns its rows' log-sum-exp of the logits; the
        softmax over all keys is each part's output weighted by its share of the total exp-mass.
        The query heads go in as `gqa_rows`: K and V are never repeated per query head.
        """
        bsz, heads, num_rows, d = q.shape
        qg = gqa_rows(q, self.cfg.num_kv_heads)  # (B, kv_heads, group · rows, D)
        shared_mask = None if b.shared_bias is None else b.shared_bias[None, :].expand(qg.shape[2], -1)
        s, e, scale = b.kv_start, b.shared_until, self.cfg.attn_scale
        with parallel():
            out_shared, lse_shared = _flash_attention(
                qg, cache_k[:, :, s:e], cache_v[:, :, s:e], attn_mask=shared_mask, scale=scale
            )
            out_masked, lse_masked = _flash_attention(
                qg, cache_k[:, :, e : b.kv_len], cache_v[:, :, e : b.kv_len], attn_mask=b.mask, scale=scale
            )
        lse = torch.logaddexp(lse_shared, lse_masked)  # (B, kv_heads, group · rows) float32
        out = out_shared.float().mul_(lse_shared.sub_(lse).exp_()[..., None])  # the kernels' outputs are ours
        out.addcmul_(out_masked.float(), lse_masked.sub_(lse).exp_()[..., None])
        return out.to(q.dtype).view(bsz, heads, num_rows, d).transpose(1, 2)

    def attention_probs(self, q: torch.Tensor, cache_k: torch.Tensor, rows: Rows, kv_len: int) -> torch.Tensor:
        """Softmax attention weights of q (B, heads, n, D) over keys 0…kv_len-1 of cache_k
        (B, kv_heads, capacity, D), exact causal mask from absolute positions: (B, heads, n, kv_len) float32.

        Only the query selector's scoring pass needs the weights themselves (SDPA never returns them);
        it runs for the few suffix rows, so the explicit (n × kv_len) matrix is small. The mask is the full
        layers' (the caller names no layer): on a sliding-window layer these are scores over every key, what
        the selector ranks the context by, not what the layer attends to.
        """
        cfg = self.cfg
        bsz, heads, n, d = q.shape
        k = cache_k[:, :, :kv_len].float()  # (B, kv_heads, kv_len, D); a view in float32
        qg = gqa_rows(q.float(), cfg.num_kv_heads)  # GQA without repeating K per query head
        with parallel():
            scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim**-0.5
            scores = torch.matmul(qg, k.transpose(-1, -2)).view(bsz, heads, n, kv_len) * scale
        key_pos = torch.arange(kv_len, device=self.device)
        scores.masked_fill_(key_pos[None, :] > rows.positions[:, None], float("-inf"))
        return torch.softmax(scores, dim=-1)

    # --------------------------------------------------------------------------------------- layer
    def layer(
        self, idx: int, h: torch.Tensor, rows: Rows, cache: WorkingCache, kv_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run layer `idx` for `rows`. Writes their K (RoPE'd) and V into `cache` at their positions.

        h: (B, n, hidden). Returns (h_out (B, n, hidden), k before RoPE (B, kv_heads, n, D),
        v (B, kv_heads, n, D)). With kv_only the attention/MLP are skipped and h is returned unchanged
        (the last layer of a chunk precompute only needs its K/V).
        """
        q, k, v = self.project_qkv(idx, h, rows, cache)
        if kv_only:
            return h, k, v
        return self.attend_and_mlp(idx, h, q, rows, cache), k, v

    def project_qkv(
        self, idx: int, h: torch.Tensor, rows: Rows, cache: WorkingCache
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """First half of a layer: q (RoPE'd, (B, heads, n, D)), and K/V written into the cache.

        Returns q, k before RoPE and v, the latter two as (B, kv_heads, n, D). The blend's check layer
        stops here for all rows, picks the rows to keep from V, and runs the second half for those only.
        """
        with self.serial_small(h):
            return self._project_qkv(idx, h, rows, cache)

    def _project_qkv(
        self, idx: int, h: torch.Tensor, rows: Rows, cache: WorkingCache
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        seen = self.layer_rows(idx, rows)
        q, k, k_rot, v = self.qkv(idx, h, seen.cos, seen.sin)
        where = rows.span if rows.span is not None else rows.positions
        cache.k[idx][:, :, where] = k_rot.transpose(1, 2)
        cache.v[idx][:, :, where] = v.transpose(1, 2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    # The two halves of the layer body around attention. Every row set (`layer`, `project_qkv`,
    # `attend_and_mlp`) and batched decode (engine/batched_decode.py) run exactly these; only how the
    # new K/V reach a cache and how attention reads it differ.
    def qkv(
        self, idx: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Norm, QKV projection and RoPE of h (B, n, hidden); cos/sin broadcast over (B, n, heads, D/2).

        Returns q (RoPE'd, (B, n, heads, D)), k before RoPE, k after RoPE and v, each (B, n, kv_heads, D).
        """
        cfg, w = self.cfg, self.w.layers[idx]
        bsz, n, _ = h.shape
        heads, kv_heads, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

        x = rms_norm(h, w.attn_norm, cfg.rms_norm_eps)
        qkv = self.linear(x, w.wqkv, w.bqkv)  # (B, n, (heads + 2·kv_heads)·D)
        q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        # RoPE is applied in the (B, n, heads, D) layout the GEMM produced: rotating a transposed view
        # is far slower on CPU because every element access is strided.
        q = q.view(bsz, n, heads, d)
        k = k.view(bsz, n, kv_heads, d)  # before RoPE
        v = v.view(bsz, n, kv_heads, d)
        if w.q_norm is not None and w.k_norm is not None:
            # Qwen3, Gemma 3: an RMSNorm over each head's queries and keys before RoPE; the stored K is the normed one.
            q = rms_norm(q, w.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, w.k_norm, cfg.rms_norm_eps)
        k_rot = apply_rope(k, cos, sin)
        q = apply_rope(q, cos, sin)
        return q, k, k_rot, v

    def output_and_mlp(self, idx: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Output projection of the attention output o (B, n, heads·D), residual, gated MLP (SwiGLU; GeGLU with
        tanh GELU for Gemma), residual. Gemma norms each branch's output before its residual too."""
        cfg, w = self.cfg, self.w.layers[idx]
        attn = self.linear(o, w.wo, w.bo)
        if w.post_attn_norm is not None:
            attn = rms_norm(attn, w.post_attn_norm, cfg.rms_norm_eps)
        h = h + attn
        x = rms_norm(h, w.mlp_norm, cfg.rms_norm_eps)
        gate, up = self.linear(x, w.w_gate_up, w.b_gate_up).chunk(2, dim=-1)  # (B, n, intermediate) each
        act = F.silu(gate) if cfg.activation == "silu" else F.gelu(gate, approximate="tanh")
        mlp = self.linear(act * up, w.w_down, w.b_down)
        if w.post_mlp_norm is not None:
            mlp = rms_norm(mlp, w.post_mlp_norm, cfg.rms_norm_eps)
        return h + mlp

    def attend_and_mlp(
        self, idx: int, h: torch.Tensor, q: torch.Tensor, rows: Rows, cache: WorkingCache
    ) -> torch.Tensor:
        """Second half of a layer for `rows`: attention over the cache, output projection, SwiGLU MLP."""
        cfg = self.cfg
        bsz, n, _ = h.shape
        with self.serial_small(h):
            o = self.attend(q, cache.k[idx], cache.v[idx], self.layer_rows(idx, rows))  # (B, n, heads, D)
            return self.output_and_mlp(idx, h, o.view(bsz, n, cfg.num_heads * cfg.head_dim))

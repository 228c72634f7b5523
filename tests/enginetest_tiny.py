"""Tiny random Llama-family checkpoints (+ a tiny byte-level BPE tokenizer) for fast, exact tests."""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Question: who jumps? Answer: the fox.",
    "Documents describe rivers, mountains and cities; café naïve résumé — ünïcödé 東京 🙂 text.",
    "You are a helpful assistant. Answer the question using the documents. Be concise.",
] * 20


def build_tokenizer(out_dir: Path, vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_model(out_dir: Path, kind: str = "llama", seed: int = 0, **overrides) -> Path:
    """Save a randomly initialised tiny model of `kind` (llama | qwen2 | mistral) with a tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    params = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    params.update(overrides)
    config = AutoConfig.for_model(kind, **params)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger-than-default weights so that attention is far from uniform
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.ndim == 2:
                p.copy_(torch.randn_like(p) * (1.0 / p.shape[1] ** 0.5))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


ROPE_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
ROPE_LINEAR = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}


def random_chunks(lengths: list[int], seed: int, vocab_size: int = 320) -> list[list[int]]:
    """Token ids of random chunks (no special tokens: ids 0-2 are reserved)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (n,), generator=gen).tolist() for n in lengths]


def engine_logits(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """The engine's logits at every position of `token_ids`, one forward on the CPU in float32 (to hold against
    `hf_logits`)."""
    from engine.extend import extend
    from engine.layers import Transformer
    from engine.model import load_model
    from engine.working_cache import WorkingCache

    tf = Transformer(load_model(model_dir, "float32", "cpu"))
    cfg = tf.cfg
    cache = WorkingCache.allocate(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, len(token_ids), tf.dtype, tf.device)
    return extend(tf, cache, token_ids, all_logits=True)


def hf_logits(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """Reference logits of every position from transformers' own forward pass: (T, vocab)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    kv_len: int,
    key_bias: torch.Tensor | None = None,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The reference for `Transformer.attend`: softmax(q·kᵀ/√d (+ key_bias), exact causal mask from the rows'
    absolute positions) · v over keys 0…kv_len-1, GQA heads repeated. q (1, heads, n, D), k/v (1, kv_heads,
    ≥ kv_len, D) → (1, heads, n, D). `window`: a sliding window (a row sees keys q - window < k <= q);
    `scale`: of q·k instead of 1/√d."""
    group = q.shape[1] // k.shape[1]
    ke, ve = k[:, :, :kv_len].repeat_interleave(group, 1), v[:, :, :kv_len].repeat_interleave(group, 1)
    scores = q @ ke.transpose(-1, -2)
    scores = scores / q.shape[-1] ** 0.5 if scale is None else scores * scale
    if key_bias is not None:
        scores = scores + key_bias[:kv_len]
    allowed = torch.arange(kv_len)[None, :] <= positions[:, None]
    if window is not None:
        allowed &= torch.arange(kv_len)[None, :] > positions[:, None] - window
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ ve


def assert_blend_at_ratio_one_is_full(engine, config, sync_free: bool, atol: float = 1e-4) -> None:  # noqa: ANN001
    """A blend recomputing every row equals full prefill (logits and K), which equals transformers' logits; with
    `sync_free` the row sets an accelerator uses (no host reads), run on the CPU (engine/layers.py)."""
    from kvcache.types import InMemoryLayerReader

    tf = engine.transformer
    before, tf.sync_free = tf.sync_free, sync_free
    try:
        chunks = random_chunks([23, 40, 17], seed=11)
        layout = engine.prompt.layout(chunks, "who jumps over the lazy dog?")
        reader = InMemoryLayerReader(engine.precompute_chunks(chunks))
        full = engine.prompt_pass(layout, None, "full")
        blend = engine.prompt_pass(layout, reader, "blend", config)
    finally:
        tf.sync_free = before
    torch.testing.assert_close(blend.logits, full.logits, atol=atol, rtol=0)
    n = layout.num_tokens
    torch.testing.assert_close(blend.cache.k[:, :, :, :n], full.cache.k[:, :, :, :n], atol=atol, rtol=0)
    assert blend.num_recomputed_tokens == layout.num_context_tokens
    ref = hf_logits(Path(engine.settings.model), layout.all_ids())[-1]
    torch.testing.assert_close(full.logits, ref, atol=atol, rtol=0)

"""Llama-family checkpoints (Llama 2/3, Mistral, Qwen2, Qwen3 dense, SmolLM2, Gemma 3 text) loaded into plain tensors.

transformers is only used to read the config and to compute RoPE inverse frequencies; the weights are
read straight from the safetensors files and the forward pass lives in engine/layers.py. Per layer the
q/k/v projections are fused into one matrix and gate/up into another: two GEMMs instead of five.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.quantized_weights import QuantizedWeight

# A GEMM's weight: the model's own (out, in) tensor, or decode's compact copy (engine/decode_weights.py).
Weight = torch.Tensor | QuantizedWeight

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
QK_NORM_MODEL_TYPES = ("qwen3", "gemma3_text")  # an RMSNorm over each head's queries and keys before RoPE
# Gemma 3 (text): RMSNorms scale by (1 + weight), embeddings by √hidden, a norm after attention and after the MLP,
# GELU-tanh gates, queries scaled by query_pre_attn_scalar^-½, and sliding-window layers with a RoPE base of their own.
GEMMA_MODEL_TYPES = ("gemma3_text",)
SLIDING_ATTENTION = "sliding_attention"
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
# Bump when the numerics of the forward pass change, so stored chunk KV is recomputed, never reused stale.
ENGINE_NUMERICS_VERSION = "blendrag-engine-1"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """The checkpoint is missing, incomplete or not of a supported architecture."""


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    activation: str = "silu"  # of the MLP's gate: "silu" (SwiGLU) or "gelu_tanh" (Gemma's GeGLU)
    embed_scale: float | None = None  # Gemma: embeddings × √hidden (None: as stored)
    attn_scale: float | None = None  # Gemma: query_pre_attn_scalar^-½ (None: SDPA's default, head_dim^-½)
    # Per layer: the sliding window (a query sees keys q - window < k <= q) or None for full attention.
    layer_windows: tuple[int | None, ...] = ()

    @property
    def sliding_window(self) -> int | None:
        """The one window the sliding layers share (None: every layer attends to all keys)."""
        return next((w for w in self.layer_windows if w is not None), None)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # (hidden,)
    wqkv: Weight  # (q_size + 2·kv_size, hidden)
    bqkv: torch.Tensor | None  # (q_size + 2·kv_size,)  Qwen2 / attention_bias
    wo: Weight  # (hidden, q_size)
    bo: torch.Tensor | None
    mlp_norm: torch.Tensor  # (hidden,)
    w_gate_up: Weight  # (2·intermediate, hidden)
    b_gate_up: torch.Tensor | None
    w_down: Weight  # (hidden, intermediate)
    b_down: torch.Tensor | None
    q_norm: torch.Tensor | None = None  # (head_dim,) Qwen3: RMSNorm weight over each head's queries, before RoPE
    k_norm: torch.Tensor | None = None  # (head_dim,) Qwen3: the same over each head's keys
    post_attn_norm: torch.Tensor | None = None  # (hidden,) Gemma: RMSNorm of the attention output, before the residual
    post_mlp_norm: torch.Tensor | None = None  # (hidden,) Gemma: RMSNorm of the MLP output, before the residual


@dataclass
class ModelWeights:
    embed: torch.Tensor  # (vocab, hidden)
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # (hidden,)
    lm_head: Weight  # (vocab, hidden); the same storage as `embed` when tied


@dataclass
class LoadedModel:
    path: Path
    hf_config: Any  # transformers PretrainedConfig (RoPE init functions read it)
    config: ModelConfig
    weights: ModelWeights
    dtype: torch.dtype
    device: torch.device
    fingerprint: str


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def _read_config(path: Path) -> tuple[Any, ModelConfig]:
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(path, local_files_only=True)
    if hf.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"{path}: architecture (model_type) {hf.model_type!r} is not supported; the engine computes "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    gemma = hf.model_type in GEMMA_MODEL_TYPES
    act = getattr(hf, "hidden_activation", None) if gemma else getattr(hf, "hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise ModelLoadError(
            f"{path}: hidden activation {act!r} is not supported (gated MLPs with {', '.join(_ACTIVATIONS)})"
        )
    layer_types = getattr(hf, "layer_types", None) or []
    window = getattr(hf, "sliding_window", None)
    layer_windows: tuple[int | None, ...] = ()
    if gemma:
        _check_gemma(path, hf)
        layer_windows = tuple(int(window) if t == SLIDING_ATTENTION else None for t in layer_types)
    elif SLIDING_ATTENTION in layer_types or (hf.model_type == "mistral" and window):
        # Full attention is exact for prompts within the window; beyond it the model was trained otherwise.
        logger.warning(
            "%s: sliding-window attention (window %s) is not implemented; attending to all "
            "tokens, which matches the checkpoint only for contexts shorter than the window",
            path,
            window,
        )
    num_heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
    cfg = ModelConfig(
        model_type=hf.model_type,
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        num_layers=hf.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        rms_norm_eps=float(hf.rms_norm_eps),
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        max_position_embeddings=int(getattr(hf, "max_position_embeddings", 4096)),
        activation=_ACTIVATIONS[act],
        embed_scale=float(hf.hidden_size) ** 0.5 if gemma else None,
        attn_scale=float(hf.query_pre_attn_scalar) ** -0.5 if gemma else None,
        layer_windows=layer_windows,
    )
    return hf, cfg


def _check_gemma(path: Path, hf: Any) -> None:
    """What Gemma 3 text configs may set that the layer loop does not compute: refused, never approximated."""
    unsupported = {
        "final_logit_softcapping": getattr(hf, "final_logit_softcapping", None),
        "attn_logit_softcapping": getattr(hf, "attn_logit_softcapping", None),
        "use_bidirectional_attention": getattr(hf, "use_bidirectional_attention", None) or None,
    }
    for name, value in unsupported.items():
        if value is not None:
            raise ModelLoadError(f"{path}: {hf.model_type} with {name}={value!r} is not supported")
    layer_types = getattr(hf, "layer_types", None) or []
    if len(layer_types) != hf.num_hidden_layers or not set(layer_types) <= {SLIDING_ATTENTION, "full_attention"}:
        raise ModelLoadError(f"{path}: layer_types {layer_types!r} are not one of full/sliding_attention per layer")
    if SLIDING_ATTENTION in layer_types and not getattr(hf, "sliding_window", None):
        raise ModelLoadError(f"{path}: sliding-attention layers without a sliding_window")


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files or not all(f.is_file() for f in files):
        raise ModelLoadError(f"{path}: no complete set of *.safetensors weight files")
    return files


def _safetensors_header(file: Path) -> bytes:
    """The JSON header (names, dtypes, shapes, offsets) of one safetensors file."""
    with file.open("rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        return fh.read(size)


def _read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open is not a dict
                tensors[name] = fh.get_tensor(name)
    return tensors


def _fingerprint(hf_config: Any, files: list[Path], tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> str:
    """Stable for the same weights + dtype across restarts; different for different weights."""
    h = hashlib.sha256()
    h.update(ENGINE_NUMERICS_VERSION.encode())
    h.update(str(dtype).encode())
    config = {
        k: v
        for k, v in hf_config.to_dict().items()
        if k not in ("_name_or_path", "transformers_version", "_commit_hash", "dtype", "torch_dtype")
    }
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for file in files:
        h.update(_safetensors_header(file))
    # Headers hold offsets, not values: fine-tunes of one base share them. Hash a slice of a few tensors.
    for name in sorted(tensors)[:: max(1, len(tensors) // 8)]:
        sample = tensors[name].reshape(-1)[:4096].to(torch.float32).contiguous()
        h.update(name.encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()


def _take(tensors: dict[str, torch.Tensor], name: str, required: bool = True) -> torch.Tensor | None:
    t = tensors.pop(name, None)
    if t is None and required:
        raise ModelLoadError(f"checkpoint is missing tensor {name!r}")
    return t


def _cat_optional(parts: list[torch.Tensor | None], sizes: list[int], like: torch.Tensor) -> torch.Tensor | None:
    """Concatenate biases of a fused projection; a missing one is zeros (only when at least one exists)."""
    if all(p is None for p in parts):
        return None
    return torch.cat([p if p is not None else like.new_zeros(n) for p, n in zip(parts, sizes, strict=True)])


def load_model(path: Path, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json")
    hf_config, cfg = _read_config(path)
    files = _safetensors_files(path)
    tensors = _read_tensors(files)
    tdtype = torch_dtype(dtype)
    fingerprint = _fingerprint(hf_config, files, tensors, tdtype)
    dev = torch.device(device)

    def cvt(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device=dev, dtype=tdtype).contiguous()

    layers: list[LayerWeights] = []
    qkv_sizes = [cfg.q_size, cfg.kv_size, cfg.kv_size]
    qk_norm = cfg.model_type in QK_NORM_MODEL_TYPES
    gemma = cfg.model_type in GEMMA_MODEL_TYPES

    def norm(name: str) -> torch.Tensor:
        """An RMSNorm's weight as the layers multiply by it: Gemma's stored w scales by (1 + w), added here in
        float32 as Gemma3RMSNorm adds it (exact in float32; in a 16-bit dtype 1 + w is rounded once)."""
        t = _take(tensors, name)
        assert t is not None
        return cvt(t.float() + 1.0 if gemma else t)  # type: ignore[return-value]

    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        wq, wk, wv = (_take(tensors, p + f"self_attn.{n}_proj.weight") for n in "qkv")
        bq, bk, bv = (_take(tensors, p + f"self_attn.{n}_proj.bias", required=False) for n in "qkv")
        wgate = _take(tensors, p + "mlp.gate_proj.weight")
        wup = _take(tensors, p + "mlp.up_proj.weight")
        bgate = _take(tensors, p + "mlp.gate_proj.bias", required=False)
        bup = _take(tensors, p + "mlp.up_proj.bias", required=False)
        assert wq is not None and wk is not None and wv is not None and wgate is not None and wup is not None
        layers.append(
            LayerWeights(
                attn_norm=norm(p + "input_layernorm.weight"),
                wqkv=cvt(torch.cat([wq, wk, wv], dim=0)),  # type: ignore[arg-type]
                bqkv=cvt(_cat_optional([bq, bk, bv], qkv_sizes, wq)),
                wo=cvt(_take(tensors, p + "self_attn.o_proj.weight")),  # type: ignore[arg-type]
                bo=cvt(_take(tensors, p + "self_attn.o_proj.bias", required=False)),
                # Gemma's post_attention_layernorm norms the attention output; its pre-MLP norm has its own name.
                mlp_norm=norm(p + ("pre_feedforward_layernorm.weight" if gemma else "post_attention_layernorm.weight")),
                w_gate_up=cvt(torch.cat([wgate, wup], dim=0)),  # type: ignore[arg-type]
                b_gate_up=cvt(_cat_optional([bgate, bup], [cfg.intermediate_size] * 2, wgate)),
                w_down=cvt(_take(tensors, p + "mlp.down_proj.weight")),  # type: ignore[arg-type]
                b_down=cvt(_take(tensors, p + "mlp.down_proj.bias", required=False)),
                q_norm=norm(p + "self_attn.q_norm.weight") if qk_norm else None,
                k_norm=norm(p + "self_attn.k_norm.weight") if qk_norm else None,
                post_attn_norm=norm(p + "post_attention_layernorm.weight") if gemma else None,
                post_mlp_norm=norm(p + "post_feedforward_layernorm.weight") if gemma else None,
            )
        )
    embed = cvt(_take(tensors, "model.embed_tokens.weight"))
    lm_head_raw = _take(tensors, "lm_head.weight", required=not cfg.tie_word_embeddings)
    lm_head = embed if lm_head_raw is None else cvt(lm_head_raw)
    weights = ModelWeights(
        embed=embed,
        layers=layers,  # type: ignore[arg-type]
        final_norm=norm("model.norm.weight"),
        lm_head=lm_head,
    )  # type: ignore[arg-type]
    leftover = [n for n in tensors if "rotary_emb" not in n]
    if leftover:
        logger.warning("%s: ignoring %d unused tensors, e.g. %s", path, len(leftover), leftover[:3])
    logger.info("loaded %s (%s, %d layers, %s on %s)", path.name, cfg.model_type, cfg.num_layers, dtype, device)
    return LoadedModel(
        path=path, hf_config=hf_config, config=cfg, weights=weights, dtype=tdtype, device=dev, fingerprint=fingerprint
    )

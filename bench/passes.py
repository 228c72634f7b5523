"""One prompt pass of one mode, measured the way the quality and kv benchmarks need it.

A single prompt pass (`Engine.prompt_pass`) serves three measurements: the first-token logits, the
teacher-forced NLL of the gold answer (fed after the prompt in one `extend`), and the greedy answer
(the cache is rewound to the prompt's end first, so decode overwrites the teacher-forced rows).
This halves the benchmark's cost against a separate scoring pass and a separate generation pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.sampling import RepetitionControl
from engine.types import BlendConfig, Mode, SelectorName

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.types import PromptLayout
    from kvcache.types import LayerKVSource


@dataclass(frozen=True)
class ModeSpec:
    """A mode as the benchmarks name it: full, prefix, reuse, blend@0.15 …"""

    name: str
    mode: Mode
    blend: BlendConfig | None = None

    @property
    def uses_cache(self) -> bool:
        return self.mode != "full"


def blend_name(ratio: float, selector: str | None = None) -> str:
    """blend@0.15 (the engine's default selector) or query@0.15, deviation@0.15 … (a named one)."""
    return f"{selector or 'blend'}@{float(ratio)}"


def parse_ratios(text: str) -> list[float]:
    ratios = [float(x) for x in text.split(",") if x.strip()]
    if not ratios or any(not 0.0 <= r <= 1.0 for r in ratios):
        raise ValueError(f"ratios must be a comma-separated list within [0, 1], got {text!r}")
    return ratios


def parse_selectors(text: str) -> list[SelectorName]:
    from engine.types import SELECTORS

    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in SELECTORS for n in names):
        raise ValueError(f"selectors must be a comma-separated list of {', '.join(SELECTORS)}, got {text!r}")
    return names  # type: ignore[return-value]


def mode_specs(
    engine: Engine,
    ratios: list[float],
    baselines: tuple[Mode, ...] = ("full", "prefix", "reuse"),
    selectors: list[SelectorName] | None = None,
) -> list[ModeSpec]:
    """`full` first (the reference every other mode is compared with), then the baselines, then blends at
    each ratio. Each blend's config is `EngineSettings.blend_config(ratio, selector)`, exactly what /ask
    builds for a request with that ratio (and selector). Without `selectors` the engine's configured
    selector runs and the specs are named blend@r; with them every selector runs at every ratio, the
    selectors interleaved within a ratio, named selector@r."""
    specs = [ModeSpec("full", "full")] if "full" in baselines else []
    specs += [ModeSpec(m, m) for m in baselines if m != "full"]
    for ratio in ratios:
        for selector in selectors or [None]:
            config = engine.settings.blend_config(recompute_ratio=ratio, selector=selector)
            specs.append(ModeSpec(blend_name(ratio, selector), "blend", config))
    return specs


@dataclass
class PassOutcome:
    first_logits: torch.Tensor  # (vocab,) float32, next-token logits after the prompt
    answer_nlls: list[float]  # -log p(gold_i | prompt, gold_<i), nats; empty without a gold answer
    answer_ids: list[int]  # greedy answer (EOS excluded)
    answer_text: str
    finish_reason: str  # "stop" (EOS or repetition stop) or "length" (max_tokens reached)
    prompt_s: float  # the prompt pass (what TTFT is made of), from the engine's own timer
    num_recomputed_tokens: int
    num_prompt_tokens: int
    selected_positions: list[int]  # context positions recomputed through all layers (blend)
    # With compare_uncontrolled: (answer text, finish reason) of the same greedy decode without the
    # repeated-line stop, for before/after figures from one run.
    uncontrolled: tuple[str, str] | None = None

    @property
    def first_token(self) -> int:
        return int(torch.argmax(self.first_logits))


@torch.inference_mode()
def run_pass(
    engine: Engine,
    layout: PromptLayout,
    kv_source: LayerKVSource | None,
    spec: ModeSpec,
    target_ids: list[int],
    max_tokens: int,
    compare_uncontrolled: bool = False,
) -> PassOutcome:
    """Prompt pass of `spec`, then teacher-forced NLL of target_ids, then up to max_tokens greedy tokens.

    Closes kv_source. With no kv_source the engine runs `full` whatever the spec says. With
    compare_uncontrolled (only when repetition control changes no logits, i.e. it can only stop early),
    the decode goes on past the repeated-line stop to give the uncontrolled answer too.
    """
    from engine.phases import extend

    tf = engine.transformer
    try:
        result = engine.prompt_pass(
            layout, kv_source, spec.mode, spec.blend, extra_capacity=max(len(target_ids), max_tokens) + 1
        )
    finally:
        if kv_source is not None:
            kv_source.close()
    first = result.logits.detach().float().clone()
    cache = result.cache
    prompt_len = cache.length

    nlls: list[float] = []
    if target_ids:
        logits = first[None]  # (1, vocab): predicts target_ids[0]
        if len(target_ids) > 1:
            rest = extend(tf, cache, target_ids[:-1], all_logits=True)  # row i predicts target_ids[i + 1]
            logits = torch.cat([logits, rest.float()], dim=0)
        logprobs = torch.log_softmax(logits, dim=-1)
        targets = torch.tensor(target_ids, dtype=torch.int64, device=logprobs.device)
        nlls = (-logprobs.gather(1, targets[:, None]).squeeze(1)).tolist()
        cache.length = prompt_len  # rewind: greedy decode overwrites the teacher-forced rows

    # Greedy, with the engine's repetition control exactly as /ask applies it (engine.sampling).
    repetition = RepetitionControl(engine.settings.sampling_params(max_tokens=max_tokens))
    if compare_uncontrolled and repetition.adjusts_logits:
        raise ValueError("compare_uncontrolled needs repetition control that only stops (no penalty, no n-gram ban)")
    ids: list[int] = []
    stop_at: int | None = None  # answer length when the repeated-line stop fired
    hit_length = False
    token = int(torch.argmax(first))
    while token not in engine.eos_token_ids:
        ids.append(token)
        if stop_at is None and repetition.should_stop(_decode(engine, ids)):
            stop_at = len(ids)
            if not compare_uncontrolled:
                break
        if len(ids) >= max_tokens:
            hit_length = True
            break
        logits = extend(tf, cache, [token])
        token = int(torch.argmax(repetition.adjust(logits.reshape(-1), ids)))
    answer_ids = ids[:stop_at] if stop_at is not None else ids
    finish_reason = "stop" if stop_at is not None or not hit_length else "length"
    text = engine.tokenizer.decode(answer_ids, skip_special_tokens=True).strip()
    uncontrolled = None
    if compare_uncontrolled:
        uncontrolled = (
            engine.tokenizer.decode(ids, skip_special_tokens=True).strip(),
            "length" if hit_length else "stop",
        )
    return PassOutcome(
        first_logits=first,
        answer_nlls=nlls,
        answer_ids=answer_ids,
        answer_text=text,
        finish_reason=finish_reason,
        uncontrolled=uncontrolled,
        prompt_s=result.timings.total_s,
        num_recomputed_tokens=result.num_recomputed_tokens,
        num_prompt_tokens=result.num_prompt_tokens,
        selected_positions=result.selected_positions.tolist(),
    )


def _decode(engine: Engine, ids: list[int]) -> str:
    return engine.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

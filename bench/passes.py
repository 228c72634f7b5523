"""One prompt pass of one mode, measured the way the quality and kv benchmarks need it.

A single prompt pass serves three measurements: the first-token logits and the teacher-forced NLL of
the gold answer (`Engine.score`, which rewinds the cache to the prompt's end afterwards), and the answer
(`Engine.answer`: the server's own decode loop, sampler, stops and repeated-line guard, from that pass).
This halves the benchmark's cost against a separate scoring pass and a separate generation pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from engine.types import (
    BlendConfig,
    FinishEvent,
    GenerationRequest,
    Mode,
    SamplingParams,
    SelectorName,
    TokenEvent,
)

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.types import PromptLayout, PromptResult
    from kvcache.types import LayerKVReader


@dataclass(frozen=True)
class ModeSpec:
    """A mode as the benchmarks name it: full, prefix, reuse, blend@0.15 …"""

    name: str
    mode: Mode
    blend: BlendConfig | None = None
    # A study's variant of the chunks' stored KV (bench/stored_context.py); None: as the engine stores it.
    stored_context: str | None = None

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
    from engine.blend.config import SELECTORS

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
    answer_ids: list[int]  # the answer's tokens (EOS excluded)
    answer_text: str
    finish_reason: str  # the engine's: "stop" (EOS), "repetition" (repeated-line stop) or "length"
    prompt_s: float  # the prompt pass (what TTFT is made of), from the engine's own timer
    num_recomputed_tokens: int
    num_prompt_tokens: int
    selected_positions: list[int]  # context positions recomputed through all layers (blend)
    # With compare_uncontrolled: (answer text, finish reason) of the same decode without the
    # repeated-line stop, for before/after figures from one run.
    uncontrolled: tuple[str, str] | None = None

    @property
    def first_token(self) -> int:
        return int(torch.argmax(self.first_logits))


@torch.inference_mode()
def run_pass(
    engine: Engine,
    layout: PromptLayout,
    kv_reader: LayerKVReader | None,
    spec: ModeSpec,
    target_ids: list[int],
    max_tokens: int,
    compare_uncontrolled: bool = False,
) -> PassOutcome:
    """Prompt pass of `spec`, then teacher-forced NLL of target_ids, then an answer of up to max_tokens.

    The answer is decoded as /ask decodes it (the engine's sampling settings). Closes kv_reader. With no
    kv_reader the engine runs `full` whatever the spec says. With compare_uncontrolled the same pass is
    decoded a second time without the repeated-line stop.
    """
    try:
        scored = engine.score(layout, kv_reader, spec.mode, spec.blend, target_ids, extra_capacity=max_tokens + 1)
    finally:
        if kv_reader is not None:
            kv_reader.close()
    result = scored.prompt
    first = result.logits.detach().float().clone()
    prompt_len = result.cache.length
    sampling = engine.settings.sampling_params(max_tokens=max_tokens)
    answer_ids, text, reason = _answer(engine, layout, result, sampling)
    uncontrolled = None
    if compare_uncontrolled:
        result.cache.length = prompt_len  # the second decode overwrites the first one's rows
        free = replace(sampling, stop_on_repeated_line=False)
        _, free_text, free_reason = _answer(engine, layout, result, free)
        uncontrolled = (free_text, free_reason)
    return PassOutcome(
        first_logits=first,
        answer_nlls=scored.token_nlls,
        answer_ids=answer_ids,
        answer_text=text,
        finish_reason=reason,
        uncontrolled=uncontrolled,
        prompt_s=result.timings.total_s,
        num_recomputed_tokens=result.num_recomputed_tokens,
        num_prompt_tokens=result.num_prompt_tokens,
        selected_positions=result.selected_positions.tolist(),
    )


def _answer(
    engine: Engine, layout: PromptLayout, result: PromptResult, sampling: SamplingParams
) -> tuple[list[int], str, str]:
    """(token ids without EOS, text, finish reason) of the engine's decode from `result`."""
    request = GenerationRequest("bench", layout, None, result.mode, sampling=sampling)
    ids: list[int] = []
    finish: FinishEvent | None = None
    for event in engine.answer(request, result):
        if isinstance(event, TokenEvent) and event.token_id not in engine.eos_token_ids:
            ids.append(event.token_id)
        elif isinstance(event, FinishEvent):
            finish = event
    assert finish is not None
    return ids, finish.text.strip(), finish.finish_reason

"""A question's engine request, settled once: the request plus the engine's settings in force → every value the
engine will use (mode, blend, sampling, token limits, prompt layout, whether stored KV is opened), frozen before
anything runs. Nothing downstream decides any of them again; a submission only adds its id and the KV reader it
opened (`SettledRequest.generation`).

The engine's settings in force (`Engine.settings`) are the operator's settings with the blend that app/calibration
put in force; they are the one copy read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.services.ask.types import AskRequest
    from engine.config import EngineSettings
    from engine.types import BlendConfig, GenerationRequest, Mode, PromptLayout, SamplingParams
    from kvcache.types import LayerKVReader


@dataclass(frozen=True)
class SettledRequest:
    """Every value of one question's engine request. `mode` is final: a prompt with no stored segments is
    answered in mode `full` (there is nothing to reuse), whatever was asked."""

    layout: PromptLayout
    mode: Mode
    blend: BlendConfig
    sampling: SamplingParams

    @property
    def opens_kv(self) -> bool:
        """Whether the prompt's stored KV is opened (every mode but full reads it)."""
        return self.mode != "full"

    def generation(self, request_id: str, kv_reader: LayerKVReader | None) -> GenerationRequest:
        """The engine request of one submission: these values, its id and the KV reader just opened."""
        from engine.types import GenerationRequest

        if self.opens_kv != (kv_reader is not None):
            raise ValueError(f"mode {self.mode!r} {'needs' if self.opens_kv else 'takes no'} KV reader")
        return GenerationRequest(request_id, self.layout, kv_reader, self.mode, self.blend, self.sampling)


def requested_mode(request: AskRequest, in_force: EngineSettings) -> Mode:
    """The mode a request asks for: its own, else the server's default."""
    return request.mode or in_force.mode  # type: ignore[return-value]


def settle(request: AskRequest, layout: PromptLayout, in_force: EngineSettings, context_tokens: int) -> SettledRequest:
    """The request's engine values from the request (its own values win) and the settings in force.

    `layout`: the planned prompt (`AskPlan.layout`); `context_tokens`: the model's context, of which the answer
    may take what the prompt leaves."""
    asked = requested_mode(request, in_force)
    mode: Mode = asked if layout.chunk_ids else "full"
    max_tokens = min(request.max_tokens or in_force.max_new_tokens, context_tokens - layout.num_tokens)
    # The settings' sampling (repetition control included, the same in every mode); request values win.
    sampling = in_force.sampling_params(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop,
    )
    return SettledRequest(
        layout=layout,
        mode=mode,
        blend=in_force.blend_config(recompute_ratio=request.recompute_ratio, selector=request.selector),
        sampling=sampling,
    )

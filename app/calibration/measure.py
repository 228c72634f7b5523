"""One blend configuration's figures on the calibration set, against full prefill, reuse and no context.

Per case: first-token KL(full ‖ candidate) and KL(full ‖ reuse), the teacher-forced NLL of the right
answer (→ context benefit retained), whether the greedy answer contains the fact, and the prompt pass's
time. Chunk and turn KV is stored in the server's storage dtype (an in-memory store with the server's KV
settings) and read through the store's layer-wise loader, as /ask reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from app.calibration.calset import CalibrationCase
from app.calibration.scoring import is_right, kl_divergence

if TYPE_CHECKING:
    import torch

    from engine.engine import Engine
    from engine.types import BlendConfig, Mode, PromptLayout
    from kvcache.config import KVCacheSettings
    from kvcache.space import KVSpace

logger = logging.getLogger(__name__)

MAX_ANSWER_TOKENS = 20
Execute = Callable[[Callable[[], Any]], Any]


@dataclass(frozen=True)
class PassFigures:
    first_logits: torch.Tensor  # (vocab,) float32
    nll: float  # mean per-token NLL of the right answer, nats
    answer: str
    right: bool
    prompt_s: float


@dataclass(frozen=True)
class CandidateFigures:
    """A configuration's figures on the whole set (means over cases, counts per kind)."""

    kl: float
    kl_reuse: float
    kl_x_reuse: float
    benefit: float
    right: dict[str, int]  # per kind
    full_right: dict[str, int]
    prompt_s: float
    full_prompt_s: float
    answers: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.full_prompt_s / self.prompt_s if self.prompt_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("answers")
        out["speedup"] = round(self.speedup, 3)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


@dataclass(frozen=True)
class _Prepared:
    case: CalibrationCase
    layout: PromptLayout
    keys: list[str]
    answer_ids: list[int]


@dataclass(frozen=True)
class _Reference:
    full: PassFigures
    reuse: PassFigures
    no_context_nll: float


class CalibrationSet:
    """The generated cases as prompts with stored KV, and full prefill's, reuse's and no context's figures."""

    def __init__(
        self,
        engine: Engine,
        cases: list[CalibrationCase],
        kv_settings: KVCacheSettings,
        execute: Execute | None = None,
    ) -> None:
        from kvcache.config import KVCacheSettings
        from kvcache.space import KVSpace
        from kvcache.store import TieredKVStore

        self.engine = engine
        # Every case's engine work goes through `execute` (the server hands it to the engine's worker thread).
        self.execute: Execute = execute or (lambda work: work())
        self.cases = cases
        # A private memory-only store in the server's storage dtype: never the data dir's disk tier nor a
        # shared Redis tier (the set's entries are not the library's). Validated, so a wrong field name fails.
        settings = KVCacheSettings.model_validate(
            kv_settings.model_dump() | {"dir": None, "memory_bytes": 1 << 40, "redis_url": None}
        )
        self.kv: KVSpace = KVSpace.of_engine(TieredKVStore(settings), engine)
        self.storage_dtype = settings.storage_dtype
        self._prepared: list[_Prepared] = []
        self._refs: list[_Reference] = []

    def prepare(self) -> None:
        """Lay out every case, store its segments' KV, measure the references (full, reuse, no context)."""
        for case in self.cases:
            self.execute(lambda case=case: self._prepare_case(case))

    def _prepare_case(self, case: CalibrationCase) -> None:
        from engine.prompt import Turn
        from ingest.chunker import encode_chunk_text

        engine, prompt = self.engine, self.engine.prompt
        chunk_ids = [encode_chunk_text(engine.tokenizer, text) for text in case.passages]
        history: list[list[int]] = []
        if case.first_question is not None:
            first = prompt.layout_ranked(chunk_ids, case.first_question)
            answer = self._run(first, "full", None, [], expected=None).answer
            history = [prompt.turn_ids(Turn(case.first_question, answer))]
        layout = prompt.layout_ranked(chunk_ids, case.question, history)
        written = self.kv.ensure(layout.chunk_ids, compute=engine.precompute_chunks)
        answer_ids = list(engine.tokenizer.encode(case.answer, add_special_tokens=False))
        prepared = _Prepared(case, layout, written.keys, answer_ids)
        self._prepared.append(prepared)
        full = self._run(layout, "full", None, answer_ids, case.answer)
        # Reuse is a KL reference only: its answer is not needed (decoding it would be the set's slowest part).
        reuse = self._run(layout, "reuse", None, answer_ids, None, prepared.keys, decode=False)
        bare = prompt.layout([], case.question)
        nc = self._run(bare, "full", None, answer_ids, expected=None, decode=False)
        self._refs.append(_Reference(full, reuse, nc.nll))
        logger.info(
            "calibration set: %s case of %d tokens, full prefill %s",
            case.kind,
            layout.num_tokens,
            "right" if full.right else "wrong",
        )

    def _run(
        self,
        layout: PromptLayout,
        mode: Mode,
        blend: BlendConfig | None,
        target_ids: list[int],
        expected: str | None,
        keys: list[str] | None = None,
        decode: bool = True,
    ) -> PassFigures:
        from engine.types import GenerationRequest, TokenEvent

        engine = self.engine
        source = self.kv.open(keys, engine.device, engine.dtype) if keys else None
        try:
            scored = engine.score(layout, source, mode, blend, target_ids, extra_capacity=MAX_ANSWER_TOKENS + 1)
        finally:
            if source is not None:
                source.close()
        result = scored.prompt
        first = result.logits.detach().float().clone()
        nll = sum(scored.token_nlls) / max(1, len(scored.token_nlls))
        ids: list[int] = []
        text = ""
        if decode:
            sampling = engine.settings.sampling_params(max_tokens=MAX_ANSWER_TOKENS, temperature=0.0)
            request = GenerationRequest("calibrate", layout, None, result.mode, sampling=sampling)
            for event in engine.answer(request, result):
                if isinstance(event, TokenEvent) and event.token_id not in engine.eos_token_ids:
                    ids.append(event.token_id)
                    text = engine.tokenizer.decode(ids, skip_special_tokens=True)
                    if expected is not None and is_right(text, expected):
                        break  # right already: the rest of the answer cannot make it wrong
        right = expected is not None and is_right(text, expected)
        return PassFigures(first, nll, text.strip(), right, result.timings.total_s)

    def measure(self, blend: BlendConfig) -> CandidateFigures:
        """Figures of `blend` on every case (prepare() first)."""
        kls, kls_reuse, nlls, full_nlls, nc_nlls, times, full_times = [], [], [], [], [], [], []
        right = {k: 0 for k in ("lookup", "two_hop", "followup")}
        full_right = dict(right)
        answers = []
        for prepared, ref in zip(self._prepared, self._refs, strict=True):
            out = self.execute(
                lambda p=prepared: self._run(p.layout, "blend", blend, p.answer_ids, p.case.answer, p.keys)
            )
            kls.append(kl_divergence(ref.full.first_logits, out.first_logits))
            kls_reuse.append(kl_divergence(ref.full.first_logits, ref.reuse.first_logits))
            nlls.append(out.nll)
            full_nlls.append(ref.full.nll)
            nc_nlls.append(ref.no_context_nll)
            times.append(out.prompt_s)
            full_times.append(ref.full.prompt_s)
            right[prepared.case.kind] += out.right
            full_right[prepared.case.kind] += ref.full.right
            answers.append(out.answer)
        n = len(kls)
        mean = lambda xs: sum(xs) / n  # noqa: E731
        gain_full = mean(nc_nlls) - mean(full_nlls)
        return CandidateFigures(
            kl=mean(kls),
            kl_reuse=mean(kls_reuse),
            kl_x_reuse=mean(kls) / mean(kls_reuse) if mean(kls_reuse) > 0 else 0.0,
            benefit=(mean(nc_nlls) - mean(nlls)) / gain_full if gain_full > 0 else 1.0,
            right=right,
            full_right=full_right,
            prompt_s=mean(times),
            full_prompt_s=mean(full_times),
            answers=answers,
        )

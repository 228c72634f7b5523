"""The prompt of a question asked in a conversation, and the stored KV of its turns.

`build_prompt` lays out `[prefix][chunks][turn 1]…[turn t-1][question]` with the turns the prompt budget
kept (`budget.py`) that the model's context holds (oldest turns dropped first). `TurnKV` names each earlier
turn's entry (keyed like a chunk's: model fingerprint + the server's prefix + the turn's token ids; the
storage dtype is not part of a key: `KVSpace.key`) and writes the entry of a finished turn through the one
KV writer (`KVSpace.ensure`): its segment precomputed behind the server's prefix, as a chunk is at ingest,
into the store's history memory tier and the tiers below it.

Why a precompute and not the answer's working cache: the cache holds the turn's rows computed behind that
turn's retrieved chunks (the entry would depend on them, and a stateless client resending the same turn
would find nothing), RoPE'd at their positions (an inverse rotation per layer), and without the closing
tokens after the answer that the next turn's layout has. A precompute of the turn (~50–200 tokens behind
the ~30-token prefix) is cheap next to the answer that produced it, and gives the same entry whoever
asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.prompt import HistoryFit, PromptBuilder, Turn
    from engine.types import PromptLayout
    from kvcache.space import KVSpace
    from kvcache.writer import ComputeKV


@dataclass(frozen=True)
class ConversationPrompt:
    layout: PromptLayout
    num_history_turns: int  # earlier turns in the prompt
    num_dropped_turns: int  # oldest turns left out (history budget, then the model's context)


def build_prompt(
    builder: PromptBuilder,
    ranked_chunk_ids: list[list[int]],
    question: str,
    history: HistoryFit,
    context_tokens: int,
) -> ConversationPrompt:
    """The layout with the earlier turns the budget kept (`budget.budget_prompt`), fewer when the model's
    context cannot hold them all (oldest left out first)."""
    segments, dropped = list(history.segment_ids), history.num_dropped_turns
    layout = builder.layout_ranked(ranked_chunk_ids, question, segments)
    while layout.num_tokens >= context_tokens and segments:
        segments, dropped = segments[1:], dropped + 1
        layout = builder.layout_ranked(ranked_chunk_ids, question, segments)
    return ConversationPrompt(layout=layout, num_history_turns=len(segments), num_dropped_turns=dropped)


class TurnKV:
    """Keys and writes of conversation-turn KV entries."""

    def __init__(self, engine: Engine, kv_space: KVSpace) -> None:
        self._engine, self._space = engine, kv_space

    def keys(self, layout: PromptLayout) -> list[str]:
        """The entry key of each earlier turn in the layout (oldest first)."""
        return [self._space.key(ids) for ids in layout.history_ids]

    @staticmethod
    def reused_tokens(layout: PromptLayout, history_keys: list[str], missing: set[str]) -> int:
        """History tokens whose KV the store served (not computed at question time)."""
        return sum(len(ids) for ids, key in zip(layout.history_ids, history_keys, strict=True) if key not in missing)

    def store_turn(self, turn: Turn, compute: ComputeKV, *, persist: bool = True) -> bool:
        """Compute and store the entry of a finished turn (unless stored already) through the one KV
        writer; False when no tier kept it (the next turn then computes it). `persist=False`: the history
        memory tier only (a stateless client's turn: no stored record names it, so on disk it would only
        wait for `doctor --repair`)."""
        ids = self._engine.prompt.turn_ids(turn)
        key = self._space.key(ids)
        written = self._space.ensure([ids], keys=[key], compute=compute, history_keys={key}, persist=persist)
        return key not in written.unwritten

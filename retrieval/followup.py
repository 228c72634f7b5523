"""The retrieval query of a follow-up question, built from the conversation's recent questions.

"And for the connect phase only?" retrieves nothing useful alone: its subject is in an earlier turn.
`retrieval.followup` picks how the query sees the conversation:

- `concat` (default): when the previous turn's sources are known (a stored conversation), the query
  vector is the new question's embedding plus `followup_source_weight` (< 1: the latest question weighs
  most) × the mean vector of that turn's top `followup_sources` sources, made unit length again. Those
  sources stand for the topic the conversation is on, so "Show it with a class instead." still lands on
  it (they and the chunks next to them stay the nearest candidates), while a follow-up that names a new
  subject moves to it. The mean is weighted by rank, 1, `followup_source_decay`, its square, …: the best
  source is what the turn was about, the next ones are often its neighbours in the corpus. A plain mean
  (decay 1) made "What is the access code of that project?", after "Tell me about project X.", land on
  another project as often as on X in a corpus of similar project pages. Without sources (the previous turn
  found none above the relevance floor), the weighted sum of the embeddings of the new question and the
  previous `followup_turns` user questions, weights 1, decay, decay², …. A /v1 messages array carries no
  sources: the ask service finds them by retrieving for the previous question once (app/services/ask/
  followup.py), since that weighted sum, with no chunk in it, ranked the project's page below others and
  scored under the floor. BM25 and the reranker read the questions' text, newest first.
- `rewrite`: the model rewrites the question into a standalone one first (app/services, it needs the
  engine); that text is then the query. `REWRITE_SYSTEM_PROMPT` is the instruction it gets,
  `rewrite_request_text` the request built from the recent turns, `clean_rewrite` tidies the answer.
- `off`: the new question alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from retrieval.config import RetrievalSettings
    from retrieval.embedder import Embedder
    from retrieval.retriever import Retriever

REWRITE_SYSTEM_PROMPT = (
    "Rewrite the user's last question so that it can be understood without the conversation: replace words "
    "like it, that, they or there by what they refer to. Reply with the rewritten question only."
)


@dataclass(frozen=True)
class FollowupQuery:
    """What retrieval searches with."""

    text: str  # BM25 and the reranker read this; it is the query when `vector` is None
    vector: np.ndarray | None = None  # (dim,) float32, unit norm; None: embed `text`
    num_turns_used: int = 0  # earlier questions that went into the query
    num_sources_used: int = 0  # earlier sources whose mean vector went into the query
    # The questions the query read, newest first (the new one, then the earlier ones): coverage is judged on
    # them as well as on the query (retrieval/relevance.py `judged_score`). Empty: the question alone.
    questions: tuple[str, ...] = ()


@dataclass(frozen=True)
class EarlierTurn:
    """What a follow-up's query reads of an earlier turn: its question and the chunks that answered it."""

    question: str
    source_chunk_ids: tuple[int, ...] = ()  # best first


def recent_questions(previous_questions: Sequence[str], num_turns: int) -> list[str]:
    """The last `num_turns` earlier questions, newest first."""
    kept = [q.strip() for q in previous_questions if q.strip()]
    return list(reversed(kept[-num_turns:])) if num_turns > 0 else []


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def concat_query(
    question: str,
    previous_questions: Sequence[str],
    embedder: Embedder,
    num_turns: int,
    decay: float,
    source_vectors: np.ndarray | None = None,
    source_weight: float = 0.0,
    source_decay: float = 1.0,
) -> FollowupQuery:
    """The `concat` query: see the module docstring. `source_vectors` (n, dim): the previous turn's top
    sources, best first, whose mean (weighted 1, `source_decay`, its square, … by rank) joins the new
    question at `source_weight` (the question counts 1)."""
    question = question.strip()
    earlier = recent_questions(previous_questions, num_turns)
    if not earlier:
        return FollowupQuery(text=question)
    texts = [question, *earlier]
    num_sources = 0 if source_vectors is None or source_weight <= 0 else len(source_vectors)
    if num_sources:
        # The sources stand for the earlier questions (what they found): those are not embedded again.
        asked = embedder.embed_queries([question])[0]
        ranked = np.asarray(source_vectors, dtype=np.float32)  # (n, dim), best first
        rank_weights = np.asarray([source_decay**i for i in range(num_sources)], dtype=np.float32)[:, None]
        topic = _unit((ranked * rank_weights).sum(axis=0))
        vector = _unit(asked + source_weight * topic)
    else:
        vectors = embedder.embed_queries(texts)  # (n, dim), unit rows
        weights = np.asarray([decay**i for i in range(len(texts))], dtype=np.float32)[:, None]
        vector = _unit((vectors * weights).sum(axis=0))
        asked = vectors[0]
    if not np.any(vector):
        vector = asked
    return FollowupQuery(
        text=" ".join(texts),
        vector=vector.astype(np.float32),
        num_turns_used=len(earlier),
        num_sources_used=num_sources,
        questions=tuple(texts),
    )


def followup_query(
    question: str, earlier: Sequence[EarlierTurn], retriever: Retriever, settings: RetrievalSettings
) -> FollowupQuery:
    """The `concat` query of `question` after the `earlier` turns (oldest first), reading the previous
    turn's sources from `retriever` (a deleted chunk is left out)."""
    last_sources = list(earlier[-1].source_chunk_ids) if earlier and settings.followup_turns > 0 else []
    anchor = last_sources[: settings.followup_sources]
    source_vectors = retriever.vectors_of(anchor) if anchor else None  # a deleted chunk is left out
    return concat_query(
        question,
        [t.question for t in earlier],
        retriever.embedder,
        settings.followup_turns,
        settings.followup_decay,
        source_vectors=source_vectors,
        source_weight=settings.followup_source_weight,
        source_decay=settings.followup_source_decay,
    )


def rewrite_request_text(question: str, history: Sequence[tuple[str, str]], num_turns: int) -> str:
    """The user message the rewriting model reads: the recent turns, then the question to rewrite."""
    lines = ["Conversation:"]
    for q, a in list(history)[-num_turns:] if num_turns > 0 else []:
        lines.append(f"User: {q.strip()}")
        lines.append(f"Assistant: {a.strip()}")
    lines.append(f"Last question: {question.strip()}")
    return "\n".join(lines)


def clean_rewrite(text: str, question: str) -> str:
    """The model's rewrite as one line (first non-empty line, quotes stripped); the question if empty."""
    for line in text.splitlines():
        line = line.strip().strip('"').strip()
        for label in ("Rewritten question:", "Question:"):
            if line.lower().startswith(label.lower()):
                line = line[len(label) :].strip()
        if line:
            return line
    return question.strip()

"""The retrieval query of a follow-up question, built from the conversation's recent questions.

"And for the connect phase only?" retrieves nothing useful alone: its subject is in an earlier turn.
`retrieval.followup` picks how the query sees the conversation:

- `concat` (default): the query vector is the weighted sum of the embeddings of the new question and the
  previous `followup_turns` user questions, weights 1, decay, decay², … (the latest weighs most), made
  unit length again; BM25 and the reranker read the questions' text, newest first.
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
    from retrieval.embedder import Embedder

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


def recent_questions(previous_questions: Sequence[str], num_turns: int) -> list[str]:
    """The last `num_turns` earlier questions, newest first."""
    kept = [q.strip() for q in previous_questions if q.strip()]
    return list(reversed(kept[-num_turns:])) if num_turns > 0 else []


def concat_query(
    question: str, previous_questions: Sequence[str], embedder: Embedder, num_turns: int, decay: float
) -> FollowupQuery:
    """The `concat` query: see the module docstring."""
    question = question.strip()
    earlier = recent_questions(previous_questions, num_turns)
    if not earlier:
        return FollowupQuery(text=question)
    texts = [question, *earlier]
    vectors = embedder.embed_queries(texts)  # (n, dim), unit rows
    weights = np.asarray([decay**i for i in range(len(texts))], dtype=np.float32)[:, None]
    summed = (vectors * weights).sum(axis=0)
    norm = float(np.linalg.norm(summed))
    vector = (summed / norm if norm > 0 else vectors[0]).astype(np.float32)
    return FollowupQuery(text=" ".join(texts), vector=vector, num_turns_used=len(earlier))


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

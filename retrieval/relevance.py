"""The relevance floor: the best cosine similarity below which a question's retrieved chunks are taken not to
answer it (the ask service then leaves them out and says the documents do not cover the question).

A floor is a property of the embedder's score scale, so `auto` means the floor measured for the embedder,
and none for an embedder nobody measured. `python -m bench relevance` measures it: the best score of
questions two small docs corpora answer against questions they do not (docs/benchmarks.md).

A follow-up is judged the way its conversation is: its query blends the question with the earlier turn
("What is the access code of that project?" after "Tell me about project X."), and that blend can score under
the floor on the very page the first question found above it. So a follow-up's retrieved chunks count as
relevant when one of them reaches the floor against the query, the new question or one of the earlier
questions the query read (`judged_score`); a question with no history is judged on its own score, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from retrieval.config import RetrievalSettings

if TYPE_CHECKING:
    from retrieval.followup import FollowupQuery
    from retrieval.retriever import Retriever

# all-MiniLM-L6-v2 (the builtin embedder), measured by `python -m bench relevance`: 22 in-corpus questions
# scored 0.42-0.80 at best, 7 out-of-corpus questions on other subjects 0.10-0.30; halfway, rounded down to
# keep every in-corpus answer. Python questions about other libraries scored 0.23-0.48: a floor on cosine
# similarity alone cannot tell most of those from the documents' own.
BUILTIN_EMBEDDER_FLOOR = 0.35


def relevance_floor(settings: RetrievalSettings) -> float | None:
    """The floor in force for these settings; None: every retrieved chunk counts as relevant."""
    if settings.relevance_floor != "auto":
        return settings.relevance_floor
    return BUILTIN_EMBEDDER_FLOOR if settings.embedder == "builtin" else None


def covers(best_cosine: float | None, floor: float | None) -> bool:
    """Whether retrieval's best hit (its cosine similarity; None: no hit) is relevant enough to answer from."""
    return floor is None or (best_cosine is not None and best_cosine >= floor)


def judged_score(
    retriever: Retriever,
    query: FollowupQuery,
    chunk_ids: Sequence[int],
    best_cosine: float | None,
    floor: float | None,
) -> float | None:
    """The score a retrieval is judged covered on: `best_cosine` (the query's best retrieved chunk), or, when
    that is under `floor` and the query read earlier questions, the best cosine similarity between one of
    the retrieved `chunk_ids` and the new question or one of those earlier questions, if higher.

    Each of those questions scores at most its own best over the whole index, so a conversation of questions
    the documents do not cover stays under the floor. Embeds the questions only when it has to (under the
    floor with a history), so a covered question costs nothing more."""
    if best_cosine is None or floor is None or best_cosine >= floor or len(query.questions) < 2 or not chunk_ids:
        return best_cosine
    chunk_vectors = retriever.vectors_of(chunk_ids)  # (n, dim) unit rows; a deleted chunk is left out
    if len(chunk_vectors) == 0:
        return best_cosine
    asked = retriever.embedder.embed_queries(list(query.questions))  # (m, dim) unit rows
    best_asked = float(np.max(chunk_vectors @ np.asarray(asked, dtype=np.float32).T))
    return max(best_cosine, round(best_asked, 6))

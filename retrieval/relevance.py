"""The relevance floor: the best cosine similarity below which a question's retrieved chunks are taken not to
answer it (the ask service then leaves them out and says the documents do not cover the question).

A floor is a property of the embedder's score scale, so `auto` means the floor measured for the embedder,
and none for an embedder nobody measured. `python -m bench relevance` measures it: the best score of
questions two small docs corpora answer against questions they do not (docs/benchmarks.md).
"""

from __future__ import annotations

from retrieval.config import RetrievalSettings

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

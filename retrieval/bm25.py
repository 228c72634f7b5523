"""Okapi BM25 keyword index with incremental add/remove (rank-bm25 can only be rebuilt whole).

Scoring (Lucene's variant, idf never negative):
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    score(d, q) = Σ_{t ∈ set(q)} idf(t) · tf(t,d)·(k1+1) / (tf(t,d) + k1·(1 − b + b·|d|/avgdl))
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable

from retrieval.types import RetrievalError, ScoredId

_TOKEN = re.compile(r"\w+", re.UNICODE)
# Function words that match almost every chunk and only add noise to keyword scores.
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "from",
        "has",
        "have",
        "he",
        "her",
        "his",
        "i",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "she",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "you",
        "your",
        "do",
        "does",
        "did",
        "how",
    ]
)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without stopwords (`\\w+`, so digits and non-Latin words are kept)."""
    return [token for token in _TOKEN.findall(text.lower()) if token not in STOPWORDS]


class BM25Index:
    """In-memory BM25 over int ids; JSON persistence."""

    def __init__(self, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        self._doc_terms: dict[int, dict[str, int]] = {}
        self._doc_length: dict[int, int] = {}
        self._postings: dict[str, dict[int, int]] = {}
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._doc_terms)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._doc_terms

    def ids(self) -> list[int]:
        return sorted(self._doc_terms)

    def add(self, doc_id: int, text: str) -> None:
        """Index a text under `doc_id`, replacing what that id held before."""
        self.remove([doc_id])
        tokens = tokenize(text)
        terms = dict(Counter(tokens))
        self._doc_terms[doc_id] = terms
        self._doc_length[doc_id] = len(tokens)
        self._total_length += len(tokens)
        for term, count in terms.items():
            self._postings.setdefault(term, {})[doc_id] = count

    def remove(self, doc_ids: Iterable[int]) -> int:
        removed = 0
        for doc_id in doc_ids:
            terms = self._doc_terms.pop(doc_id, None)
            if terms is None:
                continue
            removed += 1
            self._total_length -= self._doc_length.pop(doc_id)
            for term in terms:
                posting = self._postings[term]
                del posting[doc_id]
                if not posting:
                    del self._postings[term]
        return removed

    def idf(self, term: str) -> float:
        df = len(self._postings.get(term, ()))
        return math.log(1.0 + (len(self._doc_terms) - df + 0.5) / (df + 0.5))

    def scores(self, query: str, allowed_ids: Collection[int] | None = None) -> dict[int, float]:
        """BM25 score of every document sharing a term with the query."""
        if not self._doc_terms:
            return {}
        average_length = self._total_length / len(self._doc_terms) or 1.0
        totals: dict[int, float] = {}
        for term in sorted(set(tokenize(query))):
            posting = self._postings.get(term)
            if not posting:
                continue
            idf = self.idf(term)
            for doc_id, tf in posting.items():
                if allowed_ids is not None and doc_id not in allowed_ids:
                    continue
                norm = self.k1 * (1.0 - self.b + self.b * self._doc_length[doc_id] / average_length)
                totals[doc_id] = totals.get(doc_id, 0.0) + idf * tf * (self.k1 + 1.0) / (tf + norm)
        return totals

    def search(self, query: str, k: int, allowed_ids: Collection[int] | None = None) -> list[ScoredId]:
        """Top k by score (ties: smaller id first); documents without a query term are never returned."""
        totals = self.scores(query, allowed_ids)
        best = heapq.nsmallest(k, totals.items(), key=lambda item: (-item[1], item[0]))
        return [ScoredId(doc_id, score) for doc_id, score in best]

    # -- persistence -------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        state = {
            "format": 1,
            "k1": self.k1,
            "b": self.b,
            "docs": {str(doc_id): terms for doc_id, terms in self._doc_terms.items()},
        }
        return json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> BM25Index:
        state = json.loads(data)
        if state.get("format") != 1:
            raise RetrievalError("unknown BM25 file format")
        index = cls(state["k1"], state["b"])
        for key, terms in state["docs"].items():
            doc_id = int(key)
            index._doc_terms[doc_id] = terms
            length = sum(terms.values())
            index._doc_length[doc_id] = length
            index._total_length += length
            for term, count in terms.items():
                index._postings.setdefault(term, {})[doc_id] = count
        return index

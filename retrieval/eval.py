"""Retrieval quality on question/passages data (the shape of ../shared/data/nq6_dev.json).

All passages of all questions are pooled into one corpus (duplicates merged), and a question is a hit
at k when one of its gold passages (`"isgold": true`) is among the top k results. `recall_at_k` works on
any Retriever; `evaluate_recall` builds an in-memory one from a dataset file and also times it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval.config import RetrievalSettings
from retrieval.embedder import Embedder
from retrieval.retriever import Retriever
from retrieval.types import IndexedChunk


@dataclass(frozen=True)
class EvalQuestion:
    question: str
    gold_chunk_ids: frozenset[int]


@dataclass(frozen=True)
class QADataset:
    chunks: list[IndexedChunk]  # the pooled, de-duplicated corpus; chunk_id = position
    questions: list[EvalQuestion]  # questions that have at least one gold passage


@dataclass(frozen=True)
class RecallReport:
    recall: dict[int, float]  # k -> fraction of questions with a gold passage in the top k
    num_questions: int
    num_passages: int
    embed_seconds: float  # embedding + indexing the corpus
    search_seconds: float  # embedding + searching all questions

    @property
    def passages_per_second(self) -> float:
        return self.num_passages / self.embed_seconds if self.embed_seconds > 0 else float("inf")


def load_qa_dataset(path: str | Path) -> QADataset:
    """Read `[{"question", "ctxs": [{"title", "text", "isgold"?}]}]`; passages equal in (title, text)
    become one chunk, so a gold passage shared by two questions is one corpus entry."""
    records = json.loads(Path(path).read_text(encoding="utf-8"))
    chunk_ids: dict[tuple[str, str], int] = {}
    chunks: list[IndexedChunk] = []
    questions: list[EvalQuestion] = []
    for record in records:
        gold: set[int] = set()
        for ctx in record["ctxs"]:
            key = (ctx.get("title") or "", ctx["text"])
            if key not in chunk_ids:
                chunk_ids[key] = len(chunks)
                chunks.append(
                    IndexedChunk(chunk_id=len(chunks), document_id=f"passage-{len(chunks)}", text=key[1], title=key[0])
                )
            if ctx.get("isgold"):
                gold.add(chunk_ids[key])
        if gold:
            questions.append(EvalQuestion(record["question"], frozenset(gold)))
    return QADataset(chunks, questions)


def recall_at_k(
    retriever: Retriever, questions: Sequence[EvalQuestion], ks: Sequence[int] = (1, 5)
) -> dict[int, float]:
    """Fraction of questions whose gold chunk is in the top k, for each k. Query embeddings are batched."""
    if not questions:
        raise ValueError("no questions to evaluate")
    max_k = max(ks)
    query_vectors = retriever.embedder.embed_queries([q.question for q in questions])
    hits = dict.fromkeys(ks, 0)
    for question, vector in zip(questions, query_vectors, strict=True):
        ranked = [
            result.chunk_id
            for result in retriever.search(question.question, top_k=max_k, score_threshold=-1.0, query_vector=vector)
        ]
        for k in ks:
            if question.gold_chunk_ids.intersection(ranked[:k]):
                hits[k] += 1
    return {k: hits[k] / len(questions) for k in ks}


def evaluate_recall(
    dataset_path: str | Path,
    settings: RetrievalSettings | None = None,
    ks: Sequence[int] = (1, 5),
    embedder: Embedder | None = None,
) -> RecallReport:
    """Ingest every passage of a dataset into a fresh in-memory Retriever and measure recall@k."""
    dataset = load_qa_dataset(dataset_path)
    retriever = Retriever(settings or RetrievalSettings(), embedder=embedder)
    retriever.embedder.load()  # keep model loading out of the timings
    started = time.perf_counter()
    vectors = retriever.embed_chunks(dataset.chunks)
    retriever.add(dataset.chunks, np.asarray(vectors))
    embedded = time.perf_counter()
    recall = recall_at_k(retriever, dataset.questions, ks)
    searched = time.perf_counter()
    return RecallReport(
        recall=recall,
        num_questions=len(dataset.questions),
        num_passages=len(dataset.chunks),
        embed_seconds=embedded - started,
        search_seconds=searched - embedded,
    )

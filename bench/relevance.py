"""`python -m bench relevance`: how high does the embedder score a question the documents answer, and one
they do not? The measurement behind `retrieval.relevance_floor` (retrieval/relevance.py).

Two small corpora, embedded by the server's embedder (all-MiniLM-L6-v2) into an in-memory Retriever with the
server's retrieval settings: the standard library docs of `bench answers` (bench/docs_corpus.py, one chunk per
run of function sections up to about a 512-token chunk) and the made-up framework docs of `bench followup`
(bench/framework_docs.py, one chunk per section). In-corpus questions: the docs answer key's 12 and the first
turn of each of the framework's 10 sessions; and the sessions' follow-ups ("And how do I write my own?"),
searched with the query the server builds from the earlier turns (`concat`). Out-of-corpus questions (below,
written for this benchmark): 14 questions neither corpus answers, half of them Python questions close to the
corpora's subjects (another library's timeout, argparse, asyncio …), where a floor is hardest to draw.
Each out-of-corpus question is also followed up (OUT_OF_CORPUS_FOLLOW_UP), searched as the server searches a
/v1 follow-up (the first question's sources retrieved again, kept when they clear the floor) and judged as
it judges one (retrieval/relevance.py `judged_score`): a conversation the documents do not hold must keep
the notice at its second turn.

Reported: each question's best cosine similarity (the top source's `vector_score`, what the floor is
compared with), the largest out-of-corpus and the smallest in-corpus score, and for the given floor how
many out-of-corpus questions fall below it (get the notice) and how many in-corpus ones stay above it
(answered as before). Needs no language model; seconds on a CPU.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from bench import harness
from bench.docs_corpus import ANSWER_KEY, MODULES, module_page
from bench.framework_docs import PAGES, SESSIONS, SWITCHES
from retrieval.config import RetrievalSettings
from retrieval.retriever import Retriever
from retrieval.types import IndexedChunk

logger = logging.getLogger(__name__)

NAME = "relevance"
HELP = "the embedder's best score on in-corpus vs out-of-corpus questions: where the relevance floor goes"
_CHUNK_CHARS = 1800  # about a 512-token chunk (the ingest default) of English prose and code names

OUT_OF_CORPUS = (
    # near the corpora: Python, another library or module
    "How do I set a connect timeout on an httpx AsyncClient?",
    "How do I parse command-line arguments with argparse?",
    "How do I run two coroutines concurrently with asyncio?",
    "How do I define a field alias on a Pydantic model?",
    "How do I read a CSV file into a pandas DataFrame?",
    "How do I make a Django database migration?",
    "How do I retry a failed HTTP request with the requests library?",
    # far from them
    "What is the capital of Australia?",
    "How do I reverse a vector in Rust?",
    "How do I configure nginx as a reverse proxy?",
    "Who painted the Mona Lisa?",
    "How many calories are in a banana?",
    "What is the syntax of a LEFT JOIN in SQL?",
    "How do I change a flat tyre on a bicycle?",
)
OUT_OF_CORPUS_FOLLOW_UP = "Can you show me an example?"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--floor", type=float, default=None, help="the floor to evaluate (default: the embedder's shipped floor)"
    )
    harness.add_retrieval_args(parser, out="relevance.json")


def _stdlib_chunks() -> list[tuple[str, str]]:
    """(title, text) chunks of the docs corpus: each page's sections grouped up to _CHUNK_CHARS."""
    chunks = []
    for name in MODULES:
        current = ""
        for section in module_page(name).split("\n## "):
            if current and len(current) + len(section) > _CHUNK_CHARS:
                chunks.append((name, current))
                current = ""
            current = f"{current}\n## {section}" if current else section
        if current:
            chunks.append((name, current))
    return chunks


def build_retriever(settings: RetrievalSettings) -> Retriever:
    retriever = Retriever(settings)
    texts = _stdlib_chunks() + [(page.title, text) for page in PAGES for text in page.sections]
    chunks = [
        IndexedChunk(chunk_id=i, document_id=title, text=text, title=title) for i, (title, text) in enumerate(texts)
    ]
    retriever.add(chunks, retriever.embed_chunks(chunks))
    return retriever


def in_corpus_questions() -> list[str]:
    return [q.question for q in ANSWER_KEY] + [session[0].question for session in SESSIONS]


def best_score(retriever: Retriever, question: str) -> float:
    hits = retriever.search(question, top_k=1)
    return round(float(hits[0].vector_score), 4) if hits else -1.0


def followup_scores(retriever: Retriever) -> dict[str, float]:
    """The best score of each session's later turns ("<first question> → <follow-up>"), each searched with the
    server's follow-up query (the earlier turns' questions and sources, `concat`) and its top_k."""
    from bench.followup import query_for
    from retrieval.followup import EarlierTurn

    scores = {}
    for session in (*SESSIONS, *SWITCHES):
        earlier: list[EarlierTurn] = []
        for turn in session:
            query = query_for("concat", turn.question, earlier, retriever)
            hits = retriever.search(query.text, top_k=retriever.settings.top_k, query_vector=query.vector)
            if earlier:
                scores[f"{session[0].question} → {turn.question}"] = round(max(h.vector_score for h in hits), 4)
            earlier.append(EarlierTurn(turn.question, tuple(h.chunk_id for h in hits)))
    return scores


def out_of_corpus_followup_scores(retriever: Retriever, floor: float | None) -> dict[str, float]:
    """The judged score of OUT_OF_CORPUS_FOLLOW_UP after each out-of-corpus question, as AskService plans a /v1
    follow-up (app/services/ask/followup.py): the first question retrieved, its sources kept only when that
    retrieval is covered, the `concat` query of the follow-up, its retrieval judged by `judged_score`."""
    from retrieval.followup import EarlierTurn, followup_query
    from retrieval.relevance import covers, judged_score

    top_k = retriever.settings.top_k
    scores = {}
    for question in OUT_OF_CORPUS:
        first = retriever.search(question, top_k=top_k)
        best = max((h.vector_score for h in first), default=None)
        recalled = tuple(h.chunk_id for h in first) if covers(best, floor) else ()
        query = followup_query(
            OUT_OF_CORPUS_FOLLOW_UP, [EarlierTurn(question, recalled)], retriever, retriever.settings
        )
        hits = retriever.search(query.text, top_k=top_k, query_vector=query.vector)
        best = round(float(max(h.vector_score for h in hits)), 6)
        judged = judged_score(retriever, query, [h.chunk_id for h in hits], best, floor)
        scores[question] = round(float(judged if judged is not None else -1.0), 4)
    return scores


def main(args: argparse.Namespace) -> int:
    from retrieval.relevance import relevance_floor

    settings = RetrievalSettings(embed_dtype=args.embed_dtype)
    floor = args.floor if args.floor is not None else relevance_floor(settings)
    retriever = build_retriever(settings)
    inside = {q: best_score(retriever, q) for q in in_corpus_questions()}
    outside = {q: best_score(retriever, q) for q in OUT_OF_CORPUS}
    followups = followup_scores(retriever)
    outside_followups = out_of_corpus_followup_scores(retriever, floor)
    result: dict[str, Any] = harness.result_header(
        NAME,
        args,
        num_chunks=retriever.count,
        embedder=settings.embedder,
        embed_dtype=harness.embed_dtype(retriever),
        floor=floor,
        in_corpus=inside,
        out_of_corpus=outside,
        max_out_of_corpus=max(outside.values()),
        min_in_corpus=min(inside.values()),
        out_of_corpus_below_floor=None if floor is None else sum(s < floor for s in outside.values()),
        in_corpus_at_or_above_floor=None if floor is None else sum(s >= floor for s in inside.values()),
        followups=followups,
        min_followup=min(followups.values()),
        followups_at_or_above_floor=None if floor is None else sum(s >= floor for s in followups.values()),
        out_of_corpus_followup=OUT_OF_CORPUS_FOLLOW_UP,
        out_of_corpus_followups=outside_followups,
        out_of_corpus_followups_below_floor=None
        if floor is None
        else sum(s < floor for s in outside_followups.values()),
    )
    print(f"{retriever.count} chunks; best cosine per question ({result['embed_dtype']})")
    for label, scores in (("in corpus", inside), ("out of corpus", outside)):
        print(f"{label}:")
        for question, score in sorted(scores.items(), key=lambda kv: kv[1]):
            print(f"  {score:.3f}  {question}")
    print(
        f"max out of corpus {result['max_out_of_corpus']:.3f}, min in corpus {result['min_in_corpus']:.3f}, "
        f"min of {len(followups)} follow-ups {result['min_followup']:.3f}"
    )
    if floor is not None:
        print(
            f"floor {floor}: {result['out_of_corpus_below_floor']}/{len(outside)} out-of-corpus questions below it "
            f"(notice), {result['in_corpus_at_or_above_floor']}/{len(inside)} in-corpus questions and "
            f"{result['followups_at_or_above_floor']}/{len(followups)} follow-ups at or above it; "
            f"{result['out_of_corpus_followups_below_floor']}/{len(outside_followups)} out-of-corpus conversations "
            f"below it at their follow-up {OUT_OF_CORPUS_FOLLOW_UP!r}"
        )
    harness.write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0

"""`python -m bench followup`: does a follow-up question still retrieve the page the conversation is about?

The corpus is a small documentation site (bench/framework_docs.py: a made-up web framework's pages, an intro,
a sponsors page and release notes among them, one chunk per section), embedded by the server's embedder
(all-MiniLM-L6-v2) into an in-memory Retriever with the server's retrieval settings. Each of the ten
sessions has three turns: the first names its subject ("How do I add middleware?"), the second and
third lean on it ("And how do I write my own?", "Show it with a class instead."). Every turn is searched
with the query the server would build from the earlier turns (their questions and the sources the
earlier searches returned), once per method:

- `off`: the question alone;
- `questions`: `concat` over the questions only (the server's query before sources counted);
- `concat`: the server's default: the questions plus the rank-weighted mean vector of the previous turn's top sources,
  retrieval/followup.py `followup_query` (what app/services/ask/followup.py runs).

Reported per method and turn: sessions whose referenced page is among the top 3 sources (target at
turns 2 and 3: at least 9 of 10), and among the top k; and for five sessions whose second question
names a new subject ("How do I serve static files instead?"), whether that new page wins ("switch").
Needs no language model; a few seconds on a CPU.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from bench import harness
from bench.framework_docs import PAGES, SESSIONS, SWITCHES
from retrieval.config import RetrievalSettings
from retrieval.followup import EarlierTurn, FollowupQuery, followup_query
from retrieval.retriever import Retriever
from retrieval.types import IndexedChunk, RetrievedChunk

logger = logging.getLogger(__name__)

NAME = "followup"
HELP = "follow-up retrieval: the referenced docs page in the top 3 at turns 2 and 3"
METHODS = ("off", "questions", "concat")
TOP = 3


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--top-k", type=int, default=None, help="sources per turn (default: the server's top_k)")
    harness.add_retrieval_args(parser, out="followup.json")


def build_retriever(settings: RetrievalSettings) -> Retriever:
    retriever = Retriever(settings)
    chunks: list[IndexedChunk] = []
    for page in PAGES:
        for text in page.sections:
            chunks.append(IndexedChunk(chunk_id=len(chunks), document_id=page.slug, text=text, title=page.title))
    retriever.add(chunks, retriever.embed_chunks(chunks))
    return retriever


def query_for(method: str, question: str, earlier: list[EarlierTurn], retriever: Retriever) -> FollowupQuery:
    settings = retriever.settings
    if method == "off" or not earlier:
        return FollowupQuery(text=question)
    if method == "questions":  # the earlier questions alone: the same query without the turns' sources
        earlier = [EarlierTurn(t.question) for t in earlier]
    return followup_query(question, earlier, retriever, settings)


def run_session(method: str, retriever: Retriever, top_k: int, session: Any) -> list[dict[str, Any]]:
    earlier: list[EarlierTurn] = []
    rows = []
    for number, turn in enumerate(session, start=1):
        query = query_for(method, turn.question, earlier, retriever)
        hits: list[RetrievedChunk] = retriever.search(query.text, top_k=top_k, query_vector=query.vector)
        pages = [h.document_id for h in hits]
        rows.append(
            {
                "turn": number,
                "question": turn.question,
                "page": turn.page,
                "retrieved": pages,
                "in_top3": turn.page in pages[:TOP],
                "in_top_k": turn.page in pages,
            }
        )
        earlier.append(EarlierTurn(turn.question, tuple(h.chunk_id for h in hits)))
    return rows


def tally(method: str, retriever: Retriever, top_k: int, sessions: Any) -> dict[str, Any]:
    """Each session's turns, and per turn how many sessions found the referenced page."""
    runs = [run_session(method, retriever, top_k, s) for s in sessions]
    per_turn = []
    for t in range(max(len(s) for s in sessions)):
        rows = [r[t] for r in runs if len(r) > t]
        per_turn.append(
            {
                "turn": t + 1,
                "in_top3": sum(r["in_top3"] for r in rows),
                "in_top_k": sum(r["in_top_k"] for r in rows),
                "num_sessions": len(rows),
            }
        )
    return {"per_turn": per_turn, "sessions": runs}


def main(args: argparse.Namespace) -> int:
    settings = RetrievalSettings(embed_dtype=args.embed_dtype)
    top_k = args.top_k or settings.top_k
    retriever = build_retriever(settings)
    result: dict[str, Any] = harness.result_header(
        NAME,
        args,
        num_pages=len(PAGES),
        num_chunks=retriever.count,
        num_sessions=len(SESSIONS),
        num_switches=len(SWITCHES),
        top_k=top_k,
        embed_dtype=harness.embed_dtype(retriever),
        settings={
            k: getattr(settings, k)
            for k in (
                "followup_turns",
                "followup_decay",
                "followup_sources",
                "followup_source_weight",
                "followup_source_decay",
                "hybrid",
            )
        },
        methods={},
    )
    print(
        f"{len(SESSIONS)} sessions over {len(PAGES)} pages ({retriever.count} chunks), top_k {top_k}, embedder "
        f"{result['embed_dtype']}; referenced page in the top 3 / top {top_k}"
    )
    print(f"{'method':<11}{'turn 1':>12}{'turn 2':>12}{'turn 3':>12}{'switch':>12}")
    for method in METHODS:
        followed = tally(method, retriever, top_k, SESSIONS)
        switched = tally(method, retriever, top_k, SWITCHES)
        result["methods"][method] = {**followed, "switches": switched}
        cells = [*followed["per_turn"], switched["per_turn"][-1]]
        print(
            f"{method:<11}"
            + "".join(f"{c['in_top3']:>5}/{c['num_sessions']} {c['in_top_k']:>2}/{c['num_sessions']}" for c in cells)
        )
    harness.write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0

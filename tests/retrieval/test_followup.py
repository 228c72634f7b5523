"""The follow-up query: the new question and the recent ones, the latest weighted most."""

from __future__ import annotations

import numpy as np
from hash_embedder import HashEmbedder

from retrieval.config import RetrievalSettings
from retrieval.followup import (
    EarlierTurn,
    clean_rewrite,
    concat_query,
    followup_query,
    recent_questions,
    rewrite_request_text,
)
from retrieval.retriever import Retriever
from retrieval.types import IndexedChunk


def test_recent_questions_newest_first() -> None:
    assert recent_questions(["a", " ", "b", "c"], 2) == ["c", "b"]
    assert recent_questions(["a"], 0) == []


def test_concat_weights_the_latest_most() -> None:
    emb = HashEmbedder()
    query = concat_query(" and the dog? ", ["who jumps?", "the fox"], emb, num_turns=2, decay=0.5)
    assert query.text == "and the dog? the fox who jumps?"
    assert query.num_turns_used == 2
    assert query.questions == ("and the dog?", "the fox", "who jumps?")  # what coverage is judged on too
    e = emb.embed_queries(["and the dog?", "the fox", "who jumps?"])
    expected = e[0] + 0.5 * e[1] + 0.25 * e[2]
    np.testing.assert_allclose(query.vector, expected / np.linalg.norm(expected), rtol=1e-6)
    assert abs(float(np.linalg.norm(query.vector)) - 1.0) < 1e-6
    # Similarity to the new question beats the older ones'.
    sims = e @ query.vector
    assert sims[0] > sims[1] > sims[2]


def test_concat_without_history_is_the_question() -> None:
    query = concat_query("  alone  ", [], HashEmbedder(), num_turns=2, decay=0.5)
    assert (query.text, query.vector, query.num_turns_used) == ("alone", None, 0)


def test_rewrite_prompt_and_cleanup() -> None:
    text = rewrite_request_text("What is its code?", [("old", "x"), ("Tell me about Zorblat.", "It is a project.")], 1)
    assert text == (
        "Conversation:\nUser: Tell me about Zorblat.\nAssistant: It is a project.\nLast question: What is its code?"
    )
    assert clean_rewrite('\n "Rewritten question: What is the code of Zorblat?"\nmore', "q") == (
        "What is the code of Zorblat?"
    )
    assert clean_rewrite("  \n", " q ") == "q"


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _retriever(settings: RetrievalSettings) -> Retriever:
    retriever = Retriever(settings, embedder=HashEmbedder())
    texts = ["middleware wraps the app", "write your own middleware class", "sponsor the project", "routing paths"]
    chunks = [
        IndexedChunk(chunk_id=10 + i, document_id=f"d{i}", text=t, collection="team" if i < 3 else "other")
        for i, t in enumerate(texts)
    ]
    retriever.add(chunks, retriever.embed_chunks(chunks))
    return retriever


def test_followup_query_joins_the_previous_turns_sources() -> None:
    settings = RetrievalSettings(
        followup_turns=2, followup_decay=0.5, followup_sources=2, followup_source_weight=0.7, followup_source_decay=1.0
    )
    retriever = _retriever(settings)
    emb = retriever.embedder
    earlier = [EarlierTurn("how do I add middleware?", (13,)), EarlierTurn("and my own?", (11, 10, 12))]
    query = followup_query("show it with a class", earlier, retriever, settings)
    assert query.text == "show it with a class and my own? how do I add middleware?"
    e = emb.embed_queries(["show it with a class", "and my own?", "how do I add middleware?"])
    questions = _unit(e[0] + 0.5 * e[1] + 0.25 * e[2])
    sources = _unit(retriever.vectors_of([11, 10]).mean(axis=0))  # the previous turn's top 2 only
    np.testing.assert_allclose(query.vector, _unit(e[0] + 0.7 * sources), rtol=1e-5, atol=1e-6)
    # The new question weighs most: it is nearer the query than the earlier topic is.
    assert float(e[0] @ query.vector) > float(sources @ query.vector)
    assert (query.num_turns_used, query.num_sources_used) == (2, 2)
    # No sources (a /v1 messages array), or the weight at 0: the questions alone.
    plain = followup_query("show it with a class", [EarlierTurn(t.question) for t in earlier], retriever, settings)
    np.testing.assert_allclose(plain.vector, questions, rtol=1e-5, atol=1e-6)
    assert plain.num_sources_used == 0
    # A deleted source chunk is left out of the mean.
    retriever.remove([11])
    gone = followup_query("show it with a class", earlier, retriever, settings)
    np.testing.assert_allclose(gone.vector, _unit(e[0] + 0.7 * retriever.vectors_of([10])[0]), rtol=1e-5)


def test_the_previous_turns_sources_weigh_by_rank() -> None:
    settings = RetrievalSettings(followup_sources=3, followup_source_weight=0.7, followup_source_decay=0.6)
    retriever = _retriever(settings)
    earlier = [EarlierTurn("tell me about middleware", (10, 11, 12))]
    query = followup_query("what else?", earlier, retriever, settings)
    asked = retriever.embedder.embed_queries(["what else?"])[0]
    v = retriever.vectors_of([10, 11, 12])
    topic = _unit(1.0 * v[0] + 0.6 * v[1] + 0.36 * v[2])
    np.testing.assert_allclose(query.vector, _unit(asked + 0.7 * topic), rtol=1e-5, atol=1e-6)
    assert query.num_sources_used == 3
    plain_mean = _unit(asked + 0.7 * _unit(v.mean(axis=0)))
    # The best source leads: the query's lead of the first source over the third is wider than a plain mean's.
    assert float(v[0] @ query.vector) - float(v[2] @ query.vector) > float(v[0] @ plain_mean) - float(v[2] @ plain_mean)
    # Decay 1 is the plain mean.
    plain = followup_query("what else?", earlier, retriever, settings.model_copy(update={"followup_source_decay": 1.0}))
    np.testing.assert_allclose(plain.vector, plain_mean, rtol=1e-5, atol=1e-6)

"""The score a retrieval is judged covered on (retrieval/relevance.py `judged_score`): a question alone is judged
on its query's best cosine; a follow-up under the floor also on its question's and the earlier questions'."""

from __future__ import annotations

from hash_embedder import HashEmbedder

from retrieval.config import RetrievalSettings
from retrieval.followup import FollowupQuery
from retrieval.relevance import judged_score
from retrieval.retriever import Retriever
from retrieval.types import IndexedChunk

TEXTS = ["quintaro is the capital of zorblat", "sourdough needs flour water and salt", "the moon orbits the earth"]
FOLLOW_UP = FollowupQuery(text="what else? capital of zorblat?", questions=("what else?", "capital of zorblat?"))


def _retriever() -> Retriever:
    retriever = Retriever(RetrievalSettings(embed_title=False), embedder=HashEmbedder())
    chunks = [IndexedChunk(chunk_id=10 + i, document_id=f"d{i}", text=t) for i, t in enumerate(TEXTS)]
    retriever.add(chunks, retriever.embed_chunks(chunks))
    return retriever


def test_a_follow_up_under_the_floor_is_judged_on_its_questions_too() -> None:
    retriever = _retriever()
    asked = retriever.embedder.embed_queries(["what else?", "capital of zorblat?"])  # (2, dim)
    cosines = retriever.vectors_of([10, 11]) @ asked.T  # (chunks, questions)
    best_asked = round(float(cosines.max()), 6)
    # The earlier question, on the first chunk, is what lifts it.
    assert best_asked == round(float(cosines[0, 1]), 6) and best_asked > 0.5
    assert judged_score(retriever, FOLLOW_UP, [10, 11], 0.1, 0.35) == best_asked
    # Never lower than the query's own best.
    assert judged_score(retriever, FOLLOW_UP, [11], 0.3, 0.35) == 0.3
    # Only the chunks retrieved count: a deleted one is left out, none at all leaves the query's score.
    retriever.remove([10])
    assert float(cosines[1].max()) == 0.0  # the bread chunk shares no word with either question
    assert judged_score(retriever, FOLLOW_UP, [10, 11], 0.1, 0.35) == 0.1
    assert judged_score(retriever, FOLLOW_UP, [10], 0.1, 0.35) == 0.1


def test_a_question_alone_or_a_covered_one_keeps_its_own_score() -> None:
    retriever = _retriever()
    assert judged_score(retriever, FOLLOW_UP, [10], 0.4, 0.35) == 0.4  # already covered
    assert judged_score(retriever, FOLLOW_UP, [10], 0.1, None) == 0.1  # no floor
    assert judged_score(retriever, FOLLOW_UP, [10], None, 0.35) is None  # nothing retrieved
    alone = FollowupQuery(text="capital of zorblat?")
    assert judged_score(retriever, alone, [10], 0.1, 0.35) == 0.1
    assert judged_score(retriever, FollowupQuery(text="x", questions=("x",)), [10], 0.1, 0.35) == 0.1


def test_a_conversation_the_chunks_do_not_answer_stays_under_the_floor() -> None:
    retriever = _retriever()
    query = FollowupQuery(text="why? rust vectors", questions=("why?", "how do i reverse rust vectors"))
    asked = retriever.embedder.embed_queries(list(query.questions))
    expected = round(float((retriever.vectors_of([12]) @ asked.T).max()), 6)
    assert judged_score(retriever, query, [12], -0.2, 0.35) == max(-0.2, expected)
    assert expected < 0.35

"""The follow-up query: the new question and the recent ones, the latest weighted most."""

from __future__ import annotations

import numpy as np
from hash_embedder import HashEmbedder

from retrieval.followup import clean_rewrite, concat_query, recent_questions, rewrite_request_text


def test_recent_questions_newest_first() -> None:
    assert recent_questions(["a", " ", "b", "c"], 2) == ["c", "b"]
    assert recent_questions(["a"], 0) == []


def test_concat_weights_the_latest_most() -> None:
    emb = HashEmbedder()
    query = concat_query(" and the dog? ", ["who jumps?", "the fox"], emb, num_turns=2, decay=0.5)
    assert query.text == "and the dog? the fox who jumps?"
    assert query.num_turns_used == 2
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

"""`bench relevance` on the real MiniLM embedder (float32): the scores behind the builtin embedder's
relevance floor, and what the shipped floor does with them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_the_shipped_floor_keeps_every_in_corpus_question_and_flags_the_far_ones(tmp_path: Path) -> None:
    from bench.relevance import OUT_OF_CORPUS, in_corpus_questions, main
    from retrieval.relevance import BUILTIN_EMBEDDER_FLOOR

    out = tmp_path / "relevance.json"
    assert main(argparse.Namespace(floor=None, embed_dtype="float32", out=out)) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert (result["benchmark"], result["embedder"], result["floor"]) == (
        "relevance",
        "builtin",
        BUILTIN_EMBEDDER_FLOOR,
    )
    assert list(result["in_corpus"]) == in_corpus_questions() and len(result["in_corpus"]) == 22
    assert list(result["out_of_corpus"]) == list(OUT_OF_CORPUS) and len(OUT_OF_CORPUS) == 14
    assert result["in_corpus_at_or_above_floor"] == 22  # no in-corpus answer lost
    # The seven questions on other subjects all fall below it; of the seven Python questions about other
    # libraries only two do (pandas, Pydantic): cosine similarity alone cannot tell the others apart.
    far, near = list(OUT_OF_CORPUS[7:]), list(OUT_OF_CORPUS[:7])
    assert all(result["out_of_corpus"][q] < BUILTIN_EMBEDDER_FLOOR for q in far)
    below = [q for q in near if result["out_of_corpus"][q] < BUILTIN_EMBEDDER_FLOOR]
    assert below == [OUT_OF_CORPUS[3], OUT_OF_CORPUS[4]]
    assert result["out_of_corpus_below_floor"] == 9
    # A conversation's follow-ups, searched as the server searches them, keep their sources too.
    assert len(result["followups"]) == 25 and result["followups_at_or_above_floor"] == 25
    assert result["min_followup"] == pytest.approx(0.473, abs=0.005)
    assert result["min_in_corpus"] == pytest.approx(0.422, abs=0.005)
    assert result["max_out_of_corpus"] == pytest.approx(0.475, abs=0.005)
    # Followed up as /v1 and /ask follow it up now (the first question's sources when it cleared the floor, the
    # judged score): the nine conversations under the floor at their first question stay under it.
    followed = result["out_of_corpus_followups"]
    assert list(followed) == list(OUT_OF_CORPUS) and result["out_of_corpus_followups_below_floor"] == 9
    assert [q for q in OUT_OF_CORPUS if followed[q] < BUILTIN_EMBEDDER_FLOOR] == [
        q for q in OUT_OF_CORPUS if result["out_of_corpus"][q] < BUILTIN_EMBEDDER_FLOOR
    ]
    assert max(followed[q] for q in far) == pytest.approx(0.298, abs=0.005)  # nginx: its own first question

"""`python -m bench answers` end to end on the tiny model: both corpora ingested, every question asked in
full and the default blend, one row per model and mode."""

from __future__ import annotations

import json
from pathlib import Path

from bench.__main__ import main
from bench.docs_corpus import ANSWER_KEY, MODULES, read_corpus, write_corpus


def test_the_docs_corpus_holds_every_answer(tmp_path: Path) -> None:
    pages, key = read_corpus(write_corpus(tmp_path / "docs"))
    assert [title for title, _ in pages] == sorted(MODULES)
    assert key == ANSWER_KEY and len(key) == 12
    text = dict(pages)
    assert all(q.answers[0] in text[q.page] for q in key)


def test_answers_runs_per_model_and_mode(tmp_path: Path, tiny_llama_dir: Path) -> None:
    out = tmp_path / "answers.json"
    args = ["answers", "--models", str(tiny_llama_dir), "--examples", "3", "--max-tokens", "2", "--threads", "2"]
    args += ["--followups", "2"]
    assert main([*args, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["benchmark"], result["examples"], result["docs_questions"], result["followups"]) == (
        "answers",
        3,
        12,
        2,
    )
    [(name, row)] = result["models"].items()
    assert name == str(tiny_llama_dir) and row["served_model"]["served_model"]["name"] == tiny_llama_dir.name
    assert list(row["modes"]) == ["full", "blend"]
    for mode in row["modes"].values():
        assert (len(mode["lookups"]), len(mode["docs"]), len(mode["followups"])) == (3, 12, 2)
        # A follow-up's second turn is scored on its own answer; the count is the rows' sum.
        assert mode["followups_right"] == sum(r["right"] for r in mode["followups"])
        assert {r["project"] for r in mode["followups"]} == {r["project"] for r in row["modes"]["full"]["followups"]}
        assert mode["ttft_median_ms"] > 0
        # Every docs answer carries its marks (standing and by shared words alone) and unsupported names.
        assert all({"marks", "marks_lexical", "unsupported"} <= set(row) for row in mode["docs"])
        assert mode["docs_marks"] == sum(len(r["marks"]) for r in mode["docs"]) <= mode["docs_marks_lexical"]
        assert mode["docs_unsupported_identifiers"] == sum(len(r["unsupported"]) for r in mode["docs"])
    assert out.with_suffix(".png").is_file()

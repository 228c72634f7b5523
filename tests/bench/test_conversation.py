"""`python -m bench conversation` on the tiny model and made-up data: sessions, per-turn figures, look-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.conversation import make_projects, make_sessions
from bench.data import load_dataset


def test_sessions_name_a_subject_then_refer_back_then_move_on(dataset_path: Path) -> None:
    sessions = make_sessions(load_dataset(dataset_path), num_turns=4)
    assert [t.question for t in sessions[0].turns] == [
        "Tell me about Freedonia.",
        "What else do you know about it?",
        "And what about Sylvania?",
        "How is that related to the first one?",
    ]
    assert [t.referenced_title for t in sessions[0].turns] == ["Freedonia", "Freedonia", "Sylvania", "Sylvania"]
    assert sessions[1].turns[0].referenced_title == "Marvin"  # the gold passage, wherever it is listed
    assert len(make_sessions(load_dataset(dataset_path), num_turns=2)[0].turns) == 2


def test_projects_hold_their_code_once_each() -> None:
    projects = make_projects(6, seed=3)
    assert len({p.name for p in projects}) == len({p.code for p in projects}) == 6
    assert all(f"The access code of project {p.name} is {p.code}." in p.text for p in projects)
    assert projects == make_projects(6, seed=3)
    with pytest.raises(ValueError, match="at most"):
        make_projects(99)


def test_conversation_bench_runs_through_the_service(run_bench, dataset_path: Path, tiny_llama_dir: Path) -> None:
    from transformers import AutoTokenizer

    from engine.config import DEFAULT_SYSTEM_PROMPT
    from engine.prompt import PromptBuilder, Turn

    code, result, png = run_bench(
        "conversation",
        "--dataset",
        str(dataset_path),
        "--examples",
        "2",
        "--turns",
        "2",
        "--passages",
        "2",
        "--lookup",
        "2",
        "--max-tokens",
        "3",
    )
    assert code == 0 and png.is_file()
    assert result["sessions"] == 2 and set(result["by_turn"]) == {"1", "2"}
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_llama_dir), DEFAULT_SYSTEM_PROMPT)
    rows = result["per_turn"]
    for first, second in zip(rows[::2], rows[1::2], strict=True):
        assert (first["turn"], second["turn"]) == (1, 2) and first["history_tokens"] == 0
        # Turn 2 holds turn 1 (question + the default's answer), served from the entry turn 1 stored.
        expected = len(builder.turn_ids(Turn(first["question"], first["answer"])))
        assert second["history_tokens"] == second["history_reused_tokens"] == expected
        assert set(second["recall"]) == {"concat", "rewrite", "off"} and set(second["kl"]) == {"default", "reuse"}
        assert set(second["ttft_ms"]) == {"full", "default_history_reused", "default_history_recomputed"}
    assert result["by_turn"]["2"]["history_reused_share"] == 1.0
    summary = result["lookup"]["summary"]
    assert set(summary) == {"ask", "v1"} and result["lookup"]["questions"] == 2
    assert summary["ask"]["history_reused"] == summary["v1"]["history_reused"] == 2
    for row in result["lookup"]["per_project"]:
        # Greedy: the reference conversation's turn 1 is the default's, so full prefill's turn 2 reads the
        # same stored sources on /ask and retrieves what the default's turn 2 did, on both paths.
        assert row["same_first_answer"] is True
        assert row["ask"]["full_same_sources"] is True and row["v1"]["full_same_sources"] is True
        assert all(1 <= row[path]["rank"] <= 2 for path in ("ask", "v1"))

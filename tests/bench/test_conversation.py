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


def test_ship_records_the_lookup_test_as_the_follow_ups_check_only_on_a_pass(
    run_bench, dataset_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.calibration import shipped
    from app.calibration.record import BlendSettingsRecord

    shipped_dir = tmp_path / "shipped"
    shipped_dir.mkdir()
    monkeypatch.setattr(shipped, "SHIPPED_DIR", shipped_dir)
    args = ("--dataset", str(dataset_path), "--examples", "0", "--lookup", "3", "--no-timings", "--max-tokens", "4")
    code, first, _ = run_bench("conversation", *args, "--ship")
    assert code == 1 and list(shipped_dir.iterdir()) == []  # no record ships for the tiny model
    assert first["sessions"] == 0 and first["by_turn"] == {} and first["lookup"]["questions"] == 3

    # A record at ratio 1 (history recomputed too): the default blend answers as full prefill does on both paths.
    record = BlendSettingsRecord(
        model="tiny-llama-smollm2-tok",
        fingerprint=first["fingerprint"],
        compute_dtype="float32",
        values={"recompute_ratio": 1.0, "history_ratio": 1.0},
        calibrated_at="2026-12-04T00:00:00+00:00",
        calibration_set="calset-3",
        measured={"kl_ratio": 0.1},
    )
    path = shipped_dir / "tiny-llama-smollm2-tok.float32.json"
    path.write_text(record.to_json())
    code, result, _ = run_bench("conversation", *args, "--ship")
    assert code == 0
    entry = BlendSettingsRecord.from_json(path.read_text()).measured["followups_check"]
    summary = result["lookup"]["summary"]
    assert entry["meets_target"] is True and entry["num_projects"] == 3 and entry["blend"]["recompute_ratio"] == 1.0
    assert entry["num_right_blend"] == {p: summary[p]["default_right"] for p in ("ask", "v1")}
    assert entry["num_right_full"] == {p: summary[p]["full_right"] for p in ("ask", "v1")}
    for row in result["lookup"]["per_project"]:
        for p in ("ask", "v1"):
            assert row[p]["answer"] == row[p]["full_answer"]


def test_ship_needs_the_lookup_test() -> None:
    from bench.__main__ import main

    with pytest.raises(SystemExit, match="give --lookup N"):
        main(["conversation", "--model", "m", "--lookup", "0", "--ship"])

from __future__ import annotations


def test_lookup_end_to_end_through_the_ask_service(run_bench) -> None:
    code, result, png = run_bench(
        "lookup", "--examples", "2", "--passages", "2", "--selectors", "query", "--ratio", "0.5", "--max-tokens", "3"
    )
    assert code == 0 and png.is_file()
    assert result["questions"] == 2 and result["top_k"] == 2 and result["ratio"] == 0.5
    assert list(result["right"]) == ["full", "reuse", "query@0.5"]
    assert all(0 <= right <= 2 for right in result["right"].values())
    assert result["kv_dtype"] == "int4" and result["compute_dtype"] == "float32"
    rows = result["per_question"]
    assert len(rows) == 2 and rows[0]["modes"]["query@0.5"]["selector"] == "query"
    assert rows[0]["modes"]["full"]["selector"] is None


def test_lookup_study_asks_each_candidate_with_its_settings(run_bench, tmp_path) -> None:
    study = tmp_path / "study.json"
    study.write_text('[{"recompute_ratio": 1.0}, {"recompute_ratio": 1.0, "sink_tokens": 1, "pool_window": 3}]')
    code, result, _ = run_bench(
        "lookup", "--examples", "2", "--passages", "2", "--candidates", str(study), "--max-tokens", "3"
    )
    names = ["query@1.0", "query@1.0 pool_window=3 sink_tokens=1"]
    assert code == 0 and list(result["right"]) == ["full", "reuse", *names]
    assert result["candidates"][names[1]]["candidate"] == {"recompute_ratio": 1.0, "sink_tokens": 1, "pool_window": 3}
    assert result["candidates"][names[1]]["blend"]["sink_tokens"] == 1
    assert result["candidates"][names[1]]["blend"]["pool_window"] == 3
    assert result["candidates"][names[0]]["blend"]["sink_tokens"] == 0
    for row in result["per_question"]:
        modes = row["modes"]
        # Each candidate ran in an app of its own and recomputed everything: full prefill's greedy answer.
        assert modes[names[0]]["answer"] == modes[names[1]]["answer"] == modes["full"]["answer"]
        assert modes[names[1]]["selector"] == "query"


def test_lookup_among_similar_chunks_ingests_every_page_of_each_case(run_bench) -> None:
    from bench.lookup import similar_facts

    facts, passages = similar_facts(2, 0, "check")
    code, result, _ = run_bench(
        "lookup", "--distractors", "similar", "--examples", "2", "--passages", "3", "--selectors", "query",
        "--max-tokens", "3",
    )  # fmt: skip
    assert code == 0 and (result["distractors"], result["part"]) == ("similar", "check")
    assert result["documents"] == len(passages) > 2 and result["questions"] == 2
    assert [row["question"] for row in result["per_question"]] == [f.question for f in facts]
    assert [row["answer"] for row in result["per_question"]] == [f.answer for f in facts]


def test_a_follow_up_look_up_carries_its_earlier_turn() -> None:
    from app.calibration.similar import similar_cases
    from bench.lookup import similar_facts

    facts, _ = similar_facts(5, 0, "check")
    case = similar_cases("check", 5, 0)[4]
    assert case.kind == "followup" and "that one" in facts[4].question
    assert facts[4].history == case.history and len(case.history) == 1
    assert [f.history for f in facts[:4]] == [()] * 4


def test_lookup_among_pages_holding_several_values_asks_the_several_values_shape(run_bench) -> None:
    from bench.lookup import similar_facts

    facts, passages = similar_facts(3, 0, "check", "several")
    assert [(f.question, f.answer) for f in facts] == [
        ("Which purchase order does the Kriard programme run under?", "PO 45437"),
        ("In which rack position is the Elisk appliance?", "R47-U39"),
        ("How large is the grant of the Grourst programme?", "£23,506"),
    ]
    code, result, _ = run_bench(
        "lookup", "--distractors", "similar", "--shape", "several", "--examples", "3", "--passages", "3",
        "--selectors", "query", "--max-tokens", "3",
    )  # fmt: skip
    assert code == 0 and (result["distractors"], result["part"], result["shape"]) == ("similar", "check", "several")
    assert result["documents"] == len(passages) == 9 and result["questions"] == 3
    assert [row["answer"] for row in result["per_question"]] == ["PO 45437", "R47-U39", "£23,506"]

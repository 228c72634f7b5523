from __future__ import annotations

import pytest

from bench.frontier import pareto, speed


def test_frontier_end_to_end(run_bench, dataset_path) -> None:
    code, result, png = run_bench(
        "frontier",
        "--dataset",
        str(dataset_path),
        "--examples",
        "2",
        "--passages",
        "3",
        "--ratios",
        "0.3,1.0",
        "--selectors",
        "query,deviation",
        "--max-tokens",
        "3",
    )
    assert code == 0 and png.is_file() and png.stat().st_size > 0
    assert list(result["modes"]) == ["full", "reuse", "query@0.3", "deviation@0.3", "query@1.0", "deviation@1.0"]
    assert result["selectors"] == ["query", "deviation"] and result["examples"] == 2
    for name in ("query@0.3", "deviation@0.3", "query@1.0", "deviation@1.0"):
        m = result["modes"][name]
        assert set(m) >= {"kl", "benefit_retained", "fidelity_f1", "f1", "ttft_s_median", "speedup", "selector"}
        assert m["selector"] == name.split("@")[0] and m["ratio"] == float(name.split("@")[1])
    # At r = 1 both selectors recompute everything: full prefill.
    for name in ("query@1.0", "deviation@1.0"):
        assert abs(result["modes"][name]["kl"]) < 1e-6 and result["modes"][name]["fidelity_f1"] == 1.0
    rows = result["per_example"]
    ctx = rows[0]["num_context_tokens"]
    # Both selectors recompute round(0.3 · N) context tokens; the up-front query selector also the tokens the
    # question names, at most match_extra's share (0.1) of N on top.
    budget, extra = int(0.3 * ctx + 0.5), int(0.1 * ctx + 0.5)
    assert budget <= rows[0]["modes"]["query@0.3"]["num_recomputed_tokens"] <= budget + extra
    assert rows[0]["modes"]["deviation@0.3"]["num_recomputed_tokens"] == budget
    assert result["modes"]["full"]["speedup"] == 1.0
    assert set(result["pareto"]) <= set(result["modes"]) - {"full"}


def test_speed_is_median_ratio_and_paired() -> None:
    rows = [{"modes": {"full": {"prompt_s": f}, "x": {"prompt_s": x}}} for f, x in ((10, 2), (12, 2), (8, 4))]
    out = speed(rows, ["full", "x"])
    assert out["full"] == {"ttft_s_median": 10, "speedup": 1.0, "speedup_paired_median": 1.0}
    assert out["x"] == {"ttft_s_median": 2, "speedup": 5.0, "speedup_paired_median": 5.0}


def test_pareto_drops_dominated_modes() -> None:
    modes = {
        "full": {"speedup": 1.0, "kl": 0.0},
        "a": {"speedup": 5.0, "kl": 0.1},
        "b": {"speedup": 4.0, "kl": 0.2},
        "c": {"speedup": 20.0, "kl": 0.5},
        "d": {"speedup": 2.0, "kl": 0.01},
    }
    assert pareto(modes) == ["a", "c", "d"]
    assert pytest.approx(modes["a"]["kl"]) == 0.1


def test_lookup_facts_are_unique_and_checked_by_content() -> None:
    from app.calibration.scoring import is_right
    from bench.lookup import Fact, make_facts

    facts = make_facts(9, seed=1)
    assert len({f.answer for f in facts}) == 9 and len({f.title for f in facts}) == 9
    assert all(f.answer in f.text and f.title in f.question for f in facts)
    assert facts == make_facts(9, seed=1) and facts != make_facts(9, seed=2)
    fact = Fact("Harbor Lab", "…", "What is the access code of the Harbor Lab?", "QX-7316")
    assert is_right("The access code is qx 7316.", fact.answer) and not is_right("QX-7361", fact.answer)
    with pytest.raises(ValueError, match="at most"):
        make_facts(100)


def test_lookup_through_ask_blend_at_one_answers_as_full(run_bench) -> None:
    code, result, png = run_bench(
        "lookup",
        "--examples",
        "3",
        "--passages",
        "2",
        "--ratio",
        "1.0",
        "--selectors",
        "query,deviation",
        "--max-tokens",
        "4",
    )
    assert code == 0 and png.is_file()
    assert list(result["right"]) == ["full", "reuse", "query@1.0", "deviation@1.0"] and result["questions"] == 3
    for row in result["per_question"]:
        modes = row["modes"]
        # Recomputing everything is full prefill, whichever selector: identical greedy answers.
        assert modes["query@1.0"]["answer"] == modes["deviation@1.0"]["answer"] == modes["full"]["answer"]
        assert modes["query@1.0"]["selector"] == "query" and modes["full"]["selector"] is None


def test_frontier_adaptive_points(run_bench, dataset_path) -> None:
    code, result, _ = run_bench(
        "frontier",
        "--dataset",
        str(dataset_path),
        "--examples",
        "2",
        "--passages",
        "3",
        "--ratios",
        "0.3",
        "--selectors",
        "query",
        "--adaptive",
        "0.5,1.0",
        "--ratio-min",
        "0.1",
        "--ratio-max",
        "1.0",
        "--max-tokens",
        "2",
    )
    assert code == 0
    assert list(result["modes"]) == ["full", "reuse", "query@0.3", "adaptive@0.5", "adaptive@1.0"]
    half, whole = result["modes"]["adaptive@0.5"], result["modes"]["adaptive@1.0"]
    assert (half["attention_share"], half["ratio_min"], half["ratio_max"], half["selector"]) == (0.5, 0.1, 1.0, "query")
    assert 0.1 <= half["ratio"] < 1.0
    # All of the question's attention, nothing capped: every context token is recomputed, i.e. full prefill.
    assert whole["ratio"] == 1.0 and abs(whole["kl"]) < 1e-6 and whole["fidelity_f1"] == 1.0
    rows = result["per_example"]
    for row in rows:
        n = row["modes"]["adaptive@0.5"]["num_recomputed_tokens"]
        assert round(0.1 * row["num_context_tokens"]) <= n <= row["num_context_tokens"]


def _study(run_bench, dataset_path, candidates: str, *options: str):
    """`bench frontier --candidates` on the made-up set: 2 examples × 3 passages, 2-token answers."""
    study = dataset_path.with_name("study.json")
    study.write_text(candidates)
    args = ["--dataset", str(dataset_path), "--examples", "2", "--passages", "3", "--max-tokens", "2"]
    return run_bench("frontier", *args, "--candidates", str(study), *options)


def test_frontier_study_runs_each_candidate_on_the_same_prompts(run_bench, dataset_path) -> None:
    code, result, png = _study(
        run_bench,
        dataset_path,
        '[{"recompute_ratio": 1.0}, {"recompute_ratio": 0.3, "sink_tokens": 2}, {"recompute_ratio": 0.3}]',
    )
    names = ["query@1.0", "query@0.3 sink_tokens=2", "query@0.3"]
    assert code == 0 and png.is_file()
    assert list(result["modes"]) == ["full", "reuse", *names] and result["candidates"] == names
    assert result["ratios"] == [] and result["selectors"] == []
    sinks = result["modes"]["query@0.3 sink_tokens=2"]
    assert sinks["candidate"] == {"recompute_ratio": 0.3, "sink_tokens": 2}
    assert sinks["blend"]["sink_tokens"] == 2 and sinks["ratio"] == 0.3 and sinks["selector"] == "query"
    # The candidate changes only what it sets: the rest is the settings in force for the model.
    assert result["modes"]["query@0.3"]["blend"]["sink_tokens"] == 0
    assert sinks["blend"]["score_layers"] == result["blend"]["score_layers"]
    # Recomputing everything is full prefill; sinks come out of the same budget, not on top of it (only the
    # tokens the question names may add match_extra's share, 0.1, on top).
    assert abs(result["modes"]["query@1.0"]["kl"]) < 1e-6 and result["modes"]["query@1.0"]["fidelity_f1"] == 1.0
    for row in result["per_example"]:
        budget, extra = (int(r * row["num_context_tokens"] + 0.5) for r in (0.3, 0.1))
        assert budget <= row["modes"]["query@0.3 sink_tokens=2"]["num_recomputed_tokens"] <= budget + extra
        assert budget <= row["modes"]["query@0.3"]["num_recomputed_tokens"] <= budget + extra


def test_frontier_question_first_states_the_question_before_the_chunks(run_bench, dataset_path, tiny_engine) -> None:
    from bench.data import build_prompt, load_dataset
    from bench.frontier import question_first

    example = load_dataset(dataset_path)[0]
    standard = build_prompt(tiny_engine.prompt, tiny_engine.tokenizer, example, 3)
    moved = question_first(tiny_engine, standard)
    stated = tiny_engine.tokenizer.encode(f"Question: {example.question}\n\n", add_special_tokens=False)
    assert moved.layout.prefix_ids == standard.layout.prefix_ids + stated
    assert moved.layout.chunk_ids == standard.layout.chunk_ids and moved.chunk_ids == standard.chunk_ids
    assert moved.layout.suffix_ids == standard.layout.suffix_ids and not moved.layout.segments_behind_prefix

    code, result, _ = _study(
        run_bench, dataset_path, '[{"recompute_ratio": 1.0}, {"recompute_ratio": 0.3}]', "--question-first"
    )
    assert code == 0 and result["question_first"] is True
    # The stored chunk KV (computed behind the server's prefix alone) blended at r = 1 is this layout's full
    # prefill: the reference of every mode is full prefill of the same layout.
    assert abs(result["modes"]["query@1.0"]["kl"]) < 1e-6 and result["modes"]["query@1.0"]["fidelity_f1"] == 1.0
    row = next(r for r in result["per_example"] if r["index"] == standard.example.index)
    assert row["num_prompt_tokens"] == standard.layout.num_tokens + len(stated)

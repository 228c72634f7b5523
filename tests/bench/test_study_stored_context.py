"""The cross-chunk variant of stored KV (bench/stored_context.py): which text each chunk is computed behind,
and a frontier study reading it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.candidates import read_candidates
from bench.data import passage_chunk_ids
from bench.prepared import bench_prompts
from bench.stored_context import MAX_CONTEXT_TOKENS, ContextVariants
from retrieval.config import RetrievalSettings
from retrieval.embedder import Embedder


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder.from_settings(RetrievalSettings())


def test_contexts_per_variant(tiny_engine, dataset_path: Path, embedder: Embedder) -> None:
    variants = ContextVariants(tiny_engine, embedder)
    bp = bench_prompts(tiny_engine, dataset_path, None, 3, with_answers=True)[0]
    a, b, c = bp.chunk_ids
    assert variants.contexts(bp, "plain") == [[], [], []]
    assert variants.contexts(bp, "previous") == [[], a[-MAX_CONTEXT_TOKENS:], [*a, *b][-MAX_CONTEXT_TOKENS:]]
    # The passage most like each one among its example's others; the first chunk keeps its exact plain KV.
    pool = bp.example.passages
    titles = {tuple(ids): p.title for ids, p in zip(passage_chunk_ids(tiny_engine.tokenizer, pool), pool, strict=True)}
    assert [titles[tuple(ids)] for ids in bp.chunk_ids] == ["Rivers", "Sylvania", "Freedonia"]  # best one last
    assert [titles.get(tuple(ctx)) for ctx in variants.contexts(bp, "neighbour")] == [None, "Freedonia", "Sylvania"]
    # Another example's passages, chunk i behind passage i; alone in a run, the example's least similar passage.
    other = bench_prompts(tiny_engine, dataset_path, None, 3, with_answers=True)[1]
    both = ContextVariants(tiny_engine, embedder, prompts=[bp, other])
    assert both.contexts(bp, "unrelated") == [[], *other.chunk_ids[1:]]
    assert [titles.get(tuple(ctx)) for ctx in variants.contexts(bp, "unrelated")] == [None, "Rivers", "Rivers"]
    with pytest.raises(ValueError, match="stored_context must be one of"):
        variants.contexts(bp, "elsewhere")  # type: ignore[arg-type]


def test_only_the_frontier_reads_stored_context(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text('[{"recompute_ratio": 0.1, "stored_context": "neighbour"}]')
    assert read_candidates(path, study_fields=True) == [{"recompute_ratio": 0.1, "stored_context": "neighbour"}]
    with pytest.raises(SystemExit, match="not blend settings: stored_context"):
        read_candidates(path)  # calibrate and lookup run the server's ingest: they cannot honour it
    path.write_text('[{"stored_context": "nearby"}]')
    with pytest.raises(SystemExit, match="stored_context must be one of plain, neighbour, unrelated, previous"):
        read_candidates(path, study_fields=True)


def test_frontier_study_of_stored_context(run_bench, dataset_path: Path) -> None:
    study = dataset_path.with_name("study.json")
    study.write_text(
        '[{"recompute_ratio": 0.0}, {"recompute_ratio": 0.0, "stored_context": "previous"},'
        ' {"recompute_ratio": 0.0, "stored_context": "neighbour"}, {"recompute_ratio": 0.0, "stored_context": "plain"}]'
    )
    args = ["--dataset", str(dataset_path), "--examples", "2", "--passages", "3", "--max-tokens", "2"]
    code, result, _ = run_bench("frontier", *args, "--candidates", str(study), "--kv-dtype", "fp32")
    assert code == 0 and result["chunk_lead_in"] is False
    modes = result["modes"]
    names = ["query@0.0", "query@0.0 stored_context=previous", "query@0.0 stored_context=neighbour"]
    names.append("query@0.0 stored_context=plain")
    assert result["candidates"] == names
    assert modes[names[1]]["candidate"] == {"recompute_ratio": 0.0, "stored_context": "previous"}
    # Behind the whole context before it (these prompts fit the cap) a chunk's stored KV is full prefill's, so the
    # blend is full prefill even recomputing nothing; plain KV is not, and a neighbour is another text again.
    assert abs(modes[names[1]]["kl"]) < 1e-6 and modes[names[1]]["fidelity_f1"] == 1.0
    assert modes[names[0]]["kl"] > 1e-6 and modes[names[2]]["kl"] > 1e-6
    assert modes[names[0]]["kl"] != modes[names[2]]["kl"]
    # plain is what the engine stores: the candidate without the key
    assert modes[names[3]]["kl"] == modes[names[0]]["kl"]


@pytest.mark.parametrize("command", ["calibrate", "lookup", "long-answers"])
def test_ship_refuses_a_run_with_the_lead_in(run_bench, command: str) -> None:
    with pytest.raises(SystemExit, match="drop --lead-in"):
        run_bench(command, "--ship", "--lead-in")

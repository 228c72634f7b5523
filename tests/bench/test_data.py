from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.data import DatasetError, Example, build_prompt, load_dataset, rank_by_retriever, select_examples
from bench.prepared import bench_prompts
from ingest.chunker import encode_chunk_text
from retrieval.config import RetrievalSettings
from retrieval.embedder import Embedder


def test_load_dataset_reads_the_shared_shape(dataset_path: Path) -> None:
    examples = load_dataset(dataset_path)
    assert [e.index for e in examples] == [0, 1]
    assert examples[0].answers == ["Fredville", "the city of Fredville"]
    assert [p.title for p in examples[1].passages] == ["Cheese", "Marvin", "Geese"]
    assert [p.is_gold for p in examples[1].passages] == [False, True, False]


@pytest.mark.parametrize(
    "content",
    ['{"question": "q"}', "[]", '[{"answers": []}]', '[{"question": "q", "ctxs": [{"title": "t"}]}]', "not json"],
)
def test_load_dataset_rejects_other_shapes(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DatasetError):
        load_dataset(path)


def test_select_examples_is_a_seeded_shuffle(tmp_path: Path) -> None:
    path = tmp_path / "many.json"
    path.write_text(
        json.dumps(
            [{"question": f"q{i}", "answers": ["a"], "ctxs": [{"text": f"p{i}"}]} for i in range(10)]
            + [{"question": "no ctxs", "answers": ["a"], "ctxs": []}]
        )
    )
    examples = load_dataset(path)
    first = [e.index for e in select_examples(examples, 4, seed=0)]
    assert first == [e.index for e in select_examples(examples, 4, seed=0)]
    assert first != [e.index for e in select_examples(examples, 4, seed=1)]
    everything = select_examples(examples, None, seed=0)
    assert sorted(e.index for e in everything) == list(range(10))  # the example without passages is left out
    assert [e.index for e in everything[:4]] == first


def test_build_prompt_is_asks_layout(tiny_engine, dataset_path: Path) -> None:
    example = load_dataset(dataset_path)[0]
    tok = tiny_engine.tokenizer
    bp = build_prompt(tiny_engine.prompt, tok, example, num_passages=2)
    ranked = [encode_chunk_text(tok, p.text) for p in example.passages[:2]]
    # File order is the ranking; /ask's builder lays the best chunk out last, nearest the question.
    assert bp.chunk_ids == [ranked[1], ranked[0]] == bp.layout.chunk_ids
    assert bp.layout == tiny_engine.prompt.layout_ranked(ranked, example.question)
    assert bp.answer_ids == tok.encode("Fredville", add_special_tokens=False)


def _cosine_ranking(embedder: Embedder, example: Example) -> list[str]:
    """The titles of an example's passages by cosine similarity to its question, computed here with the
    builtin embedder on what ingest indexes ("title\\ntext")."""
    passages = embedder.embed_passages([f"{p.title}\n{p.text}" for p in example.passages])  # (n, dim)
    scores = passages @ embedder.embed_query(example.question)  # (n,)
    return [example.passages[i].title for i in sorted(range(len(scores)), key=lambda i: -scores[i])]


def test_rank_by_retriever_is_the_servers_ranking(dataset_path: Path) -> None:
    examples = load_dataset(dataset_path)
    embedder = Embedder.from_settings(RetrievalSettings())  # the server's: one load serves both rankings
    ranked = rank_by_retriever(examples, embedder)
    assert [[p.title for p in e.passages] for e in ranked] == [_cosine_ranking(embedder, e) for e in examples]
    # The gold passage ranks first on both questions; nothing else about an example changes.
    assert [e.passages[0].title for e in ranked] == ["Freedonia", "Marvin"]
    for before, after in zip(examples, ranked, strict=True):
        assert (after.index, after.question, after.answers) == (before.index, before.question, before.answers)
        assert sorted(after.passages, key=lambda p: p.title) == sorted(before.passages, key=lambda p: p.title)


def test_bench_prompts_in_retrieval_order_lay_the_best_passage_nearest_the_question(
    tiny_engine, dataset_path: Path
) -> None:
    tok = tiny_engine.tokenizer
    by_file = bench_prompts(tiny_engine, dataset_path, None, 3, with_answers=True)
    by_retriever = bench_prompts(tiny_engine, dataset_path, None, 3, with_answers=True, order="retrieval")
    assert [bp.example.index for bp in by_file] == [bp.example.index for bp in by_retriever]  # the same sample
    for file_bp, retrieved_bp in zip(by_file, by_retriever, strict=True):
        gold = next(p for p in file_bp.example.passages if p.is_gold)
        file_position = file_bp.chunk_ids.index(encode_chunk_text(tok, gold.text))
        assert file_position == 2 - file_bp.example.passages.index(gold)  # file order: wherever the file put it
        assert retrieved_bp.chunk_ids[-1] == encode_chunk_text(tok, gold.text)  # the retriever's best: last
        assert sorted(retrieved_bp.chunk_ids) == sorted(file_bp.chunk_ids)

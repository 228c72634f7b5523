from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.data import DatasetError, build_prompt, load_dataset, select_examples
from ingest.chunker import encode_chunk_text


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

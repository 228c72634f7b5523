"""Benchmark data: question/passages files shaped like ../shared/data/musique_dev.json and nq6_dev.json,
and prompts built from them exactly as /ask builds its prompt.

File shape: a JSON list of `{"question": str, "answers": [str], "ctxs": [{"title", "text", "isgold"?}]}`.
Each passage becomes one chunk (`ingest.chunker.encode_chunk_text` of its text, the ids ingest would
store). Which K passages, in which order: `file` takes the first K in file order as the retrieval ranking
(best first); `retrieval` ranks all of an example's passages with the server's retriever (retrieval/: its
default settings and embedder, each passage indexed as ingest indexes a one-chunk document of that title)
and takes its top K, as /ask would with those passages in its index. Either way the ranking is laid out by
`PromptBuilder.layout_ranked`, the builder /ask uses (best chunk last, nearest the question).

Why both: nq6_dev shuffles the gold passage among the six, so in file order it lands at any prompt position
with equal odds, as if the retriever ranked at random; the server's retriever puts it where its ranking says
(mostly last, nearest the question). A blend loses more when what the question needs is far from it, so the
two orders bound the same prompts from the hard side and from the side users are on.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from engine.prompt import PromptBuilder
    from engine.types import PromptLayout
    from retrieval.embedder import Embedder

PassageOrder = Literal["file", "retrieval"]
PASSAGE_ORDERS: tuple[PassageOrder, ...] = ("file", "retrieval")


class DatasetError(ValueError):
    """The dataset file is missing or not of the expected shape."""


@dataclass(frozen=True)
class Passage:
    title: str
    text: str
    is_gold: bool = False


@dataclass(frozen=True)
class Example:
    index: int  # position in the dataset file
    question: str
    answers: list[str]
    passages: list[Passage]


def _passage(raw: Any, where: str) -> Passage:
    if not isinstance(raw, dict) or not isinstance(raw.get("text"), str):
        raise DatasetError(f"{where}: each ctx needs a 'text' string")
    return Passage(title=str(raw.get("title") or ""), text=raw["text"], is_gold=bool(raw.get("isgold", False)))


def load_dataset(path: Path) -> list[Example]:
    """Every example of a dataset file, in file order."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read dataset: {exc}") from exc
    if not isinstance(raw, list) or not raw:
        raise DatasetError(f"{path}: expected a non-empty JSON list of examples")
    examples = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            raise DatasetError(f"{where}: each example needs a 'question' string")
        answers = item.get("answers") or []
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise DatasetError(f"{where}: 'answers' must be a list of strings")
        ctxs = item.get("ctxs") or []
        if not isinstance(ctxs, list):
            raise DatasetError(f"{where}: 'ctxs' must be a list")
        examples.append(
            Example(
                index=i,
                question=item["question"],
                answers=list(answers),
                passages=[_passage(c, f"{where}.ctxs[{j}]") for j, c in enumerate(ctxs)],
            )
        )
    return examples


def select_examples(examples: list[Example], num_examples: int | None, seed: int) -> list[Example]:
    """`num_examples` examples (all when None), a seeded shuffle so subsets differ by seed but not by run.

    Only examples with at least one passage qualify (a prompt needs context to blend).
    """
    usable = [e for e in examples if e.passages]
    order = list(range(len(usable)))
    random.Random(seed).shuffle(order)
    chosen = [usable[i] for i in order]
    return chosen if num_examples is None else chosen[:num_examples]


def rank_by_retriever(examples: list[Example], embedder: Embedder | None = None) -> list[Example]:
    """Each example with its passages in the server's retrieval ranking for its question (best first).

    An in-memory `Retriever` on the server's default retrieval settings (dense search with the builtin
    embedder unless `embedder` is given) holds one example's passages at a time, each a one-chunk document
    titled as in the file; the ranking is the retriever's own `search` over all of them.
    """
    from retrieval.config import RetrievalSettings
    from retrieval.retriever import Retriever
    from retrieval.types import IndexedChunk

    retriever = Retriever(RetrievalSettings(), embedder=embedder)
    ranked = []
    for example in examples:
        retriever.remove(retriever.chunk_ids())
        chunks = [
            IndexedChunk(chunk_id=j, document_id=f"passage-{j}", text=p.text, title=p.title)
            for j, p in enumerate(example.passages)
        ]
        retriever.add(chunks)
        hits = retriever.search(example.question, top_k=len(chunks))
        ranked.append(replace(example, passages=[example.passages[hit.chunk_id] for hit in hits]))
    return ranked


def passage_chunk_ids(tokenizer: Any, passages: list[Passage]) -> list[list[int]]:
    """The stored token ids of each passage as one chunk, exactly as ingest would produce them."""
    from ingest.chunker import encode_chunk_text

    return [encode_chunk_text(tokenizer, p.text) for p in passages]


@dataclass(frozen=True)
class BenchPrompt:
    """One example turned into the prompt /ask would build for it."""

    example: Example
    chunk_ids: list[list[int]]  # one chunk per passage, in prompt order (layout.chunk_ids)
    layout: PromptLayout
    answer_ids: list[int]  # the first gold answer as the assistant would write it (teacher forcing)


def build_prompt(prompt: PromptBuilder, tokenizer: Any, example: Example, num_passages: int) -> BenchPrompt:
    # The first K passages play the retrieval ranking (best first; module docstring); the layout is /ask's.
    layout = prompt.layout_ranked(passage_chunk_ids(tokenizer, example.passages[:num_passages]), example.question)
    chunk_ids = layout.chunk_ids
    answer = example.answers[0] if example.answers else ""
    # The assistant turn opens with a newline, so the answer's first word carries no leading space.
    answer_ids = list(tokenizer.encode(answer.strip(), add_special_tokens=False))
    return BenchPrompt(example=example, chunk_ids=chunk_ids, layout=layout, answer_ids=answer_ids)

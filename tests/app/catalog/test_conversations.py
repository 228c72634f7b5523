"""The conversation store on SQLite and PostgreSQL (the `catalog` fixture runs each test on both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.catalog import Catalog
from app.catalog.conversations import NewTurn


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Catalog:
    url = f"sqlite:///{tmp_path / 'cat.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    c = Catalog(url)
    yield c
    c.close()


def _turn(q: str, a: str, sources: list[int] | None = None) -> NewTurn:
    return NewTurn(
        question=q,
        answer=a,
        source_chunk_ids=sources or [],
        mode="blend",
        selector="query",
        recompute_ratio=0.15,
        timings={"ttft_ms": 12.5},
        usage={"history_tokens": 0},
    )


def test_turns_are_stored_in_order_with_what_answered_them(catalog: Catalog) -> None:
    store = catalog.conversations
    conv = store.create("key:abc", "  How do I set\na timeout?  ")
    assert conv.title == "How do I set a timeout?" and conv.num_turns == 0
    first = store.add_turn(conv.id, _turn("How do I set a timeout?", "Pass timeout=.", [3, 1]))
    second = store.add_turn(conv.id, _turn("And connect only?", "Timeout(connect=2)."))
    assert (first.index, second.index) == (0, 1)
    turns = store.turns(conv.id)
    assert [(t.index, t.question, t.answer, t.source_chunk_ids) for t in turns] == [
        (0, "How do I set a timeout?", "Pass timeout=.", [3, 1]),
        (1, "And connect only?", "Timeout(connect=2).", []),
    ]
    assert turns[0].mode == "blend" and turns[0].selector == "query" and turns[0].recompute_ratio == 0.15
    assert turns[0].timings == {"ttft_ms": 12.5} and turns[0].usage == {"history_tokens": 0}
    assert store.get(conv.id, "key:abc").num_turns == 2


def test_scoped_to_the_owner(catalog: Catalog) -> None:
    store = catalog.conversations
    mine = store.create("key:abc", "mine")
    anonymous = store.create(None, "anonymous")
    assert store.get(mine.id, "key:other") is None
    assert store.get(mine.id, None) is None
    assert store.get(anonymous.id, None).title == "anonymous"
    assert store.get(anonymous.id, "key:abc") is None
    assert store.delete(mine.id, "key:other") is False
    assert store.get(mine.id, "key:abc") is not None


def test_page_is_newest_first(catalog: Catalog) -> None:
    store = catalog.conversations
    ids = [store.create("o", f"c{i}").id for i in range(3)]
    store.add_turn(ids[0], _turn("q", "a"))  # continued last: now the newest
    page = store.page("o", offset=0, limit=2)
    assert page.total == 3
    assert [c.id for c in page.conversations] == [ids[0], ids[2]]
    assert [c.id for c in store.page("o", offset=2, limit=2).conversations] == [ids[1]]
    assert store.page("someone else").total == 0


def test_delete_removes_turns_and_counts(catalog: Catalog) -> None:
    store = catalog.conversations
    a = store.create(None, "a")
    b = store.create(None, "b")
    store.add_turn(a.id, _turn("q1", "a1"))
    store.add_turn(a.id, _turn("q2", "a2"))
    store.add_turn(b.id, _turn("q", "a"))
    counts = store.counts()
    assert (counts.num_conversations, counts.num_turns) == (2, 3)
    assert store.delete(a.id, None) is True
    assert store.get(a.id, None) is None and store.turns(a.id) == []
    assert store.delete(a.id, None) is False  # deleted: gone for good
    assert store.add_turn(a.id, _turn("late", "answer")) is None  # a turn finishing after the delete
    counts = store.counts()
    assert (counts.num_conversations, counts.num_turns) == (1, 1)

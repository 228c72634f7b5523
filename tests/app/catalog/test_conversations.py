"""The conversation store on SQLite and PostgreSQL (the `catalog` fixture runs each test on both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.catalog import Catalog
from app.catalog.conversations import NewTurn, within


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
    conv = store.create("key:abc", "  How do I set\na timeout?  ", None)
    assert conv.title == "How do I set a timeout?" and conv.num_turns == 0
    first = store.add_turn(conv.id, _turn("How do I set a timeout?", "Pass timeout=.", [3, 1]), None)
    second = store.add_turn(conv.id, _turn("And connect only?", "Timeout(connect=2)."), None)
    assert (first.index, second.index) == (0, 1)
    turns = store.turns(conv.id)
    assert [(t.index, t.question, t.answer, t.source_chunk_ids) for t in turns] == [
        (0, "How do I set a timeout?", "Pass timeout=.", [3, 1]),
        (1, "And connect only?", "Timeout(connect=2).", []),
    ]
    assert turns[0].mode == "blend" and turns[0].selector == "query" and turns[0].recompute_ratio == 0.15
    assert turns[0].timings == {"ttft_ms": 12.5} and turns[0].usage == {"history_tokens": 0}
    assert store.get(conv.id, "key:abc", None).num_turns == 2


def test_scoped_to_the_owner(catalog: Catalog) -> None:
    store = catalog.conversations
    mine = store.create("key:abc", "mine", None)
    anonymous = store.create(None, "anonymous", None)
    assert store.get(mine.id, "key:other", None) is None
    assert store.get(mine.id, None, None) is None
    assert store.get(anonymous.id, None, None).title == "anonymous"
    assert store.get(anonymous.id, "key:abc", None) is None
    assert store.delete(mine.id, "key:other", None) is False
    assert store.get(mine.id, "key:abc", None) is not None


def test_page_is_newest_first(catalog: Catalog) -> None:
    store = catalog.conversations
    ids = [store.create("o", f"c{i}", None).id for i in range(3)]
    store.add_turn(ids[0], _turn("q", "a"), None)  # continued last: now the newest
    page = store.page("o", None, offset=0, limit=2)
    assert page.total == 3
    assert [c.id for c in page.conversations] == [ids[0], ids[2]]
    assert [c.id for c in store.page("o", None, offset=2, limit=2).conversations] == [ids[1]]
    assert store.page("someone else", None).total == 0


def test_delete_removes_turns_and_counts(catalog: Catalog) -> None:
    store = catalog.conversations
    a = store.create(None, "a", None)
    b = store.create(None, "b", None)
    store.add_turn(a.id, _turn("q1", "a1"), None)
    store.add_turn(a.id, _turn("q2", "a2"), None)
    store.add_turn(b.id, _turn("q", "a"), None)
    counts = store.counts()
    assert (counts.num_conversations, counts.num_turns) == (2, 3)
    assert store.delete(a.id, None, None) is True
    assert store.get(a.id, None, None) is None and store.turns(a.id) == []
    assert store.delete(a.id, None, None) is False  # deleted: gone for good
    assert store.add_turn(a.id, _turn("late", "answer"), None) is None  # a turn finishing after the delete
    counts = store.counts()
    assert (counts.num_conversations, counts.num_turns) == (1, 1)


def test_collections_widen_with_each_turn_and_scope_every_read(catalog: Catalog) -> None:
    store = catalog.conversations
    conv = store.create("o", "q", frozenset({"a"}))
    store.add_turn(conv.id, _turn("q", "a"), frozenset({"a"}))
    assert store.get(conv.id, "o", frozenset({"a"})).collections == {"a"}
    store.add_turn(conv.id, _turn("q2", "a2"), frozenset({"b"}))  # a turn over `b`: now over both
    assert store.get(conv.id, "o", frozenset({"a"})) is None
    assert store.get(conv.id, "o", frozenset({"a", "b"})).collections == {"a", "b"}
    assert store.page("o", frozenset({"a"})).total == 0
    assert store.delete(conv.id, "o", frozenset({"b"})) is False
    store.add_turn(conv.id, _turn("q3", "a3"), None)  # a turn over every collection: only "everything" sees it
    assert store.get(conv.id, "o", frozenset({"a", "b", "c"})) is None
    assert store.get(conv.id, "o", None).collections is None
    assert store.page(None, None).total == 0  # no owner: listed to nobody
    assert [within(c, s) for c, s in ((None, None), (None, frozenset()), (frozenset(), frozenset()))] == [
        True,
        False,
        True,
    ]

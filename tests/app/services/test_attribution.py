"""Answer sentences are linked to the source whose distinctive words they share."""

from __future__ import annotations

from app.services.attribution import (
    Citation,
    SourceText,
    UnsupportedIdentifier,
    attribute,
    code_identifiers,
    sentences,
    unsupported_identifiers,
)

SOURCES = [
    SourceText(1, "Quintaro is the capital of the planet Zorblat. Its purple rivers flow into the Silver Sea."),
    SourceText(2, "Every May Quintaro holds a kite festival on the Silver Sea shore."),
    SourceText(3, "Sourdough needs flour, water, salt and a starter."),
]


def test_each_sentence_cites_the_source_it_draws_on() -> None:
    answer = "The capital of Zorblat is Quintaro. A kite festival is held there in May! I am not sure."
    citations = attribute(answer, SOURCES)
    cited = [(answer[c.start : c.end], c.rank) for c in citations]
    assert cited == [
        ("The capital of Zorblat is Quintaro.", 1),
        ("A kite festival is held there in May!", 2),
    ]  # "I am not sure." shares nothing distinctive: no mark rather than a wrong one
    assert all(isinstance(c, Citation) and 0.34 <= c.score <= 1 for c in citations)


def test_words_every_source_has_weigh_little() -> None:
    # "Quintaro" and "Silver Sea" are in sources 1 and 2: a sentence with only those words is not cited
    # to either just by the tie-break.
    answer = "Quintaro lies by the Silver Sea."
    assert [c.rank for c in attribute(answer, SOURCES)] == [1]
    assert attribute("Quintaro and the sea.", SOURCES) == []  # fewer than two shared words


def test_code_blocks_are_not_sentences_and_empty_inputs_give_nothing() -> None:
    answer = "Bake it:\n\n```text\nflour water salt starter. more flour.\n```\n\nSourdough needs a starter and flour."
    spans = sentences(answer)
    assert [answer[a:b] for a, b in spans] == ["Bake it:", "Sourdough needs a starter and flour."]
    assert [(answer[c.start : c.end], c.rank) for c in attribute(answer, SOURCES)] == [
        ("Sourdough needs a starter and flour.", 3)
    ]
    assert attribute("", SOURCES) == [] and attribute("Anything at all here.", []) == []


PYDANTIC = [
    SourceText(
        1,
        "Set `model_config = ConfigDict(extra='forbid')` and a field that is not declared raises a "
        "ValidationError. Extra fields are ignored by default.",
    ),
    SourceText(2, "Use `Field(alias='userName')` to read a field under another name; `m.model_dump()` gives a dict."),
]


def test_code_identifiers_are_backticked_snake_case_dotted_and_called_names() -> None:
    sentence = "Use `Field(field_name=x)` or exclude_if, call Model.model_dump() or json(), e.g. with str and `None`."
    assert [name for _, _, name in code_identifiers(sentence)] == [
        "Field",
        "field_name",
        "exclude_if",
        "Model.model_dump",
        "json",
    ]  # one-letter names (`x`) and "e.g" are too short to tell; `str` and `None` are Python's own
    assert [sentence[a:b] for a, b, _ in code_identifiers(sentence)][:2] == ["Field", "field_name"]
    assert code_identifiers("Extra fields are rejected. Version 2.5 is out.") == []
    assert code_identifiers("See https://docs.pydantic.dev/latest/concepts/json_schema or me@mail.example.org") == []


def test_a_mark_needs_every_identifier_of_its_sentence_in_the_cited_passage() -> None:
    supported = "To reject extra fields, set `model_config = ConfigDict(extra='forbid')` on the model."
    invented = "To reject extra fields, set `exclude_if` on the field."
    assert [(c.rank, c.score) for c in attribute(supported, PYDANTIC)] == [(1, 0.7271)]
    # Its shared words ("reject", "extra", "fields") alone gave it [1] (score 0.413) before the identifier check.
    assert attribute(invented, PYDANTIC) == []
    # A sentence whose identifiers are in another passage that shares enough words goes to that one.
    answer = "A field can be read under another name with `Field(alias='userName')`."
    assert [c.rank for c in attribute(answer, PYDANTIC)] == [2]


def test_identifiers_no_source_contains_are_reported_where_they_stand() -> None:
    answer = (
        "Set `exclude_if` to reject extra fields. Use `Field(field_name='userName')` for aliases; "
        "`user.model_dump()` gives a dict.\n\n```python\nmy_model = Model(my_field=1)\n```\n"
    )
    unsupported = unsupported_identifiers(answer, PYDANTIC)
    assert [(u.identifier, answer[u.start : u.end]) for u in unsupported] == [
        ("exclude_if", "exclude_if"),
        ("field_name", "field_name"),
    ]  # user.model_dump: the attribute is in source 2; the fenced example's own names are not checked
    assert unsupported == [UnsupportedIdentifier(5, 15, "exclude_if"), UnsupportedIdentifier(52, 62, "field_name")]
    assert unsupported_identifiers(answer, []) == []  # no sources: the notice says why, nothing to check


def test_an_answer_whose_names_are_mostly_in_no_source_gets_a_notice() -> None:
    from app.services.attribution import answer_identifiers, invention_notice

    # Over the Pydantic passages, an SQLAlchemy answer: 3 of its 4 distinct names are in no source.
    answer = (
        "Declare it with `relationship(back_populates=x)` and load it with `selectinload`. "
        "Then `Field` works as before; `selectinload` again."
    )
    assert answer_identifiers(answer) == ["relationship", "back_populates", "selectinload", "Field"]
    unsupported = unsupported_identifiers(answer, PYDANTIC)
    assert [u.identifier for u in unsupported] == ["relationship", "back_populates", "selectinload", "selectinload"]
    assert invention_notice(answer, unsupported) == (
        "3 of the 4 code names in this answer are in none of its sources: "
        "it is likely invented, not drawn from your documents"
    )


def test_half_or_one_unsupported_name_is_no_notice() -> None:
    from app.services.attribution import invention_notice

    # Exactly half (exclude_if and field_name of 4 names): not "most".
    half = (
        "Set `exclude_if` to reject extra fields. Use `Field(field_name='userName')` for aliases; "
        "`user.model_dump()` gives a dict."
    )
    assert invention_notice(half, unsupported_identifiers(half, PYDANTIC)) is None
    # One name, and it is unsupported: a single guess is not an invented answer.
    one = "Set `exclude_if` to reject extra fields."
    assert [u.identifier for u in unsupported_identifiers(one, PYDANTIC)] == ["exclude_if"]
    assert invention_notice(one, unsupported_identifiers(one, PYDANTIC)) is None
    # Two of two: the smallest answer that gets it. Names inside a fenced example are not counted.
    two = "Use `exclude_if` with `skip_none`.\n\n```python\nmodel_config = ConfigDict(extra='forbid')\n```\n"
    assert invention_notice(two, unsupported_identifiers(two, PYDANTIC)) == (
        "2 of the 2 code names in this answer are in none of its sources: "
        "it is likely invented, not drawn from your documents"
    )
    assert invention_notice("Quintaro is the capital.", []) is None

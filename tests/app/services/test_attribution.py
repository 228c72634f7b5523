"""Answer sentences are linked to the source whose distinctive words they share."""

from __future__ import annotations

from app.services.attribution import Citation, SourceText, attribute, sentences

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

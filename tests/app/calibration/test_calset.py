"""The generated calibration set: real documentation prose, every fact where its question expects it, and no
text repeated across a prompt's passages (calset-1's shared filler templates made it disagree with held-out
data on Qwen2.5)."""

from __future__ import annotations

from app.calibration.calset import NUM_PASSAGES, describe, make_cases
from app.calibration.prose import MODULES, insert_paragraph, sections


def test_insert_paragraph_goes_between_paragraphs_never_before_the_heading() -> None:
    section = "## a\n\nfirst\n\nsecond"
    assert insert_paragraph(section, "FACT", 0.0) == "## a\n\nFACT\n\nfirst\n\nsecond"
    assert insert_paragraph(section, "FACT", 0.5) == "## a\n\nfirst\n\nFACT\n\nsecond"
    assert insert_paragraph(section, "FACT", 1.0) == "## a\n\nfirst\n\nsecond\n\nFACT"


def test_sections_are_documentation_from_the_listed_modules_and_none_repeats() -> None:
    found = sections()
    assert len(found) >= 20 * NUM_PASSAGES + 4  # the default set never runs out, with a few to spare
    assert len(set(found)) == len(found)
    assert all(s.startswith("## ") and s.split("(")[0][3:].rsplit(".", 1)[0] in MODULES for s in found)
    assert all(len(s) >= 1000 for s in found)
    assert all(">>>" not in s for s in found)  # doctest sessions are dropped
    assert sections() == found  # deterministic


def test_the_set_places_each_fact_where_its_question_expects_it() -> None:
    cases = make_cases()
    assert describe(cases) == "calset-3: 8 lookup, 4 two_hop, 8 followup, 6 passages each"
    assert [c.kind for c in cases] == ["lookup"] * 8 + ["two_hop"] * 4 + ["followup"] * 8
    for case in cases:
        assert len(case.passages) == NUM_PASSAGES
        holders = [p for p in case.passages if case.answer in p]
        if case.kind == "two_hop":
            # passage 1 says who the head is, passage 0 where that person was born: both are needed
            place = case.question.removeprefix("In which city was the head of the ").removesuffix(" born?")
            person = case.passages[1].split(f"The head of the {place} is ")[1].split(".")[0]
            assert f"{person} was born in {case.answer}." in case.passages[0]
            assert all(person not in p for p in case.passages[2:])
        else:
            assert holders == [case.passages[0]]  # the passage that answers is ranked first
        if case.kind == "followup":
            assert case.first_question is not None
            place = case.first_question.removeprefix("Tell me about the ").removesuffix(".")
            assert f"The access code of the {place} is {case.answer}." in case.passages[0]
            # each page ends with its place's profile; the first, third and fifth hold a code, so turn 2 has
            # three to choose from and turn 1 something to tell about every place
            profiles = [p.split("\n\n")[-1] for p in case.passages]
            assert all(p.startswith("The ") and " stands in " in p and " staff work under " in p for p in profiles)
            assert profiles[0].startswith(f"The {place} stands in ")
            assert [("The access code of the " in p) for p in case.passages] == [True, False] * 3


def test_no_passage_shares_a_line_with_another_anywhere_in_the_set() -> None:
    cases = make_cases()
    passages = [p for c in cases for p in c.passages]
    assert len(set(passages)) == len(passages)
    seen: dict[str, int] = {}
    for i, passage in enumerate(passages):
        for line in (raw.strip() for raw in passage.splitlines()):
            if len(line) >= 40:
                assert seen.setdefault(line, i) == i, line
    assert make_cases() == cases  # the same set on every call


def test_the_set_is_the_same_in_another_process() -> None:
    # Object addresses in signatures' default values (`<object object at 0x…>`) once made it differ.
    import hashlib
    import subprocess
    import sys

    script = "import hashlib; from app.calibration.calset import make_cases; "
    script += "print(hashlib.sha256(repr(make_cases()).encode()).hexdigest())"
    here = hashlib.sha256(repr(make_cases()).encode()).hexdigest()
    there = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert there == here

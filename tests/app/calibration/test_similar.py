"""The look-ups among similar chunks (app/calibration/similar.py)."""

from __future__ import annotations

import re

from app.calibration.similar import KINDS, similar_cases


def _value_pattern(answer: str) -> str:
    """The answer's form: each run of digits any digits, each capital any capital, the rest as it is."""
    return re.sub(
        r"(\\d)+", r"\\d+", "".join("\\d" if c.isdigit() else "[A-Z]" if c.isupper() else re.escape(c) for c in answer)
    )


def test_each_case_states_the_asked_value_once_and_the_same_kind_of_value_in_every_other_page() -> None:
    for part in ("tune", "check"):
        cases = similar_cases(part, 20, seed=3)
        assert [c.kind for c in cases] == list(KINDS) * 4
        for case in cases:
            assert 2 <= len(case.docs) <= 6
            texts = [d.text for d in case.docs]
            assert sum(case.answer in t for t in texts) == 1 and case.answer in texts[0]
            # every other page states a value of the same form (same characters' classes, other digits)
            pattern = _value_pattern(case.answer)
            for text in texts[1:]:
                assert re.search(pattern, text), (case.kind, case.answer)


def test_each_page_is_about_its_project_and_the_names_of_a_case_differ_in_both_syllables() -> None:
    for part in ("tune", "check"):
        for case in similar_cases(part, 30, seed=5):
            names = [d.title.split(":")[0].split()[0] for d in case.docs]
            for name, doc in zip(names, case.docs, strict=True):
                assert re.fullmatch(r"[A-Z][a-z]+", name)  # one word
                heading, *paragraphs = doc.text.split("\n\n")
                assert name in heading and all(name in p or name.lower() in p for p in paragraphs), doc.text
                assert 300 <= len(doc.text) <= 700
            assert len({n[:2] for n in names}) == len(names) and len({n[-3:] for n in names}) == len(names)
            if case.kind == "followup":  # the question says "that one"; the earlier turn names the project
                assert names[0] not in case.question and len(case.history) == 1 and names[0] in case.history[0][0]
            else:
                assert case.history == () and (names[0] in case.question or names[0].lower() in case.question)


def test_sixty_cases_and_more_fit_in_one_corpus_per_part() -> None:
    cases = {part: similar_cases(part, 30, seed=0) for part in ("tune", "check")}
    assert sum(len(c) for c in cases.values()) == 60
    for part_cases in cases.values():
        titles = [d.title for c in part_cases for d in c.docs]
        assert len(titles) == len(set(titles))


def test_the_parts_share_no_project_no_template_and_no_prose() -> None:
    tune, check = similar_cases("tune", 24, seed=0), similar_cases("check", 24, seed=0)

    def names(cases: list) -> set[str]:
        return {d.title.split(":")[0] for c in cases for d in c.docs}

    def bodies(cases: list) -> set[str]:
        return {d.text.split("\n\n", 2)[1] for c in cases for d in c.docs}  # the prose section's heading

    assert not names(tune) & names(check)
    assert not bodies(tune) & bodies(check)
    assert not {c.question.split()[0:3] == q.question.split()[0:3] for c in tune for q in check} - {False}
    all_names = [d.title.split(":")[0] for c in tune for d in c.docs]
    assert len(all_names) == len(set(all_names))  # one corpus can hold every case


def test_the_set_is_deterministic() -> None:
    assert similar_cases("check", 8, seed=1) == similar_cases("check", 8, seed=1)
    assert similar_cases("check", 8, seed=1) != similar_cases("check", 8, seed=2)

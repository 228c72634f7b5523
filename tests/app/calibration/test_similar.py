"""The look-ups among similar chunks (app/calibration/similar.py)."""

from __future__ import annotations

import re

import pytest

from app.calibration.similar import KINDS, SEVERAL_KINDS, SimilarDoc, similar_cases


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


# -- the several-values shape ------------------------------------------------------------------------------
def _form(value: str) -> str:
    """A value's form, coarser than `_value_pattern`: each run of digits, capitals or small letters any such run."""
    runs = {"0": r"\d+", "A": "[A-Z]+", "a": "[a-z]+"}

    def run(match: re.Match[str]) -> str:
        c = match.group()[0]
        key = "0" if c.isdigit() else "A" if c.isupper() else "a" if c.islower() else ""
        return runs[key] if key else re.escape(match.group())

    return re.sub(r"\d+|[A-Z]+|[a-z]+|.", run, value)


_LABELS = {
    ("tune", "prose"): ("The access code of project", "Its budget for this year is", "The contact person for project"),
    ("tune", "list"): ("- Room: ", "- Phone extension: ", "- Cost centre: "),
    ("check", "prose"): ("runs under purchase order", "It has a grant of", "programme go to"),
    ("check", "list"): ("- Rack position: ", "- Serial number: ", "- Support renewal: "),
}


def test_the_several_values_shape_generates_these_cases() -> None:
    cases = similar_cases("check", 6, seed=0, shape="several")
    assert [(c.kind, len(c.docs), c.question, c.answer) for c in cases] == [
        ("prose", 2, "Which purchase order does the Kriard programme run under?", "PO 45437"),
        ("list", 5, "In which rack position is the Elisk appliance?", "R47-U39"),
        ("prose", 2, "How large is the grant of the Grourst programme?", "£23,506"),
        ("list", 4, "What is the serial number of the Ulisk appliance?", "R4A341972"),
        ("prose", 4, "Which phone number do questions about the Oralf programme go to?", "+44 20 1786 9938"),
        ("list", 6, "When is the support of the Quiard appliance renewed?", "3 February 2028"),
    ]
    assert cases[1].docs[0] == SimilarDoc(
        title="Elisk appliance: inventory record",
        text="# Elisk appliance\n\nThe Elisk appliance was installed in Dublin in 2014. The Elisk appliance stores "
        "backups for the payments team.\n\nInventory of the Elisk appliance:\n\n- Rack position: R47-U39\n- Serial "
        "number: A5Y385405\n- Support renewal: 10 June 2028\n\nOnly the payments team may open the case of the Elisk "
        "appliance. The Elisk appliance is monitored around the clock.",
    )
    assert {(c.shape, c.history) for c in cases} == {("several", ())}
    assert [c.question for c in similar_cases("tune", 3, seed=0, shape="several")] == [
        "What is the access code of project Tuwyn?",
        "Which room is project Luzar in?",
        "What is the budget of project Tugrim this year?",
    ]


def test_every_page_of_a_several_values_case_holds_the_three_labels_and_the_asked_value_stands_once() -> None:
    for part in ("tune", "check"):
        cases = similar_cases(part, 24, seed=3, shape="several")
        assert [c.kind for c in cases] == list(SEVERAL_KINDS) * 12
        for i, case in enumerate(cases):
            labels = _LABELS[(part, case.kind)]
            asked = labels[(i // 2) % 3]
            texts = [d.text for d in case.docs]
            assert 2 <= len(texts) <= 6 and all(300 <= len(t) <= 700 for t in texts)
            assert all(label in t for t in texts for label in labels)
            assert sum(case.answer in t for t in texts) == 1
            # the asked value follows the asked label on the asked page, and each other page has one of its form
            assert 0 < texts[0].index(case.answer) - texts[0].index(asked) <= len(asked) + 20
            for text in texts[1:]:
                assert re.search(_form(case.answer), text), (case.kind, case.answer)
            name = case.docs[0].title.split(":")[0].split()[0]
            assert name in case.question and name in texts[0].split("\n\n")[0]


def test_the_several_values_parts_share_no_name_template_or_form_and_no_name_with_the_one_value_shape() -> None:
    def names(cases: list) -> set[str]:
        return {d.title.split(":")[0].split()[0] for c in cases for d in c.docs}

    several = {part: similar_cases(part, 24, seed=0, shape="several") for part in ("tune", "check")}
    one = {part: similar_cases(part, 24, seed=0) for part in ("tune", "check")}
    assert not names(several["tune"]) & names(several["check"])
    assert not (names(several["tune"]) | names(several["check"])) & (names(one["tune"]) | names(one["check"]))
    for part_cases in several.values():  # one corpus per part holds all its cases
        titles = [d.title for c in part_cases for d in c.docs]
        assert len(titles) == len(set(titles))
    tune_forms, check_forms = ({_form(c.answer) for c in several[part]} for part in ("tune", "check"))
    assert (len(tune_forms), len(check_forms)) == (5, 6)  # a room (C-138) and a cost centre (CC-6171) look alike
    assert not tune_forms & check_forms
    assert not {c.docs[0].title.split(": ")[1] for c in several["tune"]} & {
        c.docs[0].title.split(": ")[1] for c in several["check"]
    }
    assert similar_cases("check", 8, seed=1, shape="several") == similar_cases("check", 8, seed=1, shape="several")
    with pytest.raises(ValueError, match="shape must be 'one' or 'several'"):
        similar_cases("check", 2, shape="many")  # type: ignore[arg-type]

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
        cases = similar_cases(part, 16, seed=3)
        assert [c.kind for c in cases] == list(KINDS) * 4
        for case in cases:
            assert 2 <= len(case.docs) <= 6
            texts = [d.text for d in case.docs]
            assert sum(case.answer in t for t in texts) == 1 and case.answer in texts[0]
            # every other page states a value of the same form (same characters' classes, other digits)
            pattern = _value_pattern(case.answer)
            for text in texts[1:]:
                assert re.search(pattern, text), (case.kind, case.answer)


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

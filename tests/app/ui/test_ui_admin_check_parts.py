"""The serving card's check parts on the admin page, in headless chromium: each part's state in words, a part below
today's target with what it misses (app/calibration/check_parts.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from apitools import LiveServer

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000


def _part(name: str, state: str, differs_in: list[str] | None = None, misses: list[str] | None = None) -> dict:
    return {
        "name": name,
        "title": name,
        "state": state,
        "summary": None if state == "not recorded" else "figures",
        "differs_in": differs_in or [],
        "misses": misses or [],
    }


PARTS = [
    _part("similar_check", "met"),
    _part("similar_several_check", "other settings", differs_in=["recompute_ratio"]),
    _part("followups_check", "not recorded"),
    _part(
        "heldout_check",
        "below target",
        misses=["gold-answer F1 0.453, 0.060 below full prefill's 0.514 > 0.03", "f1_full not recorded"],
    ),
    _part("long_answers_check", "met"),
]


def test_the_serving_card_says_which_check_parts_meet_todays_target(ui_server: LiveServer, page: Any) -> None:
    def with_parts(route: Any) -> None:
        # The server's own /api/stats, its record's check parts replaced by one part in each state.
        stats = route.fetch().json()
        assert stats["blend_settings"] is not None
        stats["blend_settings"]["check_parts"] = PARTS
        route.fulfill(status=200, content_type="application/json", body=json.dumps(stats))

    page.route("**/api/stats", with_parts)
    page.goto(f"{ui_server.url}/admin")
    page.wait_for_selector("#card-serving tr", timeout=TIMEOUT_MS)
    serving = dict(
        page.eval_on_selector_all(
            "#card-serving tr", "trs => trs.map((tr) => [...tr.children].map((td) => td.textContent))"
        )
    )
    assert serving["check parts"] == (
        "similar pages met · several values run on other recompute_ratio · follow-ups not recorded · held-out "
        "below today's target (gold-answer F1 0.453, 0.060 below full prefill's 0.514 > 0.03; f1_full not "
        "recorded) · long answers met"
    )

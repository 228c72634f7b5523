"""`bench followup` on the real MiniLM embedder (float32): the trial's failing session and the figures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_follow_ups_stay_on_the_conversations_page(tmp_path: Path) -> None:
    from bench.followup import main

    out = tmp_path / "followup.json"
    assert main(argparse.Namespace(top_k=None, embed_dtype="float32", out=out)) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert (result["num_sessions"], result["top_k"], result["embed_dtype"]) == (10, 6, "float32")
    top3 = {m: [t["in_top3"] for t in r["per_turn"]] for m, r in result["methods"].items()}
    # The questions alone lose the subject by turn 3; the previous turn's sources keep it.
    assert top3["off"][1] < 9 and top3["questions"][2] < 9
    assert top3["concat"][0] == 10 and min(top3["concat"][1:]) >= 9
    # The trial's session: "Show it with a class instead." found no middleware page from the questions alone.
    middleware = [s for s in result["methods"]["questions"]["sessions"] if s[0]["page"] == "middleware"][0]
    assert "middleware" not in middleware[2]["retrieved"][:3]
    middleware = [s for s in result["methods"]["concat"]["sessions"] if s[0]["page"] == "middleware"][0]
    assert [t["in_top3"] for t in middleware] == [True, True, True]
    # A follow-up that names a new subject still moves to it.
    assert result["methods"]["concat"]["switches"]["per_turn"][1]["in_top3"] == 5

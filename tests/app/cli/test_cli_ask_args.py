"""`blendrag ask` checks its arguments with its own type (app/cli/ask.py), never the HTTP bodies, and with
the same limits as POST /ask."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.api.schemas import AskIn
from app.cli.ask import _ask_args


def test_the_cli_imports_nothing_of_the_http_api(tmp_path: Path) -> None:
    code = (
        "import sys; from app.cli import main; "
        "code = main(['ask', 'q', '--ratio', '2', '--data-dir', sys.argv[1]]); "
        "print(code, sorted(m for m in sys.modules if m == 'app.api' or m.startswith('app.api.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env={**os.environ, "BLENDRAG_URL": ""},
        timeout=120,
    )
    assert done.stdout.strip() == "2 []", done.stderr
    assert done.stderr == "error: --ratio: Input should be less than or equal to 1\n"


def _constraints(schema: dict) -> dict:
    """A property's limits, whichever branch of `anyOf` (the optional ones are `X | None`) holds them."""
    keys = ("minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength", "pattern", "enum", "minItems")
    found = {k: v for k, v in schema.items() if k in keys}
    for branch in schema.get("anyOf", []):
        found |= {k: v for k, v in branch.items() if k in keys}
        if "items" in branch:
            found |= {f"items.{k}": v for k, v in _constraints(branch["items"]).items()}
    return found


def test_its_limits_are_those_of_post_ask() -> None:
    cli = _ask_args().model_json_schema()
    http = AskIn.model_json_schema()
    defs = {**http.get("$defs", {}), **cli.get("$defs", {})}

    def resolved(prop: dict) -> dict:
        return defs[prop["$ref"].split("/")[-1]] if "$ref" in prop else prop

    for name, prop in cli["properties"].items():
        ours, theirs = _constraints(resolved(prop)), _constraints(resolved(http["properties"][name]))
        theirs.pop("minItems", None)  # argparse's repeated --collection is never an empty list
        if name == "question":  # POST /ask documents its not-blank rule in the schema; both check it
            theirs = {k: v for k, v in theirs.items() if k == "maxLength"}
        assert ours == theirs, name

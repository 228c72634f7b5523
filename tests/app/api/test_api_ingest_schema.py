"""`POST /ingest` as its spec says: Schemathesis on the route alone, multipart and JSON, with more cases than
the whole-spec run (a schema-valid body is accepted, a schema-invalid one refused with a documented 4xx), and
the multipart cases issue 54 found accepted against the spec.

A "schema-violating request accepted" is checked once more against what was sent: a form field is text, so
turning the `tags` or `collection` string into a number or boolean sends the bytes of a valid string ("0",
"true"), and a null is no part at all. The body as sent is validated against the route's schema; only when it
is valid (the generator meant to break it and did not) is the report set aside. Every other report counts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import fuzz_settings, server_settings

from app.main import create_app

schemathesis = pytest.importorskip("schemathesis", reason="pip install -e '.[dev]' (schemathesis)")

_SCALE = float(os.environ.get("BLENDRAG_SCHEMATHESIS_SCALE", "1"))
EXAMPLES = max(1, int(40 * _SCALE))


@pytest.fixture(scope="module")
def ingest_operation(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Any]:
    from schemathesis.python import asgi

    settings = server_settings(tmp_path_factory.mktemp("ingest-schema") / "data", tiny_llama_dir)
    app = create_app(settings, load_in_background=False)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    content = app.openapi()["paths"]["/ingest"]["post"]["requestBody"]["content"]
    try:
        yield schema["/ingest"]["POST"], {media_type: c["schema"] for media_type, c in content.items()}
    finally:
        asgi.shutdown_lifespans()


def _as_sent(case: Any) -> Any:
    """The body as the wire carries it: multipart text fields as text (a null or an empty list: no part; a list
    of one: one part), files as strings."""
    body = case.body
    if not (getattr(case, "media_type", "") or "").startswith("multipart/") or not isinstance(body, dict):
        return body
    sent: dict[str, Any] = {}
    for name, value in body.items():
        if name in ("tags", "collection"):
            if isinstance(value, list) and len(value) <= 1:  # one part per item: none, or just one
                value = value[0] if value else None
            if value is None:
                continue
            if not isinstance(value, str | list):
                value = json.dumps(value) if isinstance(value, bool | dict) else str(value)
        elif name == "files":
            value = ["" for _ in value] if isinstance(value, list) else ""
        sent[name] = value
    return sent


def _valid_as_sent(case: Any, schema: dict[str, Any], failure: str) -> bool:
    """A "violating request accepted" whose body, as sent, the schema accepts (see the module docstring)."""
    import jsonschema_rs

    if "Schema-violating request accepted" not in failure:
        return False
    return jsonschema_rs.validator_for(schema).is_valid(_as_sent(case))


def _hunt(operation: Any, mode: Any, media_type: str, schemas: dict[str, dict[str, Any]]) -> tuple[int, dict[str, str]]:
    from hypothesis import given

    failures: dict[str, str] = {}
    num_cases = 0

    @given(case=operation.as_strategy(generation_mode=mode, media_type=media_type))
    @fuzz_settings(EXAMPLES)
    def run(case: Any) -> None:
        nonlocal num_cases
        num_cases += 1
        response = case.call()
        try:
            case.validate_response(response)
        except (AssertionError, BaseExceptionGroup) as exc:
            if _valid_as_sent(case, schemas[case.media_type], str(exc)):
                return
            first = next((line for line in str(exc).splitlines() if line.startswith("- ")), str(exc)[:80])
            failures.setdefault(first, f"{response.status_code} {response.text[:300]}\n{str(exc)[:1500]}")

    run()
    return num_cases, failures


@pytest.mark.parametrize("media_type", ["multipart/form-data", "application/json"])
def test_schemathesis_finds_no_schema_violation_on_ingest(ingest_operation: Any, media_type: str) -> None:
    from schemathesis import GenerationMode

    logging.getLogger("app").setLevel(logging.CRITICAL)
    operation, schemas = ingest_operation
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        num_cases, failures = _hunt(operation, mode, media_type, schemas)
        assert num_cases >= EXAMPLES // 2, (mode, num_cases)
        assert failures == {}, f"{mode.value} {media_type}:\n" + "\n\n".join(f"{k}: {v}" for k, v in failures.items())


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


def test_the_multipart_cases_issue_54_found(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """What the spec says of them, the route does."""
    from apitools import wait_for_job
    from fastapi.testclient import TestClient

    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        # Neither files nor documents: the spec's `not` (no files and no documents) refuses it, as the route does.
        bare = client.post("/ingest", files=[("tags", (None, "a,b"))])
        assert bare.status_code == 422, bare.text
        # Files without documents, and collection "0" (a name may start with a digit): valid, accepted.
        zero = client.post("/ingest", files=[("files", ("zero.txt", b"Zero text.")), ("collection", (None, "0"))])
        assert zero.status_code == 202, zero.text
        assert wait_for_job(client, zero.json()["job_id"])["status"] == "succeeded"
        # A PNG named .txt: the name is valid, so it is accepted, and its job says what the bytes are.
        png = client.post("/ingest", files=[("files", ("notes.txt", PNG))])
        assert png.status_code == 202, png.text
        job = wait_for_job(client, png.json()["job_id"])
        assert job["status"] == "failed"
        assert [(e["code"], e["error"]) for e in job["errors"]] == [
            ("unreadable_document", "file looks binary (NUL bytes), not text")
        ]

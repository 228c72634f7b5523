"""Schemathesis over the whole OpenAPI spec, in-process (ASGI, no network): no 500, no schema violation.

Every operation gets a bounded number of generated cases, schema-valid (positive) and schema-invalid
(negative), and every response must pass Schemathesis' checks: no 5xx, a documented status code, content
type and body matching the spec (Server-Sent Events event by event), valid input accepted and invalid input
refused. /ask and /v1 run on the tiny random model with at most MAX_TOKENS tokens per answer.

Multipart `/ingest` is held to the same rule: its spec says which file names a part may carry (the
Content-Disposition pattern of `encoding.files`) and that `documents` parts are JSON documents, so a
schema-valid form is accepted.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import CORPUS, fuzz_settings, server_settings

from app.main import create_app

schemathesis = pytest.importorskip("schemathesis", reason="pip install -e '.[dev]' (schemathesis)")

# Cases per operation; BLENDRAG_SCHEMATHESIS_SCALE=5 runs five times as many (a longer hunt, not for CI).
_SCALE = float(os.environ.get("BLENDRAG_SCHEMATHESIS_SCALE", "1"))
POSITIVE_EXAMPLES = max(1, int(15 * _SCALE))
NEGATIVE_EXAMPLES = max(1, int(10 * _SCALE))
MAX_TOKENS = 4
LLM_PATHS = ("/ask", "/v1/chat/completions")


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Any]:
    from schemathesis.python import asgi

    settings = server_settings(
        tmp_path_factory.mktemp("schemathesis") / "data",
        tiny_llama_dir,
        engine={"max_new_tokens": MAX_TOKENS, "max_queue": 64},
        server={"ask_rate_per_minute": None},
    )  # 429s would hide what lies behind
    app = create_app(settings, load_in_background=False)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)  # starts the app's lifespan (models load)
    with asgi.get_client(app) as client:
        accepted = client.post("/ingest", json={"documents": CORPUS})
        assert accepted.status_code == 202, accepted.text
    try:
        yield schema
    finally:
        asgi.shutdown_lifespans()


def _bounded(case: Any) -> None:
    """Short answers on the LLM routes: the spec allows 4,096 tokens, the test wants seconds. A value past
    the spec's maximum is left alone: it is what a negative case is about, and must still be refused."""
    if case.path in LLM_PATHS and isinstance(case.body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and MAX_TOKENS < value <= 4096:
                case.body[key] = MAX_TOKENS


def _same_on_the_wire(case: Any, failure: str) -> bool:
    """Multipart "negative" cases that are valid on the wire. A form field is text: turning the `tags` or
    `collection` string into a number or boolean sends the same bytes as a valid string ("3", "true"), and
    a null is no part at all (the default). Only these mutations are excused; every other multipart
    violation still counts."""
    media_type = getattr(case, "media_type", "") or ""
    if not media_type.startswith("multipart/") or "Schema-violating request accepted" not in failure:
        return False
    # (The spec says "files or documents" as `not` (neither), no longer as an anyOf whose broken branch the other
    # still satisfied; tests/app/api/test_api_ingest_schema.py hunts /ingest alone, with more cases.)
    return "violates `type` at /properties/tags" in failure or "violates `type` at /properties/collection" in failure


class Findings:
    def __init__(self) -> None:
        self.cases: collections.Counter[str] = collections.Counter()
        self.server_errors: list[str] = []
        self.failures: dict[tuple[str, str], str] = {}


def _hunt(operation: Any, mode: Any, examples: int, findings: Findings) -> None:
    """Run `examples` generated cases of one operation in one mode, recording what went wrong."""
    from hypothesis import given

    @given(case=operation.as_strategy(generation_mode=mode))
    @fuzz_settings(examples)
    def run(case: Any) -> None:
        _bounded(case)
        findings.cases[mode.value] += 1
        try:
            response = case.call()
        except Exception as exc:  # an exception the app did not handle: a 500 for a real client
            findings.server_errors.append(f"{operation.label} raised {type(exc).__name__}: {exc}")
            return
        if response.status_code >= 500:
            findings.server_errors.append(f"{operation.label} {response.status_code}: {response.text[:200]}")
        try:
            case.validate_response(response)
        except (AssertionError, BaseExceptionGroup) as exc:
            if _same_on_the_wire(case, str(exc)):
                return
            first = next((line for line in str(exc).splitlines() if line.startswith("- ")), str(exc)[:80])
            findings.failures.setdefault((operation.label, first), str(exc)[:1500])

    run()


def test_schemathesis_finds_no_server_error_and_no_schema_violation(api_schema: Any) -> None:
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    logging.getLogger("app").setLevel(logging.CRITICAL)  # generated garbage makes services log loudly
    findings = Findings()
    for result in api_schema.get_all_operations():
        operation = result.ok()
        for mode, examples in (
            (GenerationMode.POSITIVE, POSITIVE_EXAMPLES),
            (GenerationMode.NEGATIVE, NEGATIVE_EXAMPLES),
        ):
            try:
                _hunt(operation, mode, examples, findings)
            except Unsatisfiable:  # nothing to make invalid (an operation without parameters or body)
                assert mode == GenerationMode.NEGATIVE, operation.label

    cases = findings.cases
    total = cases["positive"] + cases["negative"]
    summary = (
        f"schemathesis: {total} cases ({dict(cases)}), {len(findings.server_errors)} 5xx, "
        f"{len(findings.failures)} failures"
    )
    print(summary)  # noqa: T201 (the count the report quotes; shown with pytest -s)
    assert total >= 15 * (POSITIVE_EXAMPLES // 2)  # every operation was exercised
    assert findings.server_errors == []
    assert findings.failures == {}, "\n\n".join(f"{k}: {v}" for k, v in findings.failures.items())

"""Schemathesis with hostile text, then a restart and `doctor`: what any client may send never bricks the
data dir.

Every generated string (body values, query and path parameters) gets line and paragraph separators
(U+2028, U+2029, U+0085, CR, VT, FF, the information separators), NUL, zero-width and bidi characters,
combining marks and astral characters inserted at a drawn position, and in some cases a lone surrogate
(which JSON can carry as an escape). No answer may be a 5xx or break the spec's response schemas;
afterwards the server must start again on the same data dir with its index read back whole and holding
exactly the catalog's ready chunks, and doctor must report no problem. Bounded: a few cases per
operation (well under a minute).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from apitools import server_settings
from fastapi.testclient import TestClient

from app.build import build_services
from app.main import create_app

schemathesis = pytest.importorskip("schemathesis", reason="pip install -e '.[dev]' (schemathesis)")

HOSTILE = [
    "\u2028",
    "\u2029",
    "\x85",
    "\r",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1e",
    "\x00",
    "\ufeff",
    "\u200b",
    "\u202e",
    "e\u0301",
    "\U0001f600",
]
# Lone surrogates make a whole request a 4xx: put into one string of one case in four, so that most
# generated documents are stored, separators and all, for the restart to read back.
SURROGATES = ["\ud800", "\udfff"]
EXAMPLES = 4  # per operation
INGEST_EXAMPLES = 12
MAX_TOKENS = 2


def _hostile(draw: Any, value: Any) -> Any:
    """`value` with hostile characters inserted into every string it holds (dict keys left as they are)."""
    from hypothesis import strategies as st

    if isinstance(value, str):
        at = draw(st.integers(0, len(value)))
        extra = "".join(draw(st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=3)))
        return value[:at] + extra + value[at:]
    if isinstance(value, dict):
        return {k: _hostile(draw, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hostile(draw, v) for v in value]
    return value


def _with_surrogate(value: Any, surrogate: str) -> tuple[Any, bool]:
    """`value` with `surrogate` appended to its first string (depth first); whether one was found."""
    if isinstance(value, str):
        return value + surrogate, True
    items = (
        list(value.items()) if isinstance(value, dict) else list(enumerate(value)) if isinstance(value, list) else []
    )
    for key, item in items:
        changed, done = _with_surrogate(item, surrogate)
        if done:
            value[key] = changed
            return value, True
    return value, False


def _wait_idle(client: TestClient, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while any(j["status"] in ("queued", "running") for j in client.get("/ingest/jobs?limit=100").json()["jobs"]):
        assert time.monotonic() < deadline, "ingest jobs did not finish"
        time.sleep(0.1)


class _Findings:
    def __init__(self) -> None:
        self.num_cases = 0
        self.server_errors: list[str] = []
        self.failures: dict[tuple[str, str], str] = {}


def _hunt(operation: Any, findings: _Findings) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE), data=st.data())
    @settings(
        max_examples=INGEST_EXAMPLES if operation.label == "POST /ingest" else EXAMPLES,
        deadline=None,
        database=None,
        # The same cases every run (CI must not fail by chance); BLENDRAG_FUZZ_RANDOM=1 explores new ones.
        derandomize=not os.environ.get("BLENDRAG_FUZZ_RANDOM"),
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any, data: Any) -> None:
        if isinstance(case.body, dict | list):
            case.body = _hostile(data.draw, case.body)
            if data.draw(st.integers(0, 3)) == 0:
                case.body, _ = _with_surrogate(case.body, data.draw(st.sampled_from(SURROGATES)))
            if isinstance(case.body, dict) and "max_tokens" in case.body:
                case.body["max_tokens"] = MAX_TOKENS
        for where in ("query", "path_parameters"):
            if getattr(case, where):
                setattr(case, where, _hostile(data.draw, getattr(case, where)))
        findings.num_cases += 1
        try:
            response = case.call()
        except UnicodeEncodeError:
            return  # a lone surrogate the client itself cannot put in a URL or form
        except Exception as exc:  # unhandled in the app: a 500 for a real client
            findings.server_errors.append(f"{operation.label} raised {type(exc).__name__}: {exc}")
            return
        if response.status_code >= 500:
            findings.server_errors.append(f"{operation.label} {response.status_code}: {response.text[:200]}")
        try:
            # The inserted characters may break a limit (length, blank, valid Unicode): a 4xx is fine.
            case.validate_response(response, excluded_checks=[positive_data_acceptance])
        except (AssertionError, BaseExceptionGroup) as exc:
            first = next((ln for ln in str(exc).splitlines() if ln.startswith("- ")), str(exc)[:80])
            findings.failures.setdefault((operation.label, first), str(exc)[:1500])

    run()


def test_hostile_unicode_then_restart_and_doctor(tmp_path: Path, tiny_llama_dir: Path) -> None:
    from schemathesis.python import asgi

    from app.services.doctor import run_doctor

    logging.getLogger("app").setLevel(logging.CRITICAL)
    config = server_settings(tmp_path / "data", tiny_llama_dir, engine={"max_new_tokens": MAX_TOKENS})
    app = create_app(config, load_in_background=False)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    findings = _Findings()
    try:
        for result in schema.get_all_operations():
            _hunt(result.ok(), findings)
        with asgi.get_client(app) as client:  # let the generated ingests finish before stopping
            _wait_idle(client)
    finally:
        asgi.shutdown_lifespans()
    assert findings.server_errors == []
    assert findings.failures == {}, "\n\n".join(f"{k}: {v}" for k, v in findings.failures.items())
    assert findings.num_cases >= EXAMPLES * 10

    with TestClient(create_app(config, load_in_background=False)) as client:  # the restart
        assert client.get("/ready").status_code == 200, client.get("/ready").text
        num_ready = client.get("/documents", params={"status": "ready"}).json()["total"]
        assert num_ready >= 1  # generated documents carrying the hostile characters were stored
        num_indexed = client.get("/api/index").json()["chunks"]
        services = client.app.state.blendrag.services  # type: ignore[attr-defined]
        assert num_indexed == len(services.catalog.all_ready_chunk_ids())
        assert getattr(services.retriever, "repair_note", None) is None  # the snapshot read back whole
    services = build_services(config, {"doctor", "ingest"})
    try:
        report = run_doctor(services.doctor_parts(), repair=False)
    finally:
        services.close()
    assert (report.problems, report.index_repair_note, report.num_documents >= num_ready) == (0, None, True)

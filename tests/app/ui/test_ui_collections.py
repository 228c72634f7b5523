"""Collections and keys in the browser: the admin page's collections and keys tables (create a key and see
its secret once, revoke, delete a collection after confirming), and the chat page asking for a key when the
server wants one, at desktop width and at 390 px."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from apitools import BYPASS_CSP, LiveServer, server_settings, wait_for_job

from app.main import create_app

pytestmark = pytest.mark.browser

ADMIN_KEY = "ui-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TIMEOUT_MS = 60_000
DOCS = {
    "team-a": {"title": "Zorblat report A", "text": "Quintaro is the capital of Zorblat. A: kites in May."},
    "team-b": {"title": "Zorblat notes B", "text": "Quintaro is the capital of Zorblat. B: purple rivers."},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[LiveServer]:
    settings = server_settings(
        tmp_path_factory.mktemp("ui-keys") / "data",
        tiny_llama_dir,
        server={"api_key": ADMIN_KEY},
        engine={"max_new_tokens": 4},
    )
    with LiveServer(create_app(settings, load_in_background=False)) as live:
        with httpx.Client(base_url=live.url, timeout=60, headers=ADMIN) as http:
            for collection, doc in DOCS.items():
                accepted = http.post("/ingest", json={"documents": [doc], "collection": collection}).json()
                assert wait_for_job(http, accepted["job_id"], headers=ADMIN)["status"] == "succeeded"
        yield live


@pytest.mark.parametrize("width", [1280, 390])
def test_admin_page_manages_collections_and_keys(server: LiveServer, browser: Any, shot: Any, width: int) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900}, **BYPASS_CSP)
    context.add_init_script(f"localStorage.setItem('blendrag.apiKey', '{ADMIN_KEY}')")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{server.url}/admin")
        page.wait_for_selector("tr[data-collection='team-b']", timeout=TIMEOUT_MS)
        row = page.inner_text("tr[data-collection='team-a']")
        assert "team-a" in row and "100% · 1 fresh" in row
        page.wait_for_selector("#keys-panel:not([hidden])", timeout=TIMEOUT_MS)
        name = f"team B at {width}"
        page.fill("#key-name", name)
        page.fill("#key-collections", "team-b")
        page.click("#key-create")
        page.wait_for_selector("#key-secret:not([hidden])", timeout=TIMEOUT_MS)
        secret = page.inner_text("#key-secret-value")
        assert secret.startswith("brk_")
        page.wait_for_function(
            f"[...document.querySelectorAll('#keys-body tr')].some(r => r.textContent.includes({name!r}))",
            timeout=TIMEOUT_MS,
        )
        key_row = page.locator("#keys-body tr", has_text=name)
        assert "team-b" in key_row.inner_text() and "never" in key_row.inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing sticks out sideways
        shot(page, f"admin-collections-keys-{width}")
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {secret}"}) as http:
            assert [d["title"] for d in http.get("/documents").json()["documents"]] == ["Zorblat notes B"]
            key_row.locator("[data-action=revoke]").click()
            assert key_row.locator("[data-action=revoke]").inner_text() == "Confirm"
            key_row.locator("[data-action=revoke]").click()
            page.wait_for_function(
                f"![...document.querySelectorAll('#keys-body tr')].some(r => r.textContent.includes({name!r}))",
                timeout=TIMEOUT_MS,
            )
            assert http.get("/documents").status_code == 401
    finally:
        context.close()
    assert errors == []


def test_deleting_a_collection_needs_a_confirming_click(server: LiveServer, page: Any) -> None:
    with httpx.Client(base_url=server.url, timeout=60, headers=ADMIN) as http:
        accepted = http.post(
            "/ingest", json={"documents": [{"title": "Old", "text": "An old note."}], "collection": "old"}
        ).json()
        assert wait_for_job(http, accepted["job_id"], headers=ADMIN)["status"] == "succeeded"
    page.add_init_script(f"localStorage.setItem('blendrag.apiKey', '{ADMIN_KEY}')")
    page.goto(f"{server.url}/admin")
    button = page.locator("tr[data-collection='old'] [data-action=delete]")
    button.wait_for(timeout=TIMEOUT_MS)
    button.click()
    assert button.inner_text() == "Confirm"
    with httpx.Client(base_url=server.url, headers=ADMIN) as http:
        assert [c["name"] for c in http.get("/collections").json()["collections"]] == ["old", "team-a", "team-b"]
        button.click()
        page.wait_for_selector("tr[data-collection='old']", state="detached", timeout=TIMEOUT_MS)
        assert [c["name"] for c in http.get("/collections").json()["collections"]] == ["team-a", "team-b"]


@pytest.mark.parametrize("width", [1280, 390])
def test_chat_asks_for_a_key_and_keeps_it_for_the_session(
    server: LiveServer, browser: Any, shot: Any, width: int
) -> None:
    with httpx.Client(base_url=server.url, headers=ADMIN) as http:
        made = http.post("/admin/keys", json={"name": f"chat {width}", "collections": ["team-a"]}).json()
    context = browser.new_context(viewport={"width": width, "height": 900}, **BYPASS_CSP)
    page = context.new_page()
    try:
        page.goto(f"{server.url}/")
        page.wait_for_selector("#keybar:not([hidden])", timeout=TIMEOUT_MS)  # /api/defaults answered 401
        shot(page, f"chat-key-needed-{width}")
        page.fill("#api-key", made["key"])
        page.click("#key-save")
        page.wait_for_selector("#keybar", state="hidden")
        assert page.evaluate("sessionStorage.getItem('blendrag.apiKey')") == made["key"]
        assert page.evaluate("localStorage.getItem('blendrag.apiKey')") is None
        page.wait_for_function("document.getElementById('ask-form').dataset.defaults === 'server'", timeout=TIMEOUT_MS)
        page.fill("#question", "What is the capital of Zorblat?")
        page.click("#ask-btn")
        page.wait_for_selector(".turn[data-state='done']", timeout=TIMEOUT_MS)
        sources = page.inner_text(".turn .sources")
        assert "Zorblat report A" in sources and "Zorblat notes B" not in sources
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        shot(page, f"chat-with-key-{width}")
    finally:
        context.close()


@pytest.mark.parametrize("width", [1280, 390])
def test_chat_says_a_wrong_key_was_refused(server: LiveServer, browser: Any, shot: Any, width: int) -> None:
    """The trial: a wrong key cleared the field and showed the key bar again with no word of why."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{server.url}/")
        page.wait_for_selector("#keybar:not([hidden])", timeout=TIMEOUT_MS)
        assert page.is_hidden("[data-testid=key-refused]")  # no key entered yet: nothing was refused
        page.fill("#api-key", "brk_not-a-real-key")
        page.click("#key-save")
        page.wait_for_selector("[data-testid=key-refused]:not([hidden])", timeout=TIMEOUT_MS)
        assert page.inner_text("[data-testid=key-refused]") == (
            "The server refused this key: check it and enter it again."
        )
        assert page.is_visible("#keybar") and page.evaluate("sessionStorage.getItem('blendrag.apiKey')") is None
        box = page.eval_on_selector("[data-testid=key-refused]", "e => e.getBoundingClientRect().right")
        assert box <= width
        shot(page, f"chat-key-refused-{width}")
    finally:
        context.close()


@pytest.mark.parametrize("width", [1280, 390])
def test_admin_tables_and_cards_fit_their_panels(server: LiveServer, browser: Any, shot: Any, width: int) -> None:
    """The trial: "history_memory1.9 MiB" ran together, the collections table's Delete buttons were clipped
    at the panel's edge, and at 390 px Delete / Revoke / "Last used" were off-screen to the right."""
    with httpx.Client(base_url=server.url, headers=ADMIN) as http:
        http.post("/admin/keys", json={"name": f"layout {width}", "collections": ["team-a"]}).raise_for_status()
        # A conversation turn: its KV goes to the `history_memory` tier, the longest tier name.
        asked = {"question": "What is the capital of Zorblat?", "conversation_id": "new", "stream": False}
        http.post("/ask", json=asked, timeout=60).raise_for_status()
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.add_init_script(f"localStorage.setItem('blendrag.apiKey', '{ADMIN_KEY}')")
    page = context.new_page()
    try:
        page.goto(f"{server.url}/admin")
        page.wait_for_selector("#keys-body tr[data-key-id]", timeout=TIMEOUT_MS)
        page.wait_for_selector("tr[data-collection='team-a']", timeout=TIMEOUT_MS)
        page.wait_for_selector("#docs-body tr[data-doc-id]", timeout=TIMEOUT_MS)
        page.wait_for_selector("#card-tiers tr[data-tier=history_memory]", timeout=TIMEOUT_MS)
        # Every name and value of the KV tier and footprint cards has white space between them.
        gaps = page.evaluate("""() => [...document.querySelectorAll('#card-tiers tr, #card-footprint tr')].map((tr) => {
            const text = (td) => { const r = document.createRange(); r.selectNodeContents(td);
                                   return r.getBoundingClientRect(); };
            const [a, b] = tr.cells; return text(b).left - text(a).right; })""")
        assert gaps and min(gaps) >= 6, gaps
        # Each row's buttons and its "Last used" cell lie inside the panel (and the screen), fully visible.
        boxes = page.evaluate("""() => [...document.querySelectorAll(
                '#collections-body [data-action], #keys-body [data-action], #docs-body [data-action], '
                + '#keys-body td[data-label="Last used"]')].map((e) => {
            // inside the box that would clip it: its table's scroller (or its panel)
            const box = e.closest('.table-scroll') || e.closest('.panel');
            const r = e.getBoundingClientRect(), p = box.getBoundingClientRect();
            return [e.textContent.trim(), r.left >= p.left - 0.5 && r.right <= p.right + 0.5 && r.width > 0,
                    r.right <= window.innerWidth]; })""")
        assert len(boxes) >= 4 and all(inside and on_screen for _, inside, on_screen in boxes), boxes
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        shot(page, f"admin-tables-{width}")
    finally:
        context.close()


def test_the_pages_use_no_glyph_a_font_may_lack() -> None:
    """The trial saw boxes where the font lacked a glyph: the pages keep to Latin text and common
    punctuation (dashes, quotes, ellipsis, middle dot, times); arrows and icons are drawn with CSS."""
    from pathlib import Path

    allowed = set("–—‘’“”…·×")
    static = Path(__file__).resolve().parents[3] / "app" / "ui" / "static"
    found = {
        (path.name, ch)
        for path in static.rglob("*")
        if path.suffix in (".html", ".js", ".css")
        for ch in path.read_text(encoding="utf-8")
        if ord(ch) > 0x2000 and ch not in allowed
    }
    assert found == set()

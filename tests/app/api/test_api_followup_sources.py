"""A follow-up keeps its documents on both endpoints (issue 62), on the real MiniLM embedder at its shipped
relevance floor and the tiny model: twelve project pages, each an encyclopedia-like passage with one inserted
sentence "The access code of project <Name> is <code>."; turn 1 "Tell me about project <Name>.", turn 2 "What
is the access code of that project?". Through /ask the turn continues a stored conversation (whose turn 1
kept its sources); through /v1 the history is the messages array, whose earlier turn's sources are retrieved
again for its question. Both find the project's page among the top three, with the same sources; a
conversation about what the documents do not hold still gets the notice on both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.main import create_app
from app.services.ask.types import NOT_COVERED
from app.sse_reader import parse_sse

pytestmark = pytest.mark.slow

# (project, code, the passage before the code's sentence, the passage after it): made-up pages in the shape of
# Natural Questions passages (a river, a novel, a club …), whose subjects say nothing of the project.
PAGES = [
    (
        "Zorblat",
        "QX-7316",
        "The Ardent River is a river in the northern highlands that flows for 412 kilometres before it reaches the "
        "Gulf of Mera. Its basin covers some 18,000 square kilometres and is home to more than forty species of "
        "freshwater fish.",
        "The river was first mapped in 1781 by a survey party led by Elena Varga, and its lower course has been "
        "dredged for barge traffic since the 1920s.",
    ),
    (
        "Quenmoor",
        "HT-4402",
        "The Glass Orchard is a 1964 novel by the writer Tomas Wren. It follows three generations of a family of "
        "glassblowers in a coastal town and was adapted for television in 1979.",
        "The novel won the Harlan Prize for fiction in 1965 and has been translated into twenty-two languages; a "
        "restored first edition sold at auction in 2011.",
    ),
    (
        "Velastra",
        "MB-9051",
        "Dunmore Athletic Football Club is a professional football club based in the town of Dunmore. Founded in "
        "1887, the club plays its home games at Kiln Lane, a stadium with a capacity of 14,200.",
        "The club's most successful period came in the 1950s, when it won the regional cup four times and reached "
        "the national semi-final in 1956.",
    ),
    (
        "Brindlewick",
        "RC-2287",
        "Calcium bromate is an inorganic compound with the formula Ca(BrO3)2. It is a white crystalline solid that "
        "dissolves readily in water and is used as a dough conditioner in some countries.",
        "Its use in food has been restricted in several jurisdictions since the 1990s because of concerns about "
        "residues left after baking.",
    ),
    (
        "Oxtane",
        "LW-6630",
        "Harbour Lights is a drama series that aired for six seasons between 2003 and 2009. Set in a fishing port, "
        "it follows the staff of a small hospital and the families they treat.",
        "The show was filmed on location in two villages and its theme song, performed by the singer Ada Quill, "
        "reached number three in the charts.",
    ),
    (
        "Marrowfen",
        "DP-1845",
        "The Battle of Serro Ridge was fought on 14 October 1643 between the armies of the Duchy of Aldmark and a "
        "coalition of free cities. It ended in a costly victory for the coalition.",
        "Historians estimate that about 9,000 soldiers took part and that nearly a third of them were killed or "
        "wounded in the fighting on the ridge.",
    ),
    (
        "Tidelark",
        "GN-5573",
        "The grey-crowned warbler is a small songbird of the family Phylloscopidae. It breeds in mixed forests "
        "across the eastern mountains and winters in the lowland swamps of the south.",
        "Adults weigh about nine grams and feed mostly on insects and spiders gleaned from the undersides of leaves.",
    ),
    (
        "Cobaltine",
        "SV-3098",
        "Paper Boats is a song recorded by the band The Lanterns for their second album, released in 1998. Written "
        "by the lead singer Nora Hale, it tells the story of two children waiting for a ship.",
        "The single spent eleven weeks in the top forty and was later covered by several artists, including a "
        "choir version in 2015.",
    ),
    (
        "Pyrewood",
        "FK-8812",
        "The Sorrel Range is a mountain range stretching about 300 kilometres along the western border. Its highest "
        "peak, Mount Ebon, rises to 3,412 metres above sea level.",
        "The range is crossed by two passes that remain closed from November to April, and its glaciers have "
        "retreated sharply since 1950.",
    ),
    (
        "Hollowmere",
        "TJ-2764",
        "The 1932 general election was held on 9 May 1932 to elect all 180 members of the national assembly. "
        "Turnout was 71 percent, the highest recorded until then.",
        "The Reform League won 94 seats and formed a government under Prime Minister Ivo Marsh, ending twelve "
        "years of coalition rule.",
    ),
    (
        "Sablecrest",
        "WE-4139",
        "Marsh fever is an infectious disease caused by a parasite carried by mosquitoes in wetland regions. "
        "Symptoms include high fever, chills and joint pain, usually beginning a week after the bite.",
        "Cases fell by more than half between 2000 and 2015 after the spread of treated bed nets and new drugs.",
    ),
    (
        "Norvane",
        "AZ-6027",
        "The Kessel Bridge is a suspension bridge spanning the Vell estuary. Opened in 1971, it has a main span of "
        "1,060 metres and carries a four-lane motorway and a cycle path.",
        "The bridge was closed for nine months in 1996 for repairs to its main cables, and a toll on it was "
        "abolished in 2008.",
    ),
]
PROJECTS = [name for name, *_ in PAGES]
FOLLOW_UP = "What is the access code of that project?"
# Conversations the pages do not cover: the first question and its follow-up.
OUT_OF_CORPUS = [
    ("How many calories are in a banana?", "And how much sugar does it have?"),
    ("Who painted the Mona Lisa?", "When did he paint it?"),
    ("How do I reverse a vector in Rust?", "And how do I sort it?"),
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(
        tmp_path_factory.mktemp("followups") / "data", tiny_llama_dir, retrieval={"relevance_floor": "auto"}
    )
    documents = [
        {"title": f"Project {name}", "text": f"{before} The access code of project {name} is {code}. {after}"}
        for name, code, before, after in PAGES
    ]
    with TestClient(create_app(settings, load_in_background=False)) as c:
        accepted = c.post("/ingest", json={"documents": documents})
        assert accepted.status_code == 202, accepted.text
        assert wait_for_job(c, accepted.json()["job_id"])["status"] == "succeeded"
        yield c


def _ask(client: TestClient, question: str, **body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(sources event, done event) of one /ask."""
    response = client.post("/ask", json={"question": question, "max_tokens": 2, **body})
    assert response.status_code == 200, response.text
    events = parse_sse(response.text)
    (first, sources), (last, done) = events[0], events[-1]
    assert (first, last) == ("sources", "done")
    return sources, done


def _v1(client: TestClient, *questions: str) -> dict[str, Any]:
    """/v1's answer to the last question, after the earlier ones (each answered first, as a client sends them)."""
    messages: list[dict[str, str]] = []
    body: dict[str, Any] = {}
    for question in questions:
        messages.append({"role": "user", "content": question})
        response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        assert response.status_code == 200, response.text
        body = response.json()
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    return body


def _asked_in_a_conversation(client: TestClient, *questions: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """/ask's (sources, done) of the last question, each question continuing a stored conversation."""
    conversation = "new"
    for question in questions:
        sources, done = _ask(client, question, conversation_id=conversation)
        conversation = done["conversation_id"]
    return sources, done


def test_follow_ups_find_their_project_on_both_endpoints_with_the_same_sources(client: TestClient) -> None:
    found: dict[str, list[str]] = {"ask": [], "v1": []}
    for name in PROJECTS:
        first = f"Tell me about project {name}."
        stored, done = _asked_in_a_conversation(client, first, FOLLOW_UP)
        stateless = _v1(client, first, FOLLOW_UP)
        assert (stored["notice"], done["notice"], stateless["blendrag"]["notice"]) == (None, None, None)
        # /v1's follow-up searched with the sources its turn 1 had, as the stored conversation's did.
        ask_sources = [(s["title"], s["score"]) for s in stored["sources"]]
        assert [(s["title"], s["score"]) for s in stateless["sources"]] == ask_sources
        for path, titles in (("ask", [t for t, _ in ask_sources]), ("v1", [s["title"] for s in stateless["sources"]])):
            if f"Project {name}" in titles[:3]:
                found[path].append(name)
    # Before, /v1's follow-up read the two questions alone: 10 of these 12 (Brindlewick and Sablecrest fell
    # out of the top three), and 6 of 12 in the corpus, where the floor removed every source.
    assert found == {"ask": PROJECTS, "v1": PROJECTS}


def test_a_conversation_the_pages_do_not_cover_still_gets_the_notice(client: TestClient) -> None:
    for first, follow_up in OUT_OF_CORPUS:
        stored, done = _asked_in_a_conversation(client, first, follow_up)
        assert (stored["sources"], stored["notice"], done["notice"]) == ([], NOT_COVERED, NOT_COVERED)
        stateless = _v1(client, first, follow_up)
        assert (stateless["sources"], stateless["blendrag"]["notice"]) == ([], NOT_COVERED)

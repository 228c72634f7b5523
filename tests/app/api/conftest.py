"""Fixtures for the HTTP API tests: whole servers on the tiny random Llama + the real MiniLM embedder.

Starting a server loads the embedder (~1 s), so servers are module-scoped: a module shares one server
and one small corpus; tests that change the library make their own documents.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apitools import LiveServer, ingest_corpus, server_settings
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Settings:
    return server_settings(tmp_path_factory.mktemp("api") / "data", tiny_llama_dir)


@pytest.fixture(scope="module")
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, load_in_background=False)) as c:
        yield c


@pytest.fixture(scope="module")
def corpus(client: TestClient) -> dict[str, str]:
    return ingest_corpus(client)


@pytest.fixture(scope="module")
def live_server(settings: Settings) -> Iterator[LiveServer]:
    with LiveServer(create_app(settings, load_in_background=False)) as server:
        yield server

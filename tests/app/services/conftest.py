"""The app services run on the fast stand-ins of tests/app/conftest.py (tiny Llama + hash embedder)."""

from __future__ import annotations

import pytest

from app.build import Services


@pytest.fixture
def services(fast_services: Services) -> Services:
    return fast_services

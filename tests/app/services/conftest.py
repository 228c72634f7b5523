"""The app services run on the fast stand-ins of tests/app/conftest.py (tiny Llama + hash embedder)."""

from __future__ import annotations

import pytest

from app.components import Components


@pytest.fixture
def components(fast_components: Components) -> Components:
    return fast_components

from __future__ import annotations

import pytest

from app.components import Components, build_components


@pytest.fixture
def components(tiny_settings) -> Components:
    c = build_components(tiny_settings)
    yield c
    c.close()

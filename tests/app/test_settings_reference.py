"""docs/settings.md is generated from the settings models: every leaf described, and the file current."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.settings import Settings
from app.settings_reference import REFERENCE_PATH, reference, render, setting_rows


def test_every_setting_has_a_description() -> None:
    rows = setting_rows(Settings)
    assert len(rows) > 100
    assert [row.name for row in rows if not row.description] == []


def test_the_reference_in_docs_is_current() -> None:
    # When this fails: python -m app.settings_reference --write (and commit docs/settings.md).
    assert REFERENCE_PATH.read_text(encoding="utf-8") == reference()


def test_rows_name_the_env_var_type_and_default() -> None:
    class Inner(BaseModel):
        ratio: float = Field(default=0.25, description="a share | of something")
        names: list[str] = Field(default_factory=lambda: ["a"], description="some names")

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner)
        flag: bool | None = Field(default=None, description="maybe")

    rows = setting_rows(Outer)
    assert [(r.name, r.env, r.type, r.default) for r in rows] == [
        ("inner.ratio", "BLENDRAG_INNER__RATIO", "float", "`0.25`"),
        ("inner.names", "BLENDRAG_INNER__NAMES", "list[str]", "`['a']`"),
        ("flag", "BLENDRAG_FLAG", "bool \\| null", "null"),
    ]
    text = render(rows)
    assert "| `inner.ratio`<br>`BLENDRAG_INNER__RATIO` | float | `0.25` | a share \\| of something |" in text

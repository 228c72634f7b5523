"""A passage's section: the Markdown heading in force at its first character."""

from __future__ import annotations

from dataclasses import dataclass

from app.services.sections import headings, section_of

PAGE = (
    "# Models\n\nIntro text.\n\n## Field aliases { #aliases }\n\nUse `alias`.\n\n"
    "```bash\n# install it\npip install pydantic\n```\n\n### `model_dump` options ###\n\nMore."
)


@dataclass(frozen=True)
class Piece:
    text: str
    char_start: int


def piece(start: int, end: int) -> Piece:
    return Piece(PAGE[start:end], start)


def test_headings_outside_fences_with_their_offsets() -> None:
    assert headings(PAGE) == [(0, "Models"), (23, "Field aliases"), (115, "model_dump options")]
    assert headings("#hashtag and # not at the start\n####### seven") == []


def test_a_chunk_opening_with_a_heading_is_in_that_section() -> None:
    assert section_of(piece(23, 70), []) == "Field aliases"
    assert section_of(Piece("\n  ## Indented\ntext", 5), []) == "Indented"


def test_otherwise_the_latest_heading_before_its_start_in_the_earlier_chunks() -> None:
    chunk = piece(60, 95)  # inside the fence: "# install it" is a comment there, and the chunk has no heading
    earlier = [piece(20, 70), piece(0, 30)]  # latest first; they overlap the chunk
    assert section_of(chunk, earlier) == "Field aliases"
    # A heading of an earlier chunk that lies past the chunk's start (in the overlap) does not count.
    assert section_of(piece(10, 40), [piece(0, 40)]) == "Models"
    assert section_of(Piece("plain text", 500), [Piece("no headings here", 0)]) is None

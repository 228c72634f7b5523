"""POST /api/render: Markdown to sanitized HTML for the chat page (answers while they stream, passages)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from app.api.schemas.common import error_responses
from app.services.render import MAX_RENDER_CHARS, render_markdown

router = APIRouter(tags=["ui"])


class RenderIn(BaseModel):
    text: str = Field(max_length=MAX_RENDER_CHARS, description="Markdown")
    passage: bool = Field(
        default=False,
        description="The text is a passage cut from a document: one that starts inside a code block (its first "
        "fence closes a block the passage does not show opening) renders its code as code, not inverted",
    )


class RenderOut(BaseModel):
    html: str = Field(description="Sanitized HTML: raw HTML in the input is shown as text, never executed")


@router.post(
    "/api/render",
    response_model=RenderOut,
    responses=error_responses(
        {400: "The body is not JSON (or not UTF-8)", 422: "No `text`, or text over the size limit"}
    ),
)
def render(body: RenderIn) -> RenderOut:
    """Render Markdown the way the chat page shows answers and passages."""
    try:
        return RenderOut(html=render_markdown(body.text, passage=body.passage))
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc

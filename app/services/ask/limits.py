"""The limits of a question's parameters, the same for POST /ask, /v1/chat/completions and `blendrag ask`
(the CLI checks its arguments against them before any model loads)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from app.services.ask.types import MAX_QUESTION_CHARS
from app.services.key_service import COLLECTION_PATTERN

MAX_TOP_K = 64
MAX_NEW_TOKENS = 4096
CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9-]+$"
MAX_CONVERSATION_ID_CHARS = 64

TopK = Annotated[int, Field(ge=1, le=MAX_TOP_K)]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)]
RecomputeRatio = Annotated[float, Field(ge=0.0, le=1.0)]
ConversationId = Annotated[
    str, Field(min_length=1, max_length=MAX_CONVERSATION_ID_CHARS, pattern=CONVERSATION_ID_PATTERN)
]
CollectionName = Annotated[str, Field(pattern=COLLECTION_PATTERN)]
QuestionText = Annotated[str, Field(max_length=MAX_QUESTION_CHARS)]

"""The `messages` of `/v1/chat/completions`: their pydantic types and what they ask (`read_messages`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from app.services.ask.types import MAX_QUESTION_CHARS
from app.services.text_checks import NOT_BLANK, is_valid_utf8
from engine.prompt import Turn

USER_PART_CHARS = 1000  # a list-form question has at most MAX_QUESTION_CHARS // USER_PART_CHARS parts


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class UserTextPart(BaseModel):
    """A part of the question: only text is read (images and audio are not supported)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str = Field(min_length=1, max_length=USER_PART_CHARS, pattern=NOT_BLANK)


class UserMessage(BaseModel):
    """The last one is the question: text, at most MAX_QUESTION_CHARS characters."""

    model_config = ConfigDict(extra="allow")

    role: Literal["user"]
    content: (
        Annotated[str, Field(min_length=1, max_length=MAX_QUESTION_CHARS, pattern=NOT_BLANK)]
        | Annotated[list[UserTextPart], Field(min_length=1, max_length=MAX_QUESTION_CHARS // USER_PART_CHARS)]
    )

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content


class OtherMessage(BaseModel):
    """system / developer (the system prompt), assistant (an earlier answer); tool / function are not read."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""


ChatMessage = Annotated[UserMessage | OtherMessage, Field(discriminator="role")]


@dataclasses.dataclass(frozen=True)
class ChatMessages:
    """What a `messages` array asks: the question, the earlier turns, the client's system prompt."""

    question: str
    history: tuple[Turn, ...]
    system_prompt: str | None  # None: the server's


def read_messages(messages: list[UserMessage | OtherMessage]) -> ChatMessages:
    """Split `messages` into question, history and system prompt (see the module docstring)."""
    for i, m in enumerate(messages):
        # Every message reaches the tokenizer (the system prompt and earlier answers too), which cannot encode
        # a lone surrogate: refused here, not a TypeError deep in the ask plan.
        if not is_valid_utf8(m.text()):
            raise HTTPException(
                400, f"messages[{i}] ({m.role}): text must be valid Unicode (a lone surrogate such as \\ud800 is not)"
            )
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=None)
    if last_user is None:
        raise HTTPException(400, "messages must contain a user message with text (the question)")
    systems = [m.text().strip() for m in messages if m.role in ("system", "developer")]
    systems = [t for t in systems if t]
    history: list[Turn] = []
    asked: list[str] = []  # user messages not answered yet
    for message in messages[: last_user + 1]:
        if isinstance(message, UserMessage):
            asked.append(message.text().strip())
        elif message.role == "assistant":
            if message.content is None:
                continue  # a tool call without text
            answer = message.text().strip()  # may be empty: an empty answer is still a turn, as /ask stores it
            if asked:
                history.append(Turn(question="\n".join(asked), answer=answer))
                asked = []
            elif history:  # two assistant messages in a row: one answer
                history[-1] = Turn(history[-1].question, f"{history[-1].answer}\n{answer}")
    question = "\n".join(asked)
    if len(question) > MAX_QUESTION_CHARS:
        raise HTTPException(
            400, f"the question (the last user messages) is longer than {MAX_QUESTION_CHARS} characters"
        )
    return ChatMessages(
        question=question, history=tuple(history), system_prompt="\n\n".join(systems) if systems else None
    )

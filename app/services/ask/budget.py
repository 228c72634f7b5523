"""One budget for what a request brings to the prompt: its system messages, its question and the earlier turns
kept, counted together against `server.max_prompt_tokens` before any retrieval, follow-up rewrite or prompt pass.

The question has its own cap (`server.max_question_tokens`). A client's system prompt had none: a 7 KB system
message with "hi" cost an anonymous client a 77 s prompt pass. The server's own system prompt is not counted:
its KV is computed once and reused by every request. Earlier turns never make a request fail: they fill what the
system messages and the question leave of the budget (at most `engine.history_max_tokens`), oldest left out
first, as they always were past the history budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.services.ask.types import AskValidationError

if TYPE_CHECKING:
    from engine.prompt import HistoryFit, PromptBuilder, Turn

# A token of any tokenizer the server loads is far shorter than this on text anyone sends; a system prompt
# longer than cap × this many characters is refused before it is tokenized (an 8 MiB body would otherwise
# hold the event loop for seconds in the tokenizer).
MAX_CHARS_PER_TOKEN = 16


@dataclass(frozen=True)
class PromptBudget:
    """A request's prompt, counted: what the system messages and the question take, and the earlier turns
    that fit in what is left."""

    num_system_tokens: int  # the client's system messages (0: the server's own prompt)
    num_question_tokens: int
    history: HistoryFit  # the earlier turns kept, oldest first
    max_prompt_tokens: int

    @property
    def num_tokens(self) -> int:
        return self.num_system_tokens + self.num_question_tokens + self.history.num_tokens


def count_tokens(builder: PromptBuilder, text: str) -> int:
    """Tokens of a client's text as the prompt encodes it (special-token strings stay plain text)."""
    return len(builder.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def budget_prompt(
    builder: PromptBuilder,
    *,
    system_prompt: str | None,
    question: str,
    history: Sequence[Turn],
    max_question_tokens: int,
    max_prompt_tokens: int,
    history_max_tokens: int,
) -> PromptBudget:
    """Count the request's prompt; AskValidationError (422 / 400) naming the numbers when the question is over
    its cap or the system messages and the question together are over the prompt cap.

    `builder` is the server's (it encodes the earlier turns; a client's prompt encodes them the same way).
    """
    client_system = system_prompt if system_prompt is not None and system_prompt != builder.system_prompt else None
    if client_system is not None and len(client_system) > max_prompt_tokens * MAX_CHARS_PER_TOKEN:
        raise AskValidationError(
            f"the system messages are {len(client_system)} characters, more than a prompt of "
            f"{max_prompt_tokens} tokens can hold (server.max_prompt_tokens; counted before tokenizing at "
            f"{MAX_CHARS_PER_TOKEN} characters a token)"
        )
    num_question_tokens = count_tokens(builder, question)
    if num_question_tokens > max_question_tokens:
        raise AskValidationError(
            f"the question is {num_question_tokens} tokens; the limit is {max_question_tokens} "
            "(server.max_question_tokens)"
        )
    num_system_tokens = count_tokens(builder, client_system) if client_system is not None else 0
    fixed = num_system_tokens + num_question_tokens
    if fixed > max_prompt_tokens:
        raise AskValidationError(
            f"the prompt is {fixed} tokens (system messages {num_system_tokens} + question {num_question_tokens}); "
            f"the limit is {max_prompt_tokens} (server.max_prompt_tokens)"
        )
    fit = builder.fit_history(list(history), min(history_max_tokens, max_prompt_tokens - fixed))
    return PromptBudget(
        num_system_tokens=num_system_tokens,
        num_question_tokens=num_question_tokens,
        history=fit,
        max_prompt_tokens=max_prompt_tokens,
    )

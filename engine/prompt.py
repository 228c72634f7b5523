"""Prompt layout as token ids: [prefix][chunk 1]…[chunk k][suffix].

The chat template is rendered once with sentinel text in the user turn and split around it, so the
prefix (system prompt + opening of the user turn) and the closing text (end of user turn + assistant
opening) are exactly what the template would produce. Everything is kept as token ids: chunk ids come
from ingest and are never re-tokenized, and a whole prompt is never decoded and re-encoded.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.types import PromptLayout

logger = logging.getLogger(__name__)

_SENTINEL = "\u2063BLENDRAG_USER_TURN\u2063"

__all__ = ["PromptBuilder", "PromptLayout"]


class PromptBuilder:
    """Builds prefix and suffix ids for one tokenizer + system prompt."""

    def __init__(self, tokenizer: Any, system_prompt: str, question_template: str = "Question: {question}"):
        if "{question}" not in question_template:
            raise ValueError("question_template must contain '{question}'")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.question_template = question_template
        opening, self._closing_text = self._split_template()
        self.prefix_ids: list[int] = self._encode(opening)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _render(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _split_template(self) -> tuple[str, str]:
        """(text before the user's content, text after it) from the tokenizer's chat template."""
        if getattr(self.tokenizer, "chat_template", None):
            attempts = [
                [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": _SENTINEL}],
                # Templates without a system role (e.g. older Mistral) get it at the top of the user turn.
                [{"role": "user", "content": f"{self.system_prompt}\n\n{_SENTINEL}"}],
            ]
            for messages in attempts:
                try:
                    rendered = self._render(messages)
                except Exception as exc:  # jinja raises plain exceptions for unsupported roles
                    logger.debug("chat template rejected %s: %s", [m["role"] for m in messages], exc)
                    continue
                if rendered.count(_SENTINEL) == 1:
                    opening, closing = rendered.split(_SENTINEL)
                    return opening, closing
        # Base models without a chat template: a plain-text layout with the tokenizer's BOS, if any.
        logger.info("tokenizer has no usable chat template; using a plain-text prompt layout")
        bos = getattr(self.tokenizer, "bos_token", None) or ""
        return f"{bos}{self.system_prompt}\n\n", "\nAnswer:"

    def suffix_ids(self, question: str) -> list[int]:
        """Question text + end of the user turn + opening of the assistant turn.

        The user's question is encoded with special-token strings kept as plain text (like document
        chunks), so a question containing "<|im_end|>" cannot close the turn and inject a new one.
        """
        before, after = self.question_template.split("{question}", 1)
        return (
            self._encode(before) + self._encode_untrusted(question.strip()) + self._encode(after + self._closing_text)
        )

    def _encode_untrusted(self, text: str) -> list[int]:
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        except TypeError:  # tokenizers without the option
            return self._encode(text)

    def layout(self, chunk_ids: list[list[int]], question: str) -> PromptLayout:
        return PromptLayout(
            prefix_ids=list(self.prefix_ids),
            chunk_ids=[list(c) for c in chunk_ids],
            suffix_ids=self.suffix_ids(question),
        )

    def layout_ranked(self, ranked_chunk_ids: list[list[int]], question: str) -> PromptLayout:
        """The prompt /ask, /v1, the CLI and bench all use: chunks given best first (retrieval rank) are
        laid out best *last*, nearest the question, where a small model attends most."""
        return self.layout(list(reversed(ranked_chunk_ids)), question)

"""Prompt layout as token ids: [prefix][chunk 1]…[chunk k][turn 1]…[turn t-1][suffix].

The chat template is rendered once with sentinel text in the message contents and split around it, so
the prefix (system prompt + opening of the user turn), the closing text (end of user turn + assistant
opening) and the text between an earlier turn's messages are exactly what the template would produce.
Everything is kept as token ids: chunk ids come from ingest and are never re-tokenized, and a whole
prompt is never decoded and re-encoded.

A conversation's earlier turn is one segment: `Question: q` + end of the user turn + assistant opening +
the answer + end of the assistant turn + opening of the next user turn. With the retrieved chunks at the
top of the first user message, the layout of turn t is exactly what the template renders for
[system, user(chunks + q1), assistant(a1), …, user(q_t)], and every earlier turn's ids depend on that
turn's text only, so its stored KV is found by content wherever it lands.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.types import PromptLayout

logger = logging.getLogger(__name__)

_SENTINEL = "\u2063BLENDRAG_USER_TURN\u2063"
_SENTINELS = tuple(f"\u2063BLENDRAG_PART_{i}\u2063" for i in range(4))  # system, user, assistant, user
_CLIENT_BUILDERS = 8  # builders kept for client system prompts (each holds a few short id lists)

__all__ = ["HistoryFit", "PromptBuilder", "PromptLayout", "Turn"]


@dataclass(frozen=True)
class Turn:
    """One earlier exchange of a conversation, as text (what the client sent or the server answered)."""

    question: str
    answer: str


@dataclass(frozen=True)
class HistoryFit:
    """The earlier turns that fit the history token budget (oldest dropped first), as segments."""

    segment_ids: list[list[int]]  # kept turns, oldest first
    num_dropped_turns: int  # the oldest turns left out

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segment_ids)


@dataclass(frozen=True)
class _TurnTemplate:
    """Text between an earlier turn's question and answer, and after the answer (next user opening)."""

    between: str  # end of the user turn + opening of the assistant turn
    after: str  # end of the assistant turn + opening of the next user turn


# The opening of every prompt's context, right after the template's opening (`engine.chunk_lead_in`): part of the
# prefix, so every chunk's stored KV is computed behind it and a question's prompt holds it too. A chunk computed
# right behind the system prompt opens the user's turn: its tokens put their attention on the prompt's first
# tokens, and its keys draw more of a question's attention than the same keys do deep in a prompt of several
# chunks, so a blend must recompute many rows to correct them. Behind some text first they are much closer to
# what full prefill computes (docs/benchmarks.md, "Stored KV behind other text"), and the first chunk's KV stays
# exact where it stands, as the lead-in stands before it in the prompt too. Off by default: with this text the
# look-ups among near-identical pages lost more than the blend gained (the same section).
LEAD_IN = (
    "This collection brings together passages from many sources: reference articles, manuals, reports, "
    "documentation pages and notes. Each passage was taken from a longer text, so it may begin in the middle of a "
    "topic and refer to things explained earlier in its document. The names, dates, figures, values and codes in "
    "a passage belong to that passage and to the subject it describes. Passages on similar subjects can look "
    "alike while their details differ.\n\n"
)


class PromptBuilder:
    """Builds prefix, suffix and earlier-turn ids for one tokenizer + system prompt. With a `lead_in` the prefix
    ends with its ids: the user's turn opens with it, before the chunks."""

    def __init__(
        self,
        tokenizer: Any,
        system_prompt: str,
        question_template: str = "Question: {question}",
        *,
        untrusted_system: bool = False,
        restate_system: bool | None = None,
        lead_in: str = "",
    ):
        if "{question}" not in question_template:
            raise ValueError("question_template must contain '{question}'")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.question_template = question_template
        self._untrusted_system = untrusted_system
        # A client's instruction ("Answer in one sentence.") is restated after the question: at the top of
        # a prompt of several retrieved chunks a small model does not follow it (the answer's form comes
        # from what is nearest the answer). The suffix is computed fresh in every mode, so the stored
        # chunks' KV is unchanged.
        self._restate_system = untrusted_system if restate_system is None else restate_system
        opening, self._closing_text = self._split_template()
        self.lead_in = lead_in
        self.prefix_ids: list[int] = self._prefix_ids(opening) + (self._encode(lead_in) if lead_in else [])
        self._turn = self._split_turn_template()
        self._client_lock = threading.Lock()
        self._client_builders: OrderedDict[str, PromptBuilder] = OrderedDict()

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _render(self, messages: list[dict[str, str]]) -> str:
        # enable_thinking=False: a template with a thinking mode (Qwen3's) opens the answer with an empty
        # <think></think> block instead of letting the model reason at length before it answers (minutes of
        # decode on a CPU, and text that is no answer). Templates without one never read the variable.
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
            )
        except TypeError:  # a tokenizer whose apply_chat_template takes no template variables
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _system_messages(self, system: str, user: str) -> list[list[dict[str, str]]]:
        return [
            [{"role": "system", "content": system}, {"role": "user", "content": user}],
            # Templates without a system role (e.g. older Mistral) get it at the top of the user turn.
            [{"role": "user", "content": f"{system}\n\n{user}"}],
        ]

    def _split_template(self) -> tuple[str, str]:
        """(text before the user's content, text after it) from the tokenizer's chat template."""
        if getattr(self.tokenizer, "chat_template", None):
            for messages in self._system_messages(self.system_prompt, _SENTINEL):
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

    def _prefix_ids(self, opening: str) -> list[int]:
        """The opening as ids. A client's system prompt is encoded like a question (special-token strings
        stay plain text); the server's own is encoded whole, as every stored chunk's key was built."""
        if not self._untrusted_system or self.system_prompt not in opening:
            return self._encode(opening)
        head, tail = opening.split(self.system_prompt, 1)
        return self._encode(head) + self._encode_untrusted(self.system_prompt) + self._encode(tail)

    def _split_turn_template(self) -> _TurnTemplate:
        """The template text around an earlier turn, from a rendering of [system, user, assistant, user]."""
        system, user1, assistant, user2 = _SENTINELS
        if getattr(self.tokenizer, "chat_template", None):
            for first in self._system_messages(system, user1):
                messages = [*first, {"role": "assistant", "content": assistant}, {"role": "user", "content": user2}]
                try:
                    rendered = self._render(messages)
                except Exception as exc:  # noqa: BLE001 - a template that cannot render turns
                    logger.debug("chat template rejected a multi-turn conversation: %s", exc)
                    continue
                if all(rendered.count(s) == 1 for s in (user1, assistant, user2)):
                    between = rendered.split(user1, 1)[1].split(assistant, 1)[0]
                    after, closing = rendered.split(assistant, 1)[1].split(user2, 1)
                    if closing != self._closing_text:
                        logger.warning("chat template closes a later user turn differently from the first")
                    return _TurnTemplate(between=between, after=after)
        return _TurnTemplate(between=self._closing_text + " ", after="\n\n")

    def suffix_ids(self, question: str) -> list[int]:
        """Question text (+ a client's system prompt, restated) + end of the user turn + assistant opening.

        The user's question (with the template text before it) is encoded with special-token strings kept
        as plain text (like document chunks), so a question containing "<|im_end|>" cannot close the turn
        and inject a new one.
        """
        before, after = self.question_template.split("{question}", 1)
        # `before` and the question are encoded together, as the template renders them ("Question: who"
        # is not "Question: " + "who" to a BPE tokenizer).
        restated = self._encode_untrusted("\n\n" + self.system_prompt.strip()) if self._restate_system else []
        return self._encode_untrusted(before + question.strip()) + restated + self._encode(after + self._closing_text)

    def turn_ids(self, turn: Turn) -> list[int]:
        """One earlier turn as a segment: question (as `suffix_ids` writes it, minus the closing) + end of
        the user turn + assistant opening + answer + end of the assistant turn + next user opening.

        The answer is encoded like a question: an answer a client resends cannot inject turns either.
        """
        before, after = self.question_template.split("{question}", 1)
        return (
            self._encode_untrusted(before + turn.question.strip())
            + self._encode(after + self._turn.between)
            + self._encode_untrusted(turn.answer.strip())
            + self._encode(self._turn.after)
        )

    def fit_history(self, turns: list[Turn], max_tokens: int) -> HistoryFit:
        """The most recent turns whose segments fit `max_tokens` together; older ones are dropped first."""
        kept: list[list[int]] = []
        total = 0
        for turn in reversed(turns):
            ids = self.turn_ids(turn)
            if total + len(ids) > max_tokens:
                break
            kept.append(ids)
            total += len(ids)
        kept.reverse()
        return HistoryFit(segment_ids=kept, num_dropped_turns=len(turns) - len(kept))

    def _encode_untrusted(self, text: str) -> list[int]:
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        except TypeError:  # tokenizers without the option
            return self._encode(text)

    def layout(
        self, chunk_ids: list[list[int]], question: str, history_ids: list[list[int]] | None = None
    ) -> PromptLayout:
        history = [list(h) for h in history_ids or []]
        return PromptLayout(
            prefix_ids=list(self.prefix_ids),
            chunk_ids=[list(c) for c in chunk_ids] + history,
            suffix_ids=self.suffix_ids(question),
            num_history_segments=len(history),
            # A client's builder: the store's KV was computed behind the server's prefix, not this one.
            segments_behind_prefix=not self._untrusted_system,
        )

    def layout_ranked(
        self, ranked_chunk_ids: list[list[int]], question: str, history_ids: list[list[int]] | None = None
    ) -> PromptLayout:
        """The prompt /ask, /v1, the CLI and bench all use: chunks given best first (retrieval rank) are
        laid out best *last*, nearest the question, where a small model attends most; a conversation's
        earlier turns (oldest first) follow them."""
        return self.layout(list(reversed(ranked_chunk_ids)), question, history_ids)

    def for_system_prompt(self, system_prompt: str | None) -> PromptBuilder:
        """A builder for a client's own system prompt (this one for None or the server's own prompt).

        Its prefix differs; the chunk and turn segments are the same ids, so KV stored behind this
        builder's prefix is blended behind the client's (the engine computes each prefix once).
        """
        if system_prompt is None or system_prompt == self.system_prompt:
            return self
        with self._client_lock:
            builder = self._client_builders.get(system_prompt)
            if builder is not None:
                self._client_builders.move_to_end(system_prompt)
                return builder
        builder = PromptBuilder(
            self.tokenizer, system_prompt, self.question_template, untrusted_system=True, lead_in=self.lead_in
        )
        with self._client_lock:
            self._client_builders[system_prompt] = builder
            while len(self._client_builders) > _CLIENT_BUILDERS:
                self._client_builders.popitem(last=False)
        return builder

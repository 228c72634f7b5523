"""One budget for a request's prompt (app/services/ask/budget.py): the client's system messages, the question
and the earlier turns kept, counted together before any work; earlier turns only fill what is left."""

from __future__ import annotations

import asyncio

import pytest

from app.build import Services, new_ask, new_scheduler
from app.services.ask import AskRequest, AskValidationError
from app.services.ask.budget import MAX_CHARS_PER_TOKEN, budget_prompt, count_tokens
from app.settings import Settings
from engine.prompt import PromptBuilder, Turn

QUESTION = "Where is Quintaro?"
HISTORY = (Turn("What is Zorblat?", "A planet."), Turn("Has it rivers?", "Purple ones."), Turn("Kites?", "In May."))


def budget(builder: PromptBuilder, *, system: str | None = None, cap: int = 2048, history_max: int = 1024):
    return budget_prompt(
        builder,
        system_prompt=system,
        question=QUESTION,
        history=HISTORY,
        max_question_tokens=1024,
        max_prompt_tokens=cap,
        history_max_tokens=history_max,
    )


def test_system_messages_and_question_count_together(fast_engine) -> None:
    builder = fast_engine.prompt
    system = "s " * 3500
    num_system, num_question = count_tokens(builder, system), count_tokens(builder, QUESTION)
    assert num_system > 2048 and num_question > 0
    with pytest.raises(AskValidationError) as raised:
        budget(builder, system=system)
    assert str(raised.value) == (
        f"the prompt is {num_system + num_question} tokens (system messages {num_system} + question "
        f"{num_question}); the limit is 2048 (server.max_prompt_tokens)"
    )
    # Exactly at the cap it is asked, and no earlier turn fits in what is left.
    at_cap = budget(builder, system=system, cap=num_system + num_question)
    assert (at_cap.num_system_tokens, at_cap.num_question_tokens) == (num_system, num_question)
    assert at_cap.history.segment_ids == [] and at_cap.history.num_dropped_turns == 3
    assert at_cap.num_tokens == num_system + num_question


def test_the_servers_own_prompt_is_not_counted(fast_engine) -> None:
    builder = fast_engine.prompt
    for system in (None, builder.system_prompt):
        counted = budget(builder, system=system)
        assert counted.num_system_tokens == 0
        assert counted.history.num_dropped_turns == 0


def test_earlier_turns_fill_what_is_left_oldest_out_first(fast_engine) -> None:
    builder = fast_engine.prompt
    sizes = [len(builder.turn_ids(t)) for t in HISTORY]
    system = "Answer in one sentence."
    fixed = count_tokens(builder, system) + count_tokens(builder, QUESTION)
    kept = budget(builder, system=system, cap=fixed + sizes[2] + sizes[1])
    assert kept.history.segment_ids == [builder.turn_ids(HISTORY[1]), builder.turn_ids(HISTORY[2])]
    assert kept.history.num_dropped_turns == 1
    assert kept.num_tokens == fixed + sizes[2] + sizes[1]
    # engine.history_max_tokens still bounds them when the prompt cap leaves more.
    assert budget(builder, system=system, history_max=sizes[2]).history.num_dropped_turns == 2


def test_a_huge_system_prompt_is_refused_before_it_is_tokenized(fast_engine) -> None:
    class Untokenized:
        """The server's builder with no tokenizer: the refusal must come without one."""

        system_prompt = fast_engine.prompt.system_prompt

        @property
        def tokenizer(self):  # noqa: ANN201
            raise AssertionError("tokenized")

    system = "x" * (100 * MAX_CHARS_PER_TOKEN + 1)
    with pytest.raises(AskValidationError) as raised:
        budget(Untokenized(), system=system, cap=100)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"the system messages are {len(system)} characters, more than a prompt of 100 tokens can hold "
        f"(server.max_prompt_tokens; counted before tokenizing at {MAX_CHARS_PER_TOKEN} characters a token)"
    )


def test_the_service_refuses_before_retrieval_and_trims_history_to_the_cap(
    fast_engine, make_fast_settings, make_fast_services
) -> None:
    builder: PromptBuilder = fast_engine.prompt
    sizes = [len(builder.turn_ids(t)) for t in HISTORY]
    cap = count_tokens(builder, QUESTION) + sizes[1] + sizes[2]  # room for the two most recent turns
    settings: Settings = make_fast_settings(server={"max_prompt_tokens": cap})
    services: Services = make_fast_services(settings)
    searched: list[str] = []
    real_search = services.retriever.search

    def spy(text: str, **kwargs):  # noqa: ANN202
        searched.append(text)
        return real_search(text, **kwargs)

    services.retriever.search = spy  # type: ignore[method-assign]

    async def plan(request: AskRequest):  # noqa: ANN202
        scheduler = new_scheduler(services.settings, services.engine)
        return await new_ask(services, scheduler=scheduler).plan(request)

    with pytest.raises(AskValidationError, match=rf"the limit is {cap} \(server\.max_prompt_tokens\)$"):
        asyncio.run(plan(AskRequest(question=QUESTION, system_prompt="s " * cap, followup="off")))
    assert searched == []  # refused before retrieval
    planned = asyncio.run(plan(AskRequest(question=QUESTION, history=HISTORY, followup="off")))
    assert planned.num_history_turns == 2 and planned.num_dropped_turns == 1
    assert planned.layout.history_ids == [builder.turn_ids(HISTORY[1]), builder.turn_ids(HISTORY[2])]
    assert searched == [QUESTION]

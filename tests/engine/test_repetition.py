"""Repetition control: penalty, no-repeat n-grams and the repeated-line stop, in the sampler, in a whole
request run, and from the engine settings into every mode alike."""

from __future__ import annotations

import logging

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.config import EngineSettings
from engine.repetition import (
    InlineLoop,
    LineLoop,
    RepeatedLineGuard,
    ends_in_loop,
    find_inline_loop,
    find_line_loop,
)
from engine.sampling import IncrementalDetokenizer, RepetitionControl, Sampler, banned_ngram_tokens
from engine.types import FinishEvent, GenerationRequest, RepeatedLine, SamplingParams, TokenEvent


@pytest.fixture(scope="module")
def layout(tiny_engine):
    return tiny_engine.prompt.layout(random_chunks([20, 25], seed=21), "what happens next?")


def _run(engine, layout, sampling: SamplingParams):
    events = list(engine.generate(GenerationRequest("t", layout, None, "full", sampling=sampling)))
    assert isinstance(events[-1], FinishEvent) and all(isinstance(e, TokenEvent) for e in events[:-1])
    return [e.token_id for e in events[:-1]], events[-1]


def _ngrams(ids: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


@pytest.mark.parametrize(
    ("text", "repeated"),
    [
        ("The launch is on 3 March. The launch is on 3 March.", True),
        ("The launch is on 3 March.\nIt is soon.\nthe launch  is on 3 march.", True),  # case and spaces ignored
        ("The launch is on 3 March. The launch is on 3 Mar", False),  # the repeat is not complete yet
        ("The launch is on 3 March. It is soon.", False),
        ("Yes. Yes.", False),  # too short to call a loop
        ("Yes. Yes. Yes.", False),  # a short line three times in a row is not a loop yet
        ("Yes. Yes. Yes. Yes.", True),  # four times in a row is
        ("Ç¨\n\n" * 4, True),  # the loop ran 363 times to the token cap
        ("Ç¨\n\nÇ¨\n\nÇ¨\n\n", False),
        ("- a\n- b\n- a\n- a\n- a\n", False),  # short list items: not one line four times in a row
        ("It costs 3.5 euros. It costs 3.", False),
        ("", False),
    ],
)
def test_ends_in_loop(text: str, repeated: bool) -> None:
    assert ends_in_loop(text) is repeated


def test_banned_ngram_tokens() -> None:
    assert banned_ngram_tokens([5, 6, 7, 5, 6], 3) == {7}  # "5 6" was followed by 7 before
    assert banned_ngram_tokens([5, 6, 5, 6, 9, 5, 6], 3) == {5, 9}
    assert banned_ngram_tokens([5, 6, 7], 3) == set()
    assert banned_ngram_tokens([4, 4, 2], 1) == {4, 2}


def test_penalty_shrinks_positive_and_lowers_negative_logits_of_generated_tokens_only() -> None:
    control = RepetitionControl(SamplingParams(repetition_penalty=1.25))  # exact in binary floating point
    logits = torch.tensor([2.5, -2.0, 1.0, 0.5])
    out = control.adjust(logits, [0, 1, 1])
    assert out.tolist() == [2.0, -2.5, 1.0, 0.5]
    assert logits.tolist() == [2.5, -2.0, 1.0, 0.5]  # the caller's tensor is left alone
    assert control.adjust(logits, []) is logits


def test_greedy_sampler_obeys_the_ngram_ban() -> None:
    sampler = Sampler(SamplingParams(no_repeat_ngram_size=2), torch.device("cpu"))
    logits = torch.tensor([0.0, 1.0, 3.0, 2.5])
    assert sampler(logits) == 2
    assert sampler(logits, [1, 2, 1]) == 3  # "1 2" was generated already: 2 may not follow 1 again


def test_ngram_ban_removes_every_repeated_trigram_of_a_looping_greedy_run(tiny_engine, layout) -> None:
    free, fin = _run(tiny_engine, layout, SamplingParams(max_tokens=40, ignore_eos=True))
    assert fin.finish_reason == "length"
    assert len(set(_ngrams(free, 3))) < len(_ngrams(free, 3))  # the random model does loop
    controlled, _ = _run(tiny_engine, layout, SamplingParams(max_tokens=40, ignore_eos=True, no_repeat_ngram_size=3))
    assert len(controlled) == 40
    assert len(set(_ngrams(controlled, 3))) == len(_ngrams(controlled, 3))
    assert controlled[:3] == free[:3]  # the first tokens have nothing to repeat yet


def test_penalty_changes_the_run_but_not_the_first_token(tiny_engine, layout) -> None:
    free, _ = _run(tiny_engine, layout, SamplingParams(max_tokens=24, ignore_eos=True))
    penalised, _ = _run(tiny_engine, layout, SamplingParams(max_tokens=24, ignore_eos=True, repetition_penalty=2.0))
    assert penalised[0] == free[0]
    assert penalised != free
    assert len(set(penalised)) > len(set(free))


def test_a_repeated_sentence_is_never_sent_and_finishes_with_repetition(tiny_engine, layout, monkeypatch) -> None:
    script = iter(["The launch", " is on 3 March.", " It is soon.", " The launch is", " on 3 March.", " More"])
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(script))
    sampling = SamplingParams(max_tokens=6, ignore_eos=True, stop_on_repeated_line=True)
    events = list(tiny_engine.generate(GenerationRequest("t", layout, None, "full", sampling=sampling)))
    fin = events[-1]
    assert (fin.finish_reason, fin.num_completion_tokens) == ("repetition", 5)
    # New text streams at once; " The launch is" is held (it starts like an earlier sentence) and, once
    # it completes as a repeat, is never sent.
    assert [e.text for e in events[:-1]] == ["The launch", " is on 3 March.", " It is soon.", "", ""]
    assert fin.text == "The launch is on 3 March. It is soon."
    # What was withheld is reported, with where the sentence it repeats begins in the answer.
    assert fin.repeated_line == RepeatedLine("The launch is on 3 March.", 0)


def test_a_repetition_stop_inside_a_code_block_closes_the_fence(tiny_engine, layout, monkeypatch) -> None:
    script = iter(["Run:\n", "```python\n", *["value = compute(1)\n"] * 4, "more"])
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(script))
    _, fin = _run(tiny_engine, layout, SamplingParams(max_tokens=7, ignore_eos=True, stop_on_repeated_line=True))
    assert fin.finish_reason == "repetition"
    # A line three times in a row may be an example; its fourth copy is withheld, reported, and the fence closed.
    assert fin.text == "Run:\n```python\n" + "value = compute(1)\n" * 3 + "```"
    assert fin.repeated_line == RepeatedLine("value = compute(1)", 53)  # the copy before it begins at 53


LOOP_SCRIPT = ["Use", " `", "test", "_client", ".get", "`", " and"] * 6  # a 135M model's answer, as tokens


def test_a_loop_inside_one_line_ends_after_its_first_copy(tiny_engine, layout, monkeypatch) -> None:
    script = iter(LOOP_SCRIPT)
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(script))
    sampling = SamplingParams(max_tokens=len(LOOP_SCRIPT), ignore_eos=True, stop_on_repeated_line=True)
    events = list(tiny_engine.generate(GenerationRequest("t", layout, None, "full", sampling=sampling)))
    fin = events[-1]
    # The fourth copy completes at token 28; of the repeats only "Use", which starts them, was ever sent.
    assert (fin.finish_reason, fin.num_completion_tokens) == ("repetition", 28)
    assert fin.text == "Use `test_client.get` andUse"
    assert "".join(e.text for e in events[:-1]) == fin.text
    assert fin.repeated_line == RepeatedLine("Use `test_client.get` and", 0)  # the unit the line repeats


# Legitimate repetition inside a line: rules, rows of values, a value list written out three times, code.
NOT_LOOPS = [
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    "| 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |",
    "x = [1, 2, 3, 1, 2, 3, 1, 2, 3]",
    "=" * 80,
    "client.get('/a'); client.get('/b'); client.get('/c'); client.get('/d')",
    "Use `test_client.get` and `test_client.post` and `test_client.put` and `test_client.delete`.",
]


@pytest.mark.parametrize("line", NOT_LOOPS)
def test_legitimate_repetition_in_a_line_streams_whole_and_is_no_loop(line: str) -> None:
    guard = RepeatedLineGuard(enabled=True)
    sent = [guard.push(ch) for ch in "Here:\n" + line + "\n"]
    assert not any(stopped for _, stopped in sent)
    assert "".join(text for text, _ in sent) + guard.flush() == "Here:\n" + line + "\n"
    assert find_inline_loop(line) is None


@pytest.mark.parametrize(
    ("text", "loop"),
    [
        # The run reaches back over the space before it: 89 periodic characters, 4 + 1/22 copies.
        ("Call " + "`test_client.get` and " * 4, InlineLoop(start=4, period=22, num_copies=89 / 22)),
        ("Call " + "`test_client.get` and " * 3, None),  # three copies: not yet
        ("Note: " + "the same words again " * 5, InlineLoop(start=5, period=21, num_copies=106 / 21)),
        ("abcdefg " * 4, InlineLoop(start=0, period=8, num_copies=4.0)),
        ("abc " * 8, None),  # its period is 4 characters: a repeat too short to call a loop
        ("first line " * 4 + "\nthen other text", None),  # a loop is searched in the current line only
    ],
)
def test_find_inline_loop(text: str, loop: InlineLoop | None) -> None:
    assert find_inline_loop(text) == loop


def test_held_text_is_released_at_the_end_of_a_run() -> None:
    guard = RepeatedLineGuard(enabled=True)
    assert guard.push("First sentence here. Second one. First sent") == ("First sentence here. Second one.", None)
    assert guard.push("ence") == ("", None)  # still the start of the first sentence: held
    assert guard.push(" is new") == (" First sentence is new", None)  # departed from it: released
    # ". First sentence" also echoes the line a unit back (the ". First sentence" 23 characters earlier): held.
    assert guard.push(". First sentence") == ("", None)
    assert guard.flush() == ". First sentence"
    assert RepeatedLineGuard(enabled=False).push("A b c d. A b c d.") == ("A b c d. A b c d.", None)


# Answers with code as a coder model writes them, a line a token: a second example that starts like the first,
# and a loop of two lines.
SECOND_EXAMPLE = [
    "Define a model:\n",
    "```python\n",
    "from pydantic import BaseModel\n",
    "\n",
    "class User(BaseModel):\n",
    "    name: str\n",
    "```\n",
    "Then validate it:\n",
    "```python\n",
    "from pydantic import BaseModel\n",
    "\n",
    "class Item(BaseModel):\n",
    "    price: float\n",
    "```\n",
]
CODE_CYCLE = ["Run it:\n", "```python\n", *["x = compute(1)\n", "y = compute(2)\n"] * 3, "more"]
# The default model's answer to "How do I cache the results of an expensive function with functools?": the same
# call three times in a row shows the cache at work (the former rule stopped it at the second call).
CACHE_EXAMPLE = (
    "```python\nimport functools\n\n@functools.lru_cache(maxsize=128)\ndef expensive_function(x):\n"
    "    return x * x\n\n# Call the function multiple times\n"
    + "print(expensive_function(3))  # Output: 9\n" * 3
    + "```\n"
)
BRACES = "```js\nif (a) {\n  if (b) {\n    f();\n  }\n}\nif (c) {\n  g();\n}\n```\n"


@pytest.mark.parametrize(
    ("text", "loop"),
    [
        # Prose says a sentence once: its repeat is a loop.
        (
            "The launch is on 3 March. It is soon. The launch is on 3 March.",
            LineLoop(start=38, earlier_start=0, rule="sentence"),
        ),
        ("- Define `User`.\n- Validate it.\n- Define `User`.\n", LineLoop(32, 0, "sentence")),  # a list item
        # Code that recurs for a reason: the same import and fences in a second example, closing braces after
        # other lines or after each other, `return x` in two functions, a heading or a label said again.
        ("".join(SECOND_EXAMPLE[:10]), None),
        ("".join(SECOND_EXAMPLE), None),
        # The same, each example nested in a list item (its fences indented by four spaces).
        (
            "1. Define it:\n    ```python\n    from pydantic import BaseModel\n    ```\n"
            "2. Use it:\n    ```python\n    from pydantic import BaseModel\n",
            None,
        ),
        (BRACES, None),
        ("```js\n      }\n    }\n  }\n}\n", None),  # four closing braces in a row: nested code, not a run
        ("```python\ndef f(x):\n    return x\n\ndef g(x):\n    print(x)\n    return x\n", None),
        ("## Example\nUse it.\n## Example\n", None),
        ("Example:\n```python\nprint(user.name)\n```\nExample:\n", None),
        ("It checks types. For example:\n```python\nUser(name=1)\n```\nIt also coerces values. For example:\n", None),
        (CACHE_EXAMPLE, None),
        # A loop: back-to-back copies whose repeat holds three lines: a line's fourth copy, two lines' third,
        # a longer block's second (an example pasted again).
        ("```python\n" + "value = compute(1)\n" * 3, None),
        ("```python\n" + "value = compute(1)\n" * 4, LineLoop(start=67, earlier_start=48, rule="run")),
        ("".join(CODE_CYCLE[:6]), None),
        ("".join(CODE_CYCLE[:8]), LineLoop(78, 48, "run")),
        ("Example:\n```python\nfoo(1)\n```\n```python\nfoo(1)\n```\n", LineLoop(30, 9, "run")),
        ("Yes. Yes. Yes.", None),
        ("Yes. Yes. Yes. Yes.", LineLoop(15, 10, "run")),
        ("```python\n```\n" * 2, None),
        ("```python\n```\n" * 3, LineLoop(28, 14, "run")),  # an empty code block, again and again
    ],
)
def test_find_line_loop(text: str, loop: LineLoop | None) -> None:
    assert find_line_loop(text) == loop


def test_the_same_import_in_a_second_example_streams_and_does_not_stop(tiny_engine, layout, monkeypatch) -> None:
    script = iter(SECOND_EXAMPLE)
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(script))
    sampling = SamplingParams(max_tokens=len(SECOND_EXAMPLE), ignore_eos=True, stop_on_repeated_line=True)
    events = list(tiny_engine.generate(GenerationRequest("t", layout, None, "full", sampling=sampling)))
    fin = events[-1]
    assert (fin.finish_reason, fin.repeated_line, fin.text) == ("length", None, "".join(SECOND_EXAMPLE))
    # The second example's fence and import start like the first example's lines: held until its next line
    # departs from them, then sent.
    held = ["", "", "", "```python\nfrom pydantic import BaseModel\n\nclass Item(BaseModel):\n"]
    assert [e.text for e in events[:-1]] == [*SECOND_EXAMPLE[:8], *held, *SECOND_EXAMPLE[12:]]


def test_a_two_line_loop_in_code_stops_before_its_third_copy_and_reports_it(
    tiny_engine, layout, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    script = iter(CODE_CYCLE)
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(script))
    sampling = SamplingParams(max_tokens=len(CODE_CYCLE), ignore_eos=True, stop_on_repeated_line=True)
    with caplog.at_level(logging.INFO, logger="engine.generation"):
        events = list(tiny_engine.generate(GenerationRequest("req-7", layout, None, "full", sampling=sampling)))
    fin = events[-1]
    assert (fin.finish_reason, fin.num_completion_tokens) == ("repetition", 8)
    # A copy's first line is held until the copy departs or completes; the third copy is never sent, and the
    # open fence is closed.
    pair = "x = compute(1)\ny = compute(2)\n"
    assert [e.text for e in events[:-1]] == [*CODE_CYCLE[:4], "", pair, "", "```"]
    assert fin.text == "Run it:\n```python\n" + pair * 2 + "```"
    assert fin.repeated_line == RepeatedLine("x = compute(1)\ny = compute(2)", 48)
    assert fin.text[48:].startswith(pair)  # the copy before the withheld one
    assert [r.getMessage() for r in caplog.records if r.name == "engine.generation"] == [
        "request req-7: repetition stop after 8 tokens, withheld 'x = compute(1)\\ny = compute(2)' "
        "(repeats the answer from character 48)"
    ]


def test_without_the_stop_the_same_script_runs_to_length(tiny_engine, layout, monkeypatch) -> None:
    script = iter(["The launch", " is on 3 March.", " It is soon.", " The launch is", " on 3 March.", " More"])
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(script))
    ids, fin = _run(tiny_engine, layout, SamplingParams(max_tokens=6, ignore_eos=True))
    assert (fin.finish_reason, len(ids)) == ("length", 6)


def test_settings_turn_repetition_control_on_with_a_length_that_fits_a_code_example() -> None:
    params = EngineSettings().sampling_params()
    assert params.max_tokens == 320
    assert (params.repetition_penalty, params.no_repeat_ngram_size, params.stop_on_repeated_line) == (1.0, 0, True)
    request_values = EngineSettings(repetition_penalty=1.2).sampling_params(max_tokens=7, temperature=0.5)
    assert (request_values.max_tokens, request_values.temperature, request_values.repetition_penalty) == (7, 0.5, 1.2)
    off = EngineSettings(repetition_penalty=1.0, stop_on_repeated_line=False).sampling_params()
    assert not RepetitionControl(off).adjusts_logits and not RepetitionControl(off).should_stop("A b c d. A b c d.")


@pytest.mark.parametrize(
    "bad", [{"repetition_penalty": 0.9}, {"repetition_penalty": 2.5}, {"no_repeat_ngram_size": -1}]
)
def test_bad_repetition_values_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)

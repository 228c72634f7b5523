"""`blendrag ask` prints the [n] citation marks the chat page shows, streamed on a terminal or once into a pipe."""

from __future__ import annotations

import io

import pytest

from app.cli.answer import AnswerPrinter, with_citation_marks

ANSWER = "Quintaro is the capital. Its rivers are purple! Kites fly in May"
CITATIONS = [
    {"start": 25, "end": 47, "rank": 2, "score": 0.5},  # "Its rivers are purple!"
    {"start": 0, "end": 24, "rank": 1, "score": 0.9},  # "Quintaro is the capital."
    {"start": 48, "end": 64, "rank": 1, "score": 0.4},  # no closing punctuation
]


def test_marks_go_before_each_cited_sentences_closing_punctuation() -> None:
    assert with_citation_marks(ANSWER, CITATIONS) == (
        "Quintaro is the capital [1]. Its rivers are purple [2]! Kites fly in May [1]"
    )
    assert with_citation_marks("It is Quintaro [1].", [{"start": 0, "end": 19, "rank": 1}]) == "It is Quintaro [1]."
    assert with_citation_marks(ANSWER, []) == ANSWER


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_the_marked_answer_once_and_a_terminal_sees_it_stream() -> None:
    pipe = io.StringIO()
    printer = AnswerPrinter(pipe)
    for piece in ("Quintaro is the capital.", " Its rivers are purple!", " Kites fly in May"):
        printer.token(piece)
    assert pipe.getvalue() == ""  # nothing until the answer is complete
    printer.done(ANSWER, CITATIONS)
    assert pipe.getvalue() == "Quintaro is the capital [1]. Its rivers are purple [2]! Kites fly in May [1]"

    terminal = Terminal()
    printer = AnswerPrinter(terminal)
    printer.token("Quintaro is the capital.")
    assert terminal.getvalue() == "Quintaro is the capital."
    printer.done("Quintaro is the capital.", [CITATIONS[1]])
    assert terminal.getvalue() == "Quintaro is the capital.\n\nwith citations:\nQuintaro is the capital [1]."
    uncited = Terminal()
    printer = AnswerPrinter(uncited)
    printer.token("Hello.")
    printer.done("Hello.", [])
    assert uncited.getvalue() == "Hello."  # nothing to mark: not repeated


def test_the_done_line_names_identifiers_no_source_contains_once_each() -> None:
    from app.cli.ask import unsupported_note

    done = {
        "unsupported_identifiers": [
            {"start": 5, "end": 15, "identifier": "exclude_if"},
            {"start": 40, "end": 50, "identifier": "field_name"},
            {"start": 70, "end": 80, "identifier": "exclude_if"},
        ]
    }
    assert unsupported_note(done) == "not in any source (may be invented): exclude_if, field_name"
    assert unsupported_note({"unsupported_identifiers": []}) is None and unsupported_note({}) is None


def test_sources_name_their_section_unless_it_is_the_title(capsys) -> None:
    from app.cli.ask import _print_sources

    page = {"rank": 1, "title": "models.md", "section": "Field aliases", "page": None, "score": 0.61234}
    titled = {"rank": 2, "title": "Models", "section": "Models", "page": 3, "score": 0.5}
    _print_sources([page, titled, {"rank": 3, "title": "notes.txt", "page": None, "score": 0.4}])
    assert capsys.readouterr().out == (
        "\n\nSources:\n  [1] models.md · Field aliases (score 0.612)\n  [2] Models, p. 3 (score 0.500)\n"
        "  [3] notes.txt (score 0.400)\n"
    )


def test_the_timing_line_gives_the_answers_decode_rate(capsys) -> None:
    from app.cli.ask import _print_done

    timings = {"retrieval_ms": 12.3, "kv_load_ms": 4.0, "ttft_ms": 850.4, "total_ms": 4850.0}
    done = {"mode": "blend", "selector": "query", "recompute_ratio": 0.15, "kv_hits": 3, "kv_misses": 0}
    _print_done(done | {"timings": timings | {"decode_tokens_per_s": 12.75}})
    assert capsys.readouterr().out == (
        "\nmode blend (query), recompute ratio 0.15; retrieval 12 ms, KV load 4 ms, TTFT 850 ms, total 4850 ms, "
        "decode 12.8 tokens/s; KV hits 3, misses 0\n"
    )
    # A one-token answer has no decode rate (null), nor has the answer of a server from before it was reported.
    for without in (timings | {"decode_tokens_per_s": None}, timings):
        _print_done(done | {"timings": without})
        assert "total 4850 ms; KV hits 3" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("done", "note"),
    [
        ({"finish_reason": "stop"}, None),
        (
            {"finish_reason": "length", "usage": {"completion_tokens": 320}},
            "answer cut off at 320 tokens (raise it with --max-tokens)",
        ),
        (
            {
                "finish_reason": "repetition",
                "repeated_line": {"text": "x = compute(1)\ny = compute(2)", "earlier_start": 8},
            },
            "stopped: the answer started repeating: «x = compute(1)\ny = compute(2)»",
        ),
        (
            {"finish_reason": "repetition", "repeated_line": {"text": "ab" * 100, "earlier_start": 0}},
            "stopped: the answer started repeating: «" + "ab" * 80 + "…»",
        ),
        # A server from before the withheld repeat was reported.
        ({"finish_reason": "repetition"}, "stopped: the answer started repeating itself"),
        ({"finish_reason": "cancelled"}, "stopped: the server stopped before the answer was done"),
    ],
)
def test_every_end_but_the_answers_own_has_a_note(done: dict, note: str | None) -> None:
    from app.cli.ask import finish_note

    assert finish_note(done) == note


def test_a_repetition_stop_is_said_under_the_answer_with_what_was_withheld(capsys) -> None:
    from app.cli.ask import _AnswerOutput

    answer = "Define the model first. Then validate it."
    done = {
        "answer": answer,
        "mode": "full",
        "selector": None,
        "recompute_ratio": 1.0,
        "kv_hits": 0,
        "kv_misses": 0,
        "finish_reason": "repetition",
        "repeated_line": {"text": "Define the model first.", "earlier_start": 0},
        "usage": {"completion_tokens": 14},
        "timings": {"retrieval_ms": 2.0, "kv_load_ms": 0.0, "ttft_ms": 300.0, "total_ms": 900.0},
    }
    output = _AnswerOutput()  # prints as `blendrag ask` does, from the events the server sends
    output.event("sources", {"sources": []})
    output.event("token", {"text": answer})
    output.event("done", done)
    assert capsys.readouterr().out == (
        f"{answer}\n\nSources: none (no documents match: the answer comes from the model alone)\n"
        "\n[stopped: the answer started repeating: «Define the model first.»]\n"
        "\nmode full, recompute ratio 1.00; retrieval 2 ms, KV load 0 ms, TTFT 300 ms, total 900 ms; "
        "KV hits 0, misses 0\n"
    )
    assert output.code == 0

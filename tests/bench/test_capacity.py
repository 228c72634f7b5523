from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench import capacity
from bench.capacity import (
    Answer,
    QuestionCursor,
    Sources,
    how_to_questions,
    llama_finish_reason,
    llama_server_command,
    parse_llama_line,
    phase_slices,
    retry_after_s,
    same_length,
    summarize,
)

PAGES = [
    ("shutil", "# shutil\n\n## shutil.rmtree(path)\n\nDelete a tree.\n\n## shutil.copytree(src, dst)\n\nCopy.\n"),
    ("heapq", "# heapq\n\n## heapq.heappush(heap, item)\n\nPush.\n\n## shutil.rmtree(path)\n\nA repeat.\n"),
]


def test_how_to_questions_ask_once_per_documented_name_in_a_seeded_order() -> None:
    questions = how_to_questions(PAGES, seed=0)
    assert sorted(questions) == [
        "How do I use `heapq.heappush`? Explain what it does and show a short example.",
        "How do I use `shutil.copytree`? Explain what it does and show a short example.",
        "How do I use `shutil.rmtree`? Explain what it does and show a short example.",
    ]
    assert how_to_questions(PAGES, seed=0) == questions
    assert {tuple(how_to_questions(PAGES, seed=s)) for s in range(10)} != {tuple(questions)}
    with pytest.raises(ValueError, match="no `## name` headings"):
        how_to_questions([("plain", "no headings here")], seed=0)


def test_phases_get_disjoint_slices_and_a_cursor_cycles_through_its_own() -> None:
    assert phase_slices(list("abcdefghij"), 3) == [["a", "b", "c"], ["d", "e", "f"], ["g", "h", "i"]]
    with pytest.raises(ValueError, match="2 questions cannot give 3 phases"):
        phase_slices(["a", "b"], 3)
    cursor = QuestionCursor(["a", "b"])
    assert [cursor.take() for _ in range(5)] == ["a", "b", "a", "b", "a"]


def _answer(started: float, total: float, *, ok: bool = True, status: int = 200, **kw: object) -> Answer:
    return Answer(0, "q", started, status, ok, kw.pop("first", 0.5 if ok else None), total, **kw)  # type: ignore[arg-type]


def test_summarize_counts_the_window_and_every_refusal() -> None:
    answers = [
        _answer(0.0, 10.0, first=1.0, completion_tokens=100, prompt_tokens=900, finish_reason="stop"),
        _answer(10.0, 20.0, first=3.0, completion_tokens=200, prompt_tokens=1100, finish_reason="length"),
        _answer(50.0, 20.0, first=2.0, completion_tokens=50, prompt_tokens=1000, finish_reason="stop"),  # ends at 70
        _answer(1.0, 0.1, ok=False, status=503, retry_after="4"),
        _answer(2.0, 0.1, ok=False, status=429),  # no Retry-After: counted
        _answer(3.0, 0.1, ok=False, status=500, error="HTTP 500: boom"),
        _answer(4.0, 5.0, ok=False, error="ReadError: reset"),
    ]
    row = summarize(answers, window_s=60.0)
    assert row["asked"] == 7 and row["answered"] == 3
    assert row["answers_in_window"] == 2 and row["answers_per_min"] == 2.0
    assert row["tokens_per_s"] == 5.0  # (100 + 200) / 60
    assert row["first_token_p50_s"] == 2.0
    assert row["answer_p50_s"] == 20.0
    assert row["completion_tokens_mean"] == pytest.approx(116.7)
    assert row["prompt_tokens_mean"] == 1000.0
    assert row["finish_reasons"] == {"stop": 2, "length": 1}
    assert (row["status_429"], row["status_503"], row["status_5xx_other"]) == (1, 1, 1)
    assert row["turned_away_without_retry_after"] == 1
    assert row["errors"] == 2
    assert row["error_examples"] == ["HTTP 500: boom", "ReadError: reset"]


def test_summarize_of_a_phase_without_answers() -> None:
    row = summarize([], window_s=30.0)
    assert row["answers_per_min"] == 0.0 and row["first_token_p95_s"] is None and row["completion_tokens_mean"] is None


def test_llama_stream_lines_and_finish_reasons() -> None:
    assert parse_llama_line("") is None and parse_llama_line(": ping") is None
    assert parse_llama_line("data: [DONE]") is None
    assert parse_llama_line('data: {"content": "Hi", "stop": false}') == {"content": "Hi", "stop": False}
    assert llama_finish_reason({"stop": True, "stop_type": "limit"}) == "length"
    assert llama_finish_reason({"stop": True, "stop_type": "eos"}) == "stop"
    assert llama_finish_reason({"stop": True, "stop_type": "word"}) == "stop"
    assert llama_finish_reason({"stop": True, "stopped_limit": True}) == "length"


def test_retry_after_seconds() -> None:
    assert retry_after_s("7") == 7.0
    assert retry_after_s(None) == 1.0
    assert retry_after_s("Wed, 21 Oct 2026 07:28:00 GMT") == 1.0


def test_llama_server_runs_on_the_same_cores_with_slots_of_equal_context() -> None:
    command = llama_server_command(
        Path("/opt/llama-server"), Path("m.gguf"), 8081, threads=2, parallel=4, slot_ctx=4096
    )
    assert command == [
        "/opt/llama-server", "--model", "m.gguf", "--host", "127.0.0.1", "--port", "8081", "--threads", "2",
        "--threads-batch", "2", "--parallel", "4", "--ctx-size", "16384", "--cont-batching", "--no-webui",
    ]  # fmt: skip


def test_same_length_checks_only_the_prompts_our_server_reported() -> None:
    sources = {"a": Sources(["x"], prompt_tokens=3), "b": Sources(["y"], prompt_tokens=5), "c": Sources(["z"])}
    prompts = {"a": [1, 2, 3], "b": [1, 2, 3, 4], "c": [1]}
    assert same_length(prompts, sources) == {"checked": 2, "same": 1}


@dataclass
class _Clock:
    now: float = 0.0


@dataclass
class _Target:
    """Takes one clock second per answer; the first ask of client 1 is turned away with Retry-After 0."""

    clock: _Clock
    name: str = "fake"
    asked: list[tuple[int, str]] = field(default_factory=list)

    async def ask(self, client: int, question: str) -> Answer:
        self.asked.append((client, question))
        await asyncio.sleep(0)  # let the other clients run, as a real request would
        self.clock.now += 1.0
        if client == 1 and len([c for c, _ in self.asked if c == 1]) == 1:
            return Answer(client, question, 0.0, 503, False, None, 0.0, retry_after="0")
        return Answer(client, question, 0.0, 200, True, 0.5, 1.0, completion_tokens=10)


def test_run_phase_is_a_closed_loop_until_the_window_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(capacity.time, "perf_counter", lambda: clock.now)
    target = _Target(clock)
    answers = asyncio.run(capacity.run_phase(target, ["q1", "q2", "q3"], num_clients=2, window_s=4.0, think_s=0.0))
    # Both clients ask at 0. Client 0's answer comes at 1 and it asks again at once; client 1's refusal at 2, and it
    # waits the Retry-After (0 s) before asking again at 3, as client 0 does after its answer at 3; nobody asks at 4.
    assert [(a.client, a.question, a.started_s, a.status) for a in answers] == [
        (0, "q1", 0.0, 200),
        (1, "q2", 0.0, 503),
        (0, "q3", 1.0, 200),
        (0, "q1", 3.0, 200),
        (1, "q2", 3.0, 200),
    ]


@pytest.mark.slow  # a real `blendrag serve` process on the tiny model, asked over HTTP
@pytest.mark.timeout(600)
def test_capacity_end_to_end_through_a_real_server(run_bench, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in PAGES:
        (docs / f"{name}.md").write_text(text, encoding="utf-8")
    code, result, png = run_bench(
        "capacity",
        "--clients", "1,2",
        "--duration-s", "3",
        "--max-tokens", "3",
        "--docs-dir", str(docs),
        "--no-llamacpp",
        "--tmp-dir", str(tmp_path),
    )  # fmt: skip
    assert code == 0 and png.is_file()
    assert result["facts"]["pages"] == 2 and result["facts"]["llama_server"] == "skipped: --no-llamacpp"
    server = result["facts"]["server"]
    assert server["compute"]["dtype"] == "float32" and server["default_mode"] == "blend"
    assert list(result["targets"]) == ["default", "full"]
    for per_n in result["targets"].values():
        assert list(per_n) == ["1", "2"]
        for row in per_n.values():
            assert row["answered"] == row["asked"] >= 1
            assert row["errors"] == 0 and row["status_503"] == 0 and row["status_5xx_other"] == 0
            assert 1 <= row["completion_tokens_mean"] <= 3 and row["prompt_tokens_mean"] > 0
            assert row["server_peak_rss_mib"] > 0
    assert (tmp_path / "capacity-logs" / "blendrag-serve.log").is_file()

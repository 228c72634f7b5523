"""`python -m bench capacity`: a team on one box — N closed-loop clients against the real HTTP server.

What a team feels is what happens when several people ask at once. Per client count N (1, 2, 4, 8, 16 by
default), N clients each ask a question through `POST /ask` (SSE, as the chat page and the CLI do), read the
whole answer, wait `--think-s`, and ask the next, for `--duration-s`. The server is a real `blendrag serve`
process on 127.0.0.1 over a real docs corpus (the standard library pages of bench/docs_corpus.py, or
`--docs-dir`), ingested through `POST /ingest`; rate limits are lifted (`server.ask_rate_per_minute: null`)
and everything else is the server's defaults. Per N: first token p50/p95 (request sent → first token text),
whole answer p50/p95, answers per minute (answers completed inside the window ÷ the window), aggregate
tokens/s (their completion tokens ÷ the window), 429/503 counts and whether each carried `Retry-After` (a
client that gets one waits what it says, as a good client does), errors, and the server's peak RSS.

The same clients then ask in full-prefill mode (`mode: full`, the normal RAG stack on the same server) and,
when a `llama-server` binary is found (`--llama-server`, else `llama-server` on PATH), against llama.cpp's own
server: the same model's GGUF, continuous batching with `--llama-parallel` slots, prompt cache on
(`cache_prompt`). llama.cpp is given exactly the prompts our server built — retrieval done by blendrag: the
sources each question got (the SSE `sources` event, in rank order) laid out by the engine's own
`PromptBuilder`, the token ids sent as `prompt` to `POST /completion` — and the same greedy sampling and
answer length limit. Every phase of every target asks the same questions in the same order: phase k takes
its own slice of the question list, so no phase asks what an earlier one asked (llama.cpp's prompt cache
would otherwise answer a repeat from memory, which a team's new questions never get).

The questions are how-to questions ("How do I use `shutil.copytree`? …"), one per function the pages
document, so answers run to a few hundred tokens and no two asks in a phase retrieve for the same text.

Timing figures: run it alone on the machine (the result records the load average and the CPU's flags).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench import harness
from bench.cluster import Process, free_port
from bench.metrics import percentile
from bench.throughput import RSSSampler

logger = logging.getLogger(__name__)

NAME = "capacity"
HELP = "answers/min and first-token p95 of 1-16 closed-loop clients over HTTP, blend vs full vs llama.cpp"

REPO = Path(__file__).resolve().parents[1]
QUESTION_TEMPLATE = "How do I use `{name}`? Explain what it does and show a short example."
_HEADING = re.compile(r"^##\s+([A-Za-z_][\w.]*)", re.MULTILINE)
READY_TIMEOUT_S = 900.0
# What the result records of the server it measured (its /api/stats): the model, its compute dtype, the mode a
# question gets and the blend settings in force.
SERVER_FACTS = ("model", "compute", "default_mode", "default_recompute_ratio", "blend_settings")


# ----------------------------------------------------------------------------------------------------------
# What is asked


def how_to_questions(pages: Sequence[tuple[str, str]], seed: int) -> list[str]:
    """One how-to question per documented name (a page's `## name(...)` headings), in a seeded order."""
    names = sorted({m.group(1) for _, text in pages for m in _HEADING.finditer(text)})
    if not names:
        raise ValueError("the docs pages have no `## name` headings to ask about")
    rng = random.Random(seed)
    rng.shuffle(names)
    return [QUESTION_TEMPLATE.format(name=name) for name in names]


def phase_slices(questions: Sequence[str], num_phases: int) -> list[list[str]]:
    """Disjoint, equal slices of `questions`, one per phase (a phase cycles through its own slice)."""
    size = len(questions) // num_phases
    if size == 0:
        raise ValueError(f"{len(questions)} questions cannot give {num_phases} phases a question each")
    return [list(questions[k * size : (k + 1) * size]) for k in range(num_phases)]


class QuestionCursor:
    """The next question of a phase, shared by its clients: its slice in order, then again from the start."""

    def __init__(self, questions: Sequence[str]) -> None:
        self._questions, self._next = list(questions), 0

    def take(self) -> str:
        question = self._questions[self._next % len(self._questions)]
        self._next += 1
        return question


# ----------------------------------------------------------------------------------------------------------
# One request as the client saw it, and a phase's summary


@dataclass
class Answer:
    client: int
    question: str
    started_s: float  # since the phase started
    status: int  # HTTP status; 0 when no response came
    ok: bool
    first_token_s: float | None  # sent → first token text
    total_s: float  # sent → done (or failure)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    retry_after: str | None = None  # the header of a 429/503
    error: str | None = None

    @property
    def finished_s(self) -> float:
        return self.started_s + self.total_s


def summarize(answers: Sequence[Answer], window_s: float) -> dict[str, Any]:
    """A phase's figures. Rates count the answers finished inside the window; latencies every answer started
    in it (those still running at its end were awaited, so a slow answer is not left out)."""
    ok = [a for a in answers if a.ok]
    inside = [a for a in ok if a.finished_s <= window_s]
    first = [a.first_token_s for a in ok if a.first_token_s is not None]
    whole = [a.total_s for a in ok]
    turned_away = [a for a in answers if a.status in (429, 503)]
    tokens_inside = sum(a.completion_tokens or 0 for a in inside)
    return {
        "asked": len(answers),
        "answered": len(ok),
        "answers_in_window": len(inside),
        "answers_per_min": round(len(inside) * 60.0 / window_s, 2),
        "tokens_per_s": round(tokens_inside / window_s, 2),
        "first_token_p50_s": _rounded(percentile(first, 50)),
        "first_token_p95_s": _rounded(percentile(first, 95)),
        "answer_p50_s": _rounded(percentile(whole, 50)),
        "answer_p95_s": _rounded(percentile(whole, 95)),
        "completion_tokens_mean": _rounded(
            sum(a.completion_tokens or 0 for a in ok) / len(ok) if ok else None, digits=1
        ),
        "prompt_tokens_mean": _rounded(sum(a.prompt_tokens or 0 for a in ok) / len(ok) if ok else None, digits=1),
        "finish_reasons": dict(Counter(a.finish_reason or "?" for a in ok)),
        "status_429": sum(a.status == 429 for a in answers),
        "status_503": sum(a.status == 503 for a in answers),
        "status_5xx_other": sum(500 <= a.status < 600 and a.status != 503 for a in answers),
        "turned_away_without_retry_after": sum(a.retry_after is None for a in turned_away),
        "errors": sum(not a.ok and a.status not in (429, 503) for a in answers),
        "error_examples": sorted({a.error for a in answers if a.error and a.status not in (429, 503)})[:3],
    }


def _rounded(value: float | None, digits: int = 3) -> float | None:
    """Rounded; None for no value (percentile's NaN of an empty list too: JSON has no NaN)."""
    return None if value is None or math.isnan(value) else round(value, digits)


# ----------------------------------------------------------------------------------------------------------
# Targets: our server in one mode, or llama.cpp's server


class Target(Protocol):
    name: str

    async def ask(self, client: int, question: str) -> Answer: ...


@dataclass
class Sources:
    """The passages one question was given, best first, as the `sources` SSE event listed them, and the prompt
    length our server reported for it (the check that llama.cpp is given the same prompt)."""

    texts: list[str]
    prompt_tokens: int | None = None


@dataclass
class BlendragTarget:
    """POST /ask with SSE, in one mode (None: the server's default, as a user's request leaves it out)."""

    name: str
    client: Any  # httpx.AsyncClient
    mode: str | None
    max_tokens: int
    sources: dict[str, Sources] = field(default_factory=dict)

    def body(self, question: str, max_tokens: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "question": question,
            "max_tokens": self.max_tokens if max_tokens is None else max_tokens,
            "temperature": 0.0,
            "stream": True,
        }
        if self.mode is not None:
            body["mode"] = self.mode
        return body

    async def ask(self, client: int, question: str, max_tokens: int | None = None) -> Answer:
        from app.sse_reader import aiter_sse, asse_lines

        t0 = time.perf_counter()
        answer = Answer(client, question, 0.0, 0, False, None, 0.0)
        try:
            async with self.client.stream("POST", "/ask", json=self.body(question, max_tokens)) as response:
                answer.status = response.status_code
                if response.status_code != 200:
                    await refused(answer, response)
                else:
                    async for event, data in aiter_sse(asse_lines(response.aiter_text())):
                        if event == "sources":
                            self.sources[question] = Sources([s["text"] for s in data.get("sources", [])])
                        elif event == "token" and answer.first_token_s is None and data.get("text"):
                            answer.first_token_s = time.perf_counter() - t0
                        elif event == "error":
                            answer.error = f"{data.get('code')}: {data.get('message')}"
                            break
                        elif event == "done":
                            usage = data.get("usage", {})
                            answer.ok = True
                            answer.completion_tokens = usage.get("completion_tokens")
                            answer.prompt_tokens = usage.get("prompt_tokens")
                            answer.finish_reason = data.get("finish_reason")
                            if question in self.sources:
                                self.sources[question].prompt_tokens = answer.prompt_tokens
                            break
                    else:
                        answer.error = "stream ended without done"
        except Exception as exc:  # a refused or dropped connection is a failed request, not a crashed benchmark
            answer.error = f"{type(exc).__name__}: {exc}"
        answer.total_s = time.perf_counter() - t0
        if answer.ok and answer.first_token_s is None:
            answer.first_token_s = answer.total_s  # an empty answer: its first word is its end
        return answer


@dataclass
class LlamaServerTarget:
    """POST /completion of llama.cpp's server with our prompts' token ids, streamed."""

    name: str
    client: Any  # httpx.AsyncClient
    prompts: dict[str, list[int]]  # question → the token ids our server laid out for it
    max_tokens: int

    def body(self, question: str) -> dict[str, Any]:
        return {
            "prompt": self.prompts[question],
            "n_predict": self.max_tokens,
            "temperature": 0.0,  # greedy, as /ask at temperature 0
            "cache_prompt": True,
            "stream": True,
        }

    async def ask(self, client: int, question: str) -> Answer:
        t0 = time.perf_counter()
        answer = Answer(client, question, 0.0, 0, False, None, 0.0, prompt_tokens=len(self.prompts[question]))
        try:
            async with self.client.stream("POST", "/completion", json=self.body(question)) as response:
                answer.status = response.status_code
                if response.status_code != 200:
                    await refused(answer, response)
                else:
                    async for line in response.aiter_lines():
                        chunk = parse_llama_line(line)
                        if chunk is None:
                            continue
                        if answer.first_token_s is None and chunk.get("content"):
                            answer.first_token_s = time.perf_counter() - t0
                        if chunk.get("stop"):
                            answer.ok = True
                            answer.completion_tokens = chunk.get("tokens_predicted")
                            answer.finish_reason = llama_finish_reason(chunk)
                            break
                    else:
                        answer.error = "stream ended without stop"
        except Exception as exc:
            answer.error = f"{type(exc).__name__}: {exc}"
        answer.total_s = time.perf_counter() - t0
        if answer.ok and answer.first_token_s is None:
            answer.first_token_s = answer.total_s
        return answer


async def refused(answer: Answer, response: Any) -> None:
    """A non-200 answer: its status text and the `Retry-After` it carried (None when it carried none)."""
    answer.retry_after = response.headers.get("retry-after")
    text = (await response.aread()).decode(errors="replace")[:160]
    answer.error = f"HTTP {response.status_code}: {text}"


def parse_llama_line(line: str) -> dict[str, Any] | None:
    """One `data: {...}` line of llama.cpp's stream as a dict (None for blank lines and comments)."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if not payload or payload == "[DONE]":
        return None
    return json.loads(payload)


def llama_finish_reason(chunk: dict[str, Any]) -> str:
    """llama.cpp's stop as /ask names it: `stop` (end of sequence or a stop word) or `length`."""
    stop_type = chunk.get("stop_type")
    if stop_type is None:  # older servers: the flags
        stop_type = "limit" if chunk.get("stopped_limit") else "eos"
    return "length" if stop_type == "limit" else "stop"


# ----------------------------------------------------------------------------------------------------------
# A phase: N clients in a closed loop for a fixed time


async def run_phase(
    target: Target, questions: Sequence[str], num_clients: int, window_s: float, think_s: float
) -> list[Answer]:
    """N clients ask one after another until the window closes; what is in flight then is awaited."""
    cursor = QuestionCursor(questions)
    answers: list[Answer] = []
    t0 = time.perf_counter()
    deadline = t0 + window_s

    async def client(index: int) -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter() - t0
            answer = await target.ask(index, cursor.take())
            answer.started_s = started
            answers.append(answer)
            if answer.status in (429, 503):
                # A well-behaved client waits what the server says (a second when it says nothing).
                await asyncio.sleep(retry_after_s(answer.retry_after))
            elif think_s > 0:
                await asyncio.sleep(think_s)

    await asyncio.gather(*(client(i) for i in range(num_clients)))
    return answers


def retry_after_s(header: str | None) -> float:
    """Seconds a `Retry-After` header asks for (its delta-seconds form); 1 when absent or a date."""
    try:
        return max(0.0, float(header)) if header is not None else 1.0
    except ValueError:
        return 1.0


# ----------------------------------------------------------------------------------------------------------
# Processes: our server and llama.cpp's


def wait_http_ok(process: Process, path: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if process.proc.poll() is not None:
            tail = process.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{process.name} exited with {process.proc.returncode} before it was ready:\n{tail}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = httpx.get(process.url + path, timeout=2)
            if response.status_code == 200:
                return
            if response.json().get("status") == "failed":  # /ready: start-up failed, it will not become ready
                raise RuntimeError(f"{process.name} failed to start: {response.json().get('error')}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.name}: {path} not 200 within {timeout_s:.0f} s (log: {process.log})")
        time.sleep(0.5)


def blendrag_env(args: argparse.Namespace) -> dict[str, str]:
    """The server's settings: the defaults, the model asked for, rate limits lifted."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "BLENDRAG_ENGINE__MODEL": args.model,
        "BLENDRAG_SERVER__ASK_RATE_PER_MINUTE": "null",
    }
    if args.models_dir is not None:
        env["BLENDRAG_MODELS_DIR"] = str(args.models_dir)
    if args.threads is not None:
        env["BLENDRAG_ENGINE__NUM_THREADS"] = str(args.threads)
    if args.dtype != "auto":
        env["BLENDRAG_ENGINE__DTYPE"] = args.dtype
    return env


def start_blendrag(args: argparse.Namespace, root: Path) -> Process:
    port = free_port()
    log = root / "blendrag-serve.log"
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--data-dir", str(root / "data")]
    proc = subprocess.Popen(command, cwd=REPO, env=blendrag_env(args), stdout=log.open("wb"), stderr=subprocess.STDOUT)
    process = Process("blendrag serve", proc, log, port)
    wait_http_ok(process, "/ready")
    return process


def llama_server_command(binary: Path, gguf: Path, port: int, threads: int, parallel: int, slot_ctx: int) -> list[str]:
    """llama.cpp's server on the same cores: `parallel` slots of `slot_ctx` tokens each, continuous batching,
    the web UI off."""
    return [
        str(binary),
        "--model", str(gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--threads", str(threads),
        "--threads-batch", str(threads),
        "--parallel", str(parallel),
        "--ctx-size", str(parallel * slot_ctx),
        "--cont-batching",
        "--no-webui",
    ]  # fmt: skip


def start_llama_server(args: argparse.Namespace, root: Path, gguf: Path, parallel: int) -> Process:
    port = free_port()
    log = root / f"llama-server-np{parallel}.log"
    threads = args.threads or os.cpu_count() or 1
    command = llama_server_command(args.llama_server, gguf, port, threads, parallel, args.llama_slot_ctx)
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    process = Process(f"llama-server (-np {parallel})", proc, log, port)
    wait_http_ok(process, "/health")
    return process


# ----------------------------------------------------------------------------------------------------------
# llama.cpp's prompts: our server's, rebuilt from the sources it gave


def llama_prompts(model: str, models_dir: Path | None, sources: dict[str, Sources]) -> dict[str, list[int]]:
    """question → the token ids /ask lays out for it: the engine's PromptBuilder (the server's system prompt and
    question template) over each source's chunk ids, best-ranked nearest the question."""
    from engine.config import EngineSettings
    from engine.engine import _load_tokenizer
    from engine.models.resolve import resolve_model
    from engine.prompt import PromptBuilder
    from ingest.chunker import encode_chunk_text

    settings = EngineSettings()
    path = resolve_model(model, models_dir or harness.default_models_dir()).path
    tokenizer = _load_tokenizer(path)
    builder = PromptBuilder(tokenizer, settings.system_prompt, settings.question_template)
    prompts = {}
    for question, given in sources.items():
        ranked = [encode_chunk_text(tokenizer, text) for text in given.texts]
        prompts[question] = builder.layout_ranked(ranked, question).all_ids()
    return prompts


def same_length(prompts: dict[str, list[int]], sources: dict[str, Sources]) -> dict[str, int]:
    """How many rebuilt prompts have exactly the length our server reported for the same question."""
    known = [q for q in prompts if sources[q].prompt_tokens is not None]
    return {"checked": len(known), "same": sum(len(prompts[q]) == sources[q].prompt_tokens for q in known)}


# ----------------------------------------------------------------------------------------------------------
# The run


def add_args(parser: argparse.ArgumentParser) -> None:
    harness.add_out_arg(parser, "capacity.json")
    parser.add_argument("--plot", type=Path, default=None, help="PNG plot (default: --out with .png)")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="the server's model (engine.model)")
    parser.add_argument("--models-dir", type=Path, default=None, help="model cache (default: the server's)")
    parser.add_argument("--threads", type=int, default=None, help="threads of each server (default: all cores)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="engine.dtype")
    parser.add_argument("--clients", default="1,2,4,8,16", help="client counts, one phase each")
    parser.add_argument("--duration-s", type=float, default=180.0, help="each phase's window")
    parser.add_argument("--think-s", type=float, default=0.0, help="a client's pause between answer and question")
    parser.add_argument("--max-tokens", type=int, default=200, help="answer length limit")
    parser.add_argument(
        "--modes", default="default,full", help="our server's modes (default: what a request leaving it out gets)"
    )
    parser.add_argument("--docs-dir", type=Path, default=None, help="Markdown pages (default: stdlib pages)")
    parser.add_argument("--seed", type=int, default=0, help="question order")
    parser.add_argument(
        "--llama-server",
        type=Path,
        default=Path(shutil.which("llama-server")) if shutil.which("llama-server") else None,
        help="llama.cpp's llama-server binary (default: on PATH; none: llama.cpp is skipped)",
    )
    parser.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp's server")
    parser.add_argument("--llama-parallel", default="8", help="llama-server --parallel slot counts to run")
    parser.add_argument("--llama-slot-ctx", type=int, default=4096, help="context tokens per llama-server slot")
    parser.add_argument("--gguf", type=Path, default=None, help="llama.cpp's GGUF (default: the model's own)")
    parser.add_argument("--tmp-dir", type=Path, default=None, help="where the server's data dir goes")


def main(args: argparse.Namespace) -> int:
    run = harness.RunRecord.start(args)
    client_counts = [int(n) for n in args.clients.split(",") if n]
    modes = [m for m in args.modes.split(",") if m]
    use_llama = args.llama_server is not None and not args.no_llamacpp
    parallels = [int(n) for n in args.llama_parallel.split(",") if n] if use_llama else []
    # One line per poll of /ready would bury the figures.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="blendrag-bench-capacity-", dir=args.tmp_dir) as tmp:
        root = Path(tmp)
        try:
            measured = asyncio.run(_run(args, root, client_counts, modes, parallels))
        finally:  # the servers' logs outlive the temp dir, beside the result
            logs = args.out.parent / f"{args.out.stem}-logs"
            logs.mkdir(parents=True, exist_ok=True)
            for log in root.glob("*.log"):
                shutil.copy(log, logs / log.name)
    result = harness.result_header(
        NAME,
        args,
        model=args.model,
        clients=client_counts,
        duration_s=args.duration_s,
        think_s=args.think_s,
        max_tokens=args.max_tokens,
        **measured,
    )
    harness.write_result(args, result, run, plot)
    for target, per_n in result["targets"].items():
        for n, row in per_n.items():
            logger.info("%s", _line(target, n, row))
    return 0


async def _run(
    args: argparse.Namespace, root: Path, client_counts: list[int], modes: list[str], parallels: list[int]
) -> dict[str, Any]:
    import httpx

    from bench.docs_corpus import read_pages, write_corpus

    docs_dir = args.docs_dir or write_corpus(root / "docs")
    pages = read_pages(docs_dir)
    slices = phase_slices(how_to_questions(pages, args.seed), len(client_counts))
    targets: dict[str, dict[str, Any]] = {}
    facts: dict[str, Any] = {"docs": str(docs_dir) if args.docs_dir else "stdlib pages", "pages": len(pages)}
    # Connections for the largest phase: httpx's default pool of 100 is plenty, the timeout is not (a 16-client
    # queue can hold an answer for minutes).
    timeout = httpx.Timeout(None, connect=30.0)
    sources: dict[str, Sources] = {}  # question → what our server gave it, for llama.cpp's prompts

    server = start_blendrag(args, root)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=timeout) as http:
            await _ingest(http, pages)
            stats = (await http.get("/api/stats")).json()
            facts["server"] = {key: stats.get(key) for key in SERVER_FACTS}
            for mode in modes:
                target = BlendragTarget(mode, http, None if mode == "default" else mode, args.max_tokens, sources)
                await target.ask(0, "What does this documentation cover?", max_tokens=8)  # warm-up, untimed
                targets[mode] = await _phases(target, server.proc.pid, client_counts, slices, args)
            if parallels:
                # Every question llama.cpp will be asked needs the passages our server gives it: /ask's retrieval
                # alone (the MCP `search` tool) for those no phase asked. A question /ask answered keeps the
                # sources it streamed, and `searched_as_asked` checks the two agree.
                searched = {q: await search_sources(http, q) for part in slices for q in part}
                facts["searched_as_asked"] = {
                    "checked": sum(q in sources for q in searched),
                    "same": sum(sources[q].texts == searched[q].texts for q in searched if q in sources),
                }
                sources = {q: sources.get(q, searched[q]) for q in searched}
    finally:
        server.stop()

    if parallels:
        gguf = args.gguf or _model_gguf(args)
        prompts = llama_prompts(args.model, args.models_dir, sources)
        facts["llama_prompts_same_length"] = same_length(prompts, sources)
        facts["llama_server"] = {"binary": args.llama_server.name, "gguf": gguf.name, "slot_ctx": args.llama_slot_ctx}
        for parallel in parallels:
            process = start_llama_server(args, root, gguf, parallel)
            try:
                async with httpx.AsyncClient(base_url=process.url, timeout=timeout) as http:
                    target = LlamaServerTarget(f"llama.cpp -np {parallel}", http, prompts, args.max_tokens)
                    await target.ask(0, slices[0][-1])  # warm-up on a question no phase asks first
                    targets[target.name] = await _phases(target, process.proc.pid, client_counts, slices, args)
            finally:
                process.stop()
    else:
        facts["llama_server"] = (
            "skipped: --no-llamacpp"
            if args.no_llamacpp
            else "skipped: no llama-server binary (--llama-server, or on PATH)"
        )
    return {"targets": targets, "facts": facts}


async def _phases(
    target: Target, pid: int, client_counts: list[int], slices: list[list[str]], args: argparse.Namespace
) -> dict[str, Any]:
    per_n: dict[str, Any] = {}
    for n, questions in zip(client_counts, slices, strict=True):
        sampler = RSSSampler(pid, interval_s=1.0)
        sampler.start()
        load_before = harness.load_avg()
        answers = await run_phase(target, questions, n, args.duration_s, args.think_s)
        row = summarize(answers, args.duration_s)
        row["server_peak_rss_mib"] = round(await sampler.stop() / 2**20, 1)
        row["load_avg_before"], row["load_avg_after"] = load_before, harness.load_avg()
        per_n[str(n)] = row
        logger.info("%s", _line(target.name, str(n), row))
    return per_n


async def search_sources(http: Any, question: str) -> Sources:
    """The passages /ask would give the model for `question`, best first: one MCP `tools/call` of `search`
    (stateless JSON-RPC at /mcp, its structured result the `sources` event's body)."""
    from app.sse_reader import parse_sse

    call = {"name": "search", "arguments": {"question": question}}
    response = await http.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call},
        headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"},
    )
    response.raise_for_status()
    if response.headers["content-type"].startswith("text/event-stream"):
        result = parse_sse(response.text)[-1][1]["result"]
    else:
        result = response.json()["result"]
    if result.get("isError"):
        raise RuntimeError(f"MCP search refused {question!r}: {result.get('content')}")
    return Sources([passage["text"] for passage in result["structuredContent"]["sources"]])


async def _ingest(http: Any, pages: Sequence[tuple[str, str]]) -> None:
    documents = [{"title": title, "text": text, "source": f"{title}.md"} for title, text in pages]
    response = await http.post("/ingest", json={"documents": documents})
    response.raise_for_status()
    job_id = response.json()["job_id"]
    while True:
        job = (await http.get(f"/ingest/jobs/{job_id}")).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            if job["status"] != "succeeded":
                raise RuntimeError(f"ingest job {job_id} {job['status']}: {job.get('errors')}")
            return
        await asyncio.sleep(1.0)


def _model_gguf(args: argparse.Namespace) -> Path:
    from bench.peers import model_gguf

    args.models_dir = args.models_dir or harness.default_models_dir()
    gguf = model_gguf(args)
    if gguf is None:
        raise SystemExit(f"no GGUF for --model {args.model}: give --gguf")
    return gguf


def _line(target: str, n: str, row: dict[str, Any]) -> str:
    return (
        f"{target}, {n} client(s): {row['answers_per_min']} answers/min, {row['tokens_per_s']} tokens/s, first token "
        f"p50 {row['first_token_p50_s']} s p95 {row['first_token_p95_s']} s, answer p95 {row['answer_p95_s']} s "
        f"({row['answers_in_window']} answers, {row['status_429']}×429 {row['status_503']}×503, "
        f"{row['errors']} errors, peak RSS {row['server_peak_rss_mib']} MiB)"
    )


def iter_rows(result: dict[str, Any]) -> Iterator[tuple[str, list[int], dict[str, Any]]]:
    for target, per_n in result["targets"].items():
        yield target, [int(n) for n in per_n], per_n


def plot(result: dict[str, Any], path: Path) -> None:
    """Answers per minute and first-token p95 against the number of clients, one line per target."""
    fig, (rate_ax, ttft_ax) = harness.new_figure(2)
    for target, counts, per_n in iter_rows(result):
        rate_ax.plot(counts, [per_n[str(n)]["answers_per_min"] for n in counts], marker="o", label=target)
        ttft_ax.plot(counts, [per_n[str(n)]["first_token_p95_s"] or 0 for n in counts], marker="o", label=target)
    for ax, label in ((rate_ax, "answers per minute"), (ttft_ax, "first token p95 (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("clients")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    harness.finish_figure(
        fig,
        path,
        result,
        f"answers ≤ {result['max_tokens']} tokens, {result['duration_s']:.0f} s per point, think {result['think_s']} s",
    )

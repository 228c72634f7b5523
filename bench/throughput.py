"""`python -m bench throughput`: concurrent clients asking questions, per mode (blend and full).

Target: a running server (`--url http://host:port`, POST /ask with SSE; `--ingest` first posts the
passages to it) or, by default, the whole app in this process on a temp data dir (the dataset's passages
ingested as one corpus through the IngestService first, each passage one chunk, then AskService).

In-process, it then measures aggregate decode tokens/s at --decode-clients concurrent requests (see
bench/decode_rate.py): the target is ≥ 3× one client's at 8 clients.

Each mode runs as a phase: --clients clients take the questions from a shared queue until all --examples
questions are answered. Reported per mode: requests per minute (completed ÷ phase wall time) and TTFT
p50/p90 as the client sees it (ask sent → first token text), plus the server's own TTFT (retrieval + KV
load + queue + prompt pass). With --rounds > 1 the phases alternate order each round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import decode_rate, harness
from bench.data import Example, load_dataset, select_examples
from bench.ingest_rate import unique_passages
from bench.inprocess import args_settings, ingest_passages, running_app
from bench.metrics import mean, percentile

logger = logging.getLogger(__name__)

NAME = "throughput"
HELP = "requests/min and TTFT p50/p90 of concurrent clients, blend vs full"
# A musique passage is ~550 tokens: a larger chunk budget keeps each passage one chunk, as in `quality`.
CHUNK_TOKENS = 1024


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients")
    parser.add_argument("--url", default=None, help="a running server (default: the app in this process)")
    parser.add_argument("--api-key", default=None, help="bearer token for --url --ingest")
    parser.add_argument("--ingest", action="store_true", help="with --url: post the passages to the server first")
    parser.add_argument("--modes", default="blend,full", help="modes to compare, comma-separated")
    parser.add_argument("--ratio", type=float, default=0.15, help="blend recompute ratio")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length cap per request")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the phases, alternating their order")
    parser.add_argument("--timeout", type=float, default=900.0, help="per-request timeout (s) against --url")
    parser.add_argument(
        "--decode-clients",
        default="1,8",
        help="in-process: aggregate decode tokens/s at these client counts ('' skips)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=64,
        help="decode measurement: tokens each request decodes in the window where all decode at once",
    )
    parser.add_argument("--tmp-dir", type=Path, default=None, help="where the temp data dir goes")
    parser.add_argument(
        "--rss-pid",
        type=int,
        default=None,
        help="with --url: the server's pid; its RSS is reported idle, peak under load and after --rss-settle-s",
    )
    parser.add_argument("--rss-settle-s", type=float, default=15.0, help="idle wait before the 'after' RSS")


def process_rss_bytes(pid: int) -> int | None:
    """VmRSS of a process (Linux /proc), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class RSSSampler:
    """Samples a process's RSS every `interval_s` while running; `peak` is the largest value seen."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, process_rss_bytes(self.pid) or 0)
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> int:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.peak


@dataclass
class AskTiming:
    mode: str
    ok: bool
    ttft_s: float | None  # client side: sent → first token text (→ done when the answer is empty)
    total_s: float
    server_ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


class InProcessClient:
    def __init__(self, state: Any) -> None:
        self.state = state

    async def ask(self, question: str, mode: str, ratio: float | None, top_k: int, max_tokens: int) -> AskTiming:
        from app.services.ask.types import AskRequest, DoneEvent, ErrorEvent, TokenDelta

        request = AskRequest(
            question=question,
            top_k=top_k,
            mode=mode,
            recompute_ratio=ratio,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.0,
        )
        t0 = time.perf_counter()
        first: float | None = None
        async for event in self.state.services.ask.ask(request):
            if isinstance(event, TokenDelta) and first is None and event.text:
                first = time.perf_counter()
            elif isinstance(event, ErrorEvent):
                return AskTiming(mode, False, None, time.perf_counter() - t0, error=f"{event.code}: {event.message}")
            elif isinstance(event, DoneEvent):
                now = time.perf_counter()
                return AskTiming(
                    mode,
                    True,
                    (first or now) - t0,
                    now - t0,
                    event.timings.ttft_ms / 1000,
                    event.usage.prompt_tokens,
                    event.usage.completion_tokens,
                )
        return AskTiming(mode, False, None, time.perf_counter() - t0, error="stream ended without done")


class HttpClient:
    def __init__(self, url: str, timeout: float, api_key: str | None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout, headers=headers)

    async def ask(self, question: str, mode: str, ratio: float | None, top_k: int, max_tokens: int) -> AskTiming:
        from app.sse_reader import aiter_sse, asse_lines

        body: dict[str, Any] = {
            "question": question,
            "top_k": top_k,
            "mode": mode,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
        }
        if ratio is not None:
            body["recompute_ratio"] = ratio
        t0 = time.perf_counter()
        first: float | None = None
        try:
            async with self.client.stream("POST", "/ask", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")[:200]
                    return AskTiming(
                        mode, False, None, time.perf_counter() - t0, error=f"HTTP {response.status_code}: {text}"
                    )
                async for event, data in aiter_sse(asse_lines(response.aiter_text())):
                    if event == "token" and first is None and data.get("text"):
                        first = time.perf_counter()
                    elif event == "error":
                        return AskTiming(
                            mode,
                            False,
                            None,
                            time.perf_counter() - t0,
                            error=f"{data.get('code')}: {data.get('message')}",
                        )
                    elif event == "done":
                        now = time.perf_counter()
                        usage = data.get("usage", {})
                        return AskTiming(
                            mode,
                            True,
                            (first or now) - t0,
                            now - t0,
                            data["ttft_ms"] / 1000,
                            usage.get("prompt_tokens"),
                            usage.get("completion_tokens"),
                        )
        except Exception as exc:  # network trouble is a failed request, not a crashed benchmark
            return AskTiming(mode, False, None, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}")
        return AskTiming(mode, False, None, time.perf_counter() - t0, error="stream ended without done")

    async def ingest(self, passages: list) -> None:
        documents = [{"title": p.title or f"passage {i}", "text": p.text} for i, p in enumerate(passages)]
        response = await self.client.post("/ingest", json={"documents": documents})
        response.raise_for_status()
        job_id = response.json()["job_id"]
        while True:
            job = (await self.client.get(f"/ingest/jobs/{job_id}")).json()
            if job["status"] in ("succeeded", "failed", "cancelled"):
                if job["status"] != "succeeded":
                    raise RuntimeError(f"ingest job {job_id} {job['status']}: {job.get('errors')}")
                return
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        await self.client.aclose()


async def run_phase(
    client: Any, questions: list[str], mode: str, ratio: float | None, num_clients: int, top_k: int, max_tokens: int
) -> tuple[list[AskTiming], float]:
    """All questions asked by num_clients concurrent clients; returns the timings and the wall time."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for q in questions:
        queue.put_nowait(q)
    timings: list[AskTiming] = []

    async def worker() -> None:
        while True:
            try:
                question = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            timings.append(await client.ask(question, mode, ratio, top_k, max_tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(num_clients)))
    return timings, time.perf_counter() - t0


def summarize(timings: list[AskTiming], wall_s: float) -> dict[str, Any]:
    ok = [t for t in timings if t.ok]
    ttft = [t.ttft_s for t in ok if t.ttft_s is not None]
    server = [t.server_ttft_s for t in ok if t.server_ttft_s is not None]
    return {
        "requests": len(timings),
        "errors": len(timings) - len(ok),
        "wall_s": wall_s,
        "requests_per_min": 60 * len(ok) / wall_s if wall_s > 0 else None,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_mean_s": mean(ttft),
        "server_ttft_p50_s": percentile(server, 50),
        "server_ttft_p90_s": percentile(server, 90),
        "total_p50_s": percentile([t.total_s for t in ok], 50),
        "prompt_tokens_mean": mean(t.prompt_tokens for t in ok if t.prompt_tokens is not None),
        "completion_tokens_mean": mean(t.completion_tokens for t in ok if t.completion_tokens is not None),
        "first_errors": [t.error for t in timings if not t.ok][:3],
        # Refused for a full engine: an HTTP 503 (honest admission) vs a 200 whose stream then said `busy`
        # (the admission lie; must stay 0). In-process runs report busy as the latter's error code.
        "busy_503": sum(1 for t in timings if (t.error or "").startswith("HTTP 503")),
        "busy_after_200": sum(1 for t in timings if (t.error or "").startswith("busy:")),
        "share_503": (
            sum(1 for t in timings if (t.error or "").startswith("HTTP 503")) / len(timings) if timings else None
        ),
    }


async def _measure(args: argparse.Namespace, client: Any, examples: list[Example], modes: list[str]) -> dict[str, Any]:
    questions = [e.question for e in examples]
    ratio_of = {m: (args.ratio if m == "blend" else None) for m in modes}
    # Warm-up (not counted): the first ask pays one-time costs (lazy imports, allocator growth).
    await client.ask(questions[0], modes[0], ratio_of[modes[0]], args.passages, 1)
    per_mode: dict[str, list[AskTiming]] = {m: [] for m in modes}
    walls: dict[str, float] = dict.fromkeys(modes, 0.0)
    phases = []
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else list(reversed(modes)):
            load = harness.load_avg()
            timings, wall = await run_phase(
                client, questions, mode, ratio_of[mode], args.clients, args.passages, args.max_tokens
            )
            per_mode[mode].extend(timings)
            walls[mode] += wall
            phases.append(
                {
                    "round": r,
                    "mode": mode,
                    "wall_s": wall,
                    "load_avg": load,
                    "requests": [asdict(t) for t in timings],
                }
            )
            logger.info("throughput round %d %s: %d requests in %.1fs", r, mode, len(timings), wall)
    return {"modes": {m: summarize(per_mode[m], walls[m]) for m in modes}, "phases": phases}


async def _in_process(
    args: argparse.Namespace, examples: list[Example], modes: list[str], data_dir: Path
) -> dict[str, Any]:
    decode_clients = [int(n) for n in args.decode_clients.split(",") if n]
    # Every client's request decodes at once (batched), up to the largest count measured.
    running = max([args.clients, *decode_clients])
    settings = args_settings(
        data_dir,
        args,
        engine={"dtype": args.dtype, "max_running": running, "max_queue": max(running, 16)},
        ingest={"chunk_tokens": CHUNK_TOKENS},
    )
    async with running_app(settings) as state:
        passages = unique_passages(examples, args.passages)
        t0 = time.perf_counter()
        job, _ = await asyncio.to_thread(ingest_passages, state, passages)
        logger.info("ingested %d passages in %.1fs (%s)", len(passages), time.perf_counter() - t0, job.status)
        measured = await _measure(args, InProcessClient(state), examples, modes)
        if decode_clients:
            measured["decode"] = await decode_rate.measure(
                state, examples, decode_clients, args.passages, CHUNK_TOKENS, args.ratio, args.decode_tokens
            )
        engine = state.services.engine
        return measured | {
            "corpus_passages": len(passages),
            "machine": harness.machine_info(engine),
            "model": harness.model_name(engine),
            "blend": harness.blend_settings(engine),
            **harness.compute_dtype(engine),
        }


async def _remote(args: argparse.Namespace, examples: list[Example], modes: list[str]) -> dict[str, Any]:
    client = HttpClient(args.url, args.timeout, args.api_key)
    pid = args.rss_pid
    rss: dict[str, int | None] = {"start": process_rss_bytes(pid) if pid else None}
    try:
        if args.ingest:
            await client.ingest(unique_passages(examples, args.passages))
        if pid:
            await asyncio.sleep(args.rss_settle_s)  # ingest done and idle: what the corpus and KV tier hold
            rss["idle"] = process_rss_bytes(pid)
            sampler = RSSSampler(pid)
            sampler.start()
        measured = await _measure(args, client, examples, modes)
        if pid:
            rss["peak_under_load"] = await sampler.stop()
            await asyncio.sleep(args.rss_settle_s)
            rss["after"] = process_rss_bytes(pid)
            logger.info("server RSS (MiB): %s", {k: (v or 0) >> 20 for k, v in rss.items()})
            measured["rss_bytes"] = rss
        return measured | {"machine": harness.machine_info(), "model": "server's"}
    finally:
        await client.close()


def plot(result: dict[str, Any], path: Path) -> None:
    modes = result["modes"]
    names = list(modes)
    fig, (ax_rpm, ax_ttft) = harness.new_figure(2)
    ax_rpm.bar(names, [modes[m]["requests_per_min"] or 0 for m in names], color="tab:blue")
    ax_rpm.set_title(f"requests / min ({result['clients']} clients)")
    xs = range(len(names))
    ax_ttft.bar([x - 0.2 for x in xs], [modes[m]["ttft_p50_s"] for m in names], 0.4, label="p50")
    ax_ttft.bar([x + 0.2 for x in xs], [modes[m]["ttft_p90_s"] for m in names], 0.4, label="p90")
    ax_ttft.set_xticks(list(xs), names)
    ax_ttft.set_ylabel("s")
    ax_ttft.legend(fontsize=8)
    ax_ttft.set_title("TTFT (client side)")
    harness.finish_figure(fig, path, result, result["target"])


def main(args: argparse.Namespace) -> int:
    run = harness.RunRecord.start(args)
    modes = [m for m in args.modes.split(",") if m]
    examples = select_examples(load_dataset(args.dataset), args.examples, args.seed)
    if args.url:
        measured = asyncio.run(_remote(args, examples, modes))
    else:
        with tempfile.TemporaryDirectory(prefix="blendrag-bench-throughput-", dir=args.tmp_dir) as tmp:
            measured = asyncio.run(_in_process(args, examples, modes, Path(tmp) / "data"))
    result = harness.result_header(
        NAME,
        args,
        target=args.url or "in-process",
        examples=len(examples),
        clients=args.clients,
        ratio=args.ratio,
        max_tokens=args.max_tokens,
        rounds=args.rounds,
        **measured,
    )
    harness.write_result(args, result, run, plot)
    harness.log_rows(logger, result["modes"], _mode_line)
    decode = result.get("decode")
    if decode:
        for n, d in decode["per_clients"].items():
            logger.info(
                "decode, %s client(s): %s tokens/s aggregate (load avg %s)",
                n,
                d["decode_tokens_per_s"],
                d["load_avg"],
            )
        logger.info("decode speedup, most clients vs one: %s", decode["speedup"])
    return 0


def _mode_line(mode: str, m: dict[str, Any]) -> str:
    """A mode's request rate and TTFT under load, and the requests that failed or were turned away."""
    return (
        f"{mode}: {m['requests_per_min'] or 0:.2f} req/min, TTFT p50 {m['ttft_p50_s']:.2f}s p90 {m['ttft_p90_s']:.2f}s "
        f"({m['errors']} errors, {m['busy_503']} × 503, {m['busy_after_200']} × 200-then-busy)"
    )

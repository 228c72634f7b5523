"""The whole application in this process, on a throw-away data dir: what the ingest and throughput
benchmarks drive when no `--url` is given. It is wired exactly as the server wires it (`AppState.load`),
so the measured path is the served path: IngestService (parse → chunk → embed → KV → commit) and
AskService (retrieve → load KV → blend → stream) over the same scheduler."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.state import AppState
    from bench.data import Passage

logger = logging.getLogger(__name__)


def resolve_model(model: str, models_dir: Path) -> str:
    """A checkpoint dir for the settings: a catalogue model or GGUF file is converted once under models_dir
    (not again under every temp data dir)."""
    from engine.models.resolve import resolve_model as resolve

    return str(resolve(model, Path(models_dir)).path)


def bench_settings(data_dir: Path, model: str, models_dir: Path, threads: int | None, **sections: dict[str, Any]):
    """App settings on data_dir; `sections` override whole sub-settings fields, e.g. kvcache={...}."""
    from app.settings import load_settings

    engine = {"model": resolve_model(model, models_dir), "num_threads": threads} | sections.pop("engine", {})
    # No background calibration in a benchmark's app: it would share the cores with what is measured. The
    # blend runs on the settings a fresh server starts with (shipped for the model, else safe).
    sections.setdefault("calibration", {"auto": False})
    return load_settings(data_dir=data_dir, engine={k: v for k, v in engine.items() if v is not None}, **sections)


def args_settings(data_dir: Path, args: Any, **sections: dict[str, Any]):
    """`bench_settings` for a command's own --model, --models-dir, --threads, --decode-weights, --lead-in and
    --dtype (auto: the server's choice for this machine; before, --dtype never reached the app, which computed in
    the CPU's choice)."""
    dtype = getattr(args, "dtype", None)
    if dtype not in (None, "auto"):
        sections["engine"] = {"dtype": dtype} | sections.get("engine", {})
    decode_weights = getattr(args, "decode_weights", None)
    if decode_weights is not None:
        sections["engine"] = {"decode_weights": decode_weights} | sections.get("engine", {})
    if getattr(args, "chunk_lead_in", False):  # --lead-in
        sections["engine"] = {"chunk_lead_in": True} | sections.get("engine", {})
    return bench_settings(data_dir, args.model, args.models_dir, args.threads, **sections)


@contextmanager
def temp_settings(name: str, args: Any, **sections: dict[str, Any]) -> Iterator[Any]:
    """`args_settings` on a throw-away data dir (`blendrag-<name>-…`), deleted when the block ends."""
    with tempfile.TemporaryDirectory(prefix=f"blendrag-{name}-") as tmp:
        yield args_settings(Path(tmp), args, **sections)


async def start_app(settings) -> AppState:
    from app.state import AppState

    state = AppState(settings)
    await state.load()
    if state.load_error is not None:
        raise RuntimeError(f"the app failed to start: {state.load_error}")
    return state


@asynccontextmanager
async def running_app(settings) -> AsyncIterator[AppState]:
    """The app started on `settings` (as the server starts it), closed when the block ends."""
    state = await start_app(settings)
    try:
        yield state
    finally:
        await state.close()


@dataclass
class StageClock:
    """Start time of each ingest stage, from the job's progress callbacks."""

    started: float = field(default_factory=time.perf_counter)
    stage_starts: dict[str, float] = field(default_factory=dict)
    finished: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, job: Any) -> None:
        stage = getattr(job, "stage", None)
        with self._lock:
            if stage and stage not in self.stage_starts:
                self.stage_starts[stage] = now = time.perf_counter()
                total = (getattr(job, "progress", None) or {}).get(stage, {}).get("total")
                logger.info("ingest stage %s (%s items) at %.1fs", stage, total, now - self.started)

    def durations(self) -> dict[str, float]:
        """Seconds per stage: from its start to the next stage's start (the last one to the job's end)."""
        end = self.finished if self.finished is not None else time.perf_counter()
        ordered = sorted(self.stage_starts.items(), key=lambda kv: kv[1])
        out = {}
        for i, (stage, start) in enumerate(ordered):
            stop = ordered[i + 1][1] if i + 1 < len(ordered) else end
            out[stage] = stop - start
        return out


def ingest_passages(state: AppState, passages: list[Passage]) -> tuple[Any, StageClock]:
    """Ingest each passage as one text document in one job, synchronously; returns (job, stage clock)."""
    from app.services.ingest import IngestSource

    assert state.services.ingest is not None
    sources = [IngestSource(kind="text", title=p.title or f"passage {i}", text=p.text) for i, p in enumerate(passages)]
    submitted = state.services.ingest.submit(sources, enqueue=False)
    clock = StageClock()
    job = state.services.ingest.run_job(submitted.job_id, on_progress=clock)
    clock.finished = time.perf_counter()
    return job, clock


async def ask_service(state: AppState, request: Any) -> tuple[Any, list[str], float]:
    """(done event, source titles best first, wall seconds) of one AskRequest through the AskService that
    POST /ask calls; an error event raises."""
    from app.services.ask.types import DoneEvent, ErrorEvent, SourcesEvent

    titles: list[str] = []
    started = time.perf_counter()
    async for event in state.services.ask.ask(request):
        match event:
            case SourcesEvent():
                titles = [s.title for s in event.sources]
            case DoneEvent():
                return event, titles, time.perf_counter() - started
            case ErrorEvent():
                raise RuntimeError(f"/ask failed: {event.message}")
    raise RuntimeError("/ask ended without a done event")


def dir_bytes(path: Path, pattern: str = "*") -> int:
    """Total size of the files under path matching pattern (0 when path does not exist)."""
    path = Path(path)
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


def run(coro):
    """Run a coroutine to completion from synchronous benchmark code."""
    return asyncio.run(coro)

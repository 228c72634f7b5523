"""Decode tokens/s for 1 and N concurrent clients through the engine's scheduler (scripts/device-check.sh).

Each client asks one question over six short passages (full prefill, EOS ignored); all N are submitted at
once and their decode steps run batched, as the server runs them. The window opens when the last client has its
first token and closes when the first client finishes: the aggregate rate is the tokens every client emitted in
it over its length (prompt passes fall outside it). `python scripts/decode_rate.py --model DIR --out F.json`;
`--decode-graphs off` measures eager decode where CUDA graphs would be used (the device check runs both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path

from bench.decode_rate import answer_cap
from engine.config import EngineSettings
from engine.engine import Engine
from engine.scheduler import Scheduler
from engine.types import GenerationRequest, SamplingParams, TokenEvent


async def _client(scheduler: Scheduler, request: GenerationRequest) -> list[float]:
    """The arrival time of each of the request's tokens."""
    times = []
    async for event in scheduler.submit(request):
        if isinstance(event, TokenEvent):
            times.append(time.perf_counter())
    return times


async def aggregate_rate(engine: Engine, num_clients: int, tokens: int) -> dict[str, float]:
    passages = [f"Passage {i}: " + "the quick brown fox jumps over the lazy dog. " * 12 for i in range(6)]
    chunks = [engine.tokenizer.encode(p, add_special_tokens=False) for p in passages]
    layout = engine.prompt.layout(chunks, "What does the fox do?")
    # The earlier clients decode while the later ones' prompt passes run: each cap leaves room for that on top
    # of the window's `tokens` (bench/decode_rate.py answer_cap).
    cap = answer_cap(tokens, num_clients, engine.transformer.cfg.num_layers)
    scheduler = Scheduler(engine, max_queue=num_clients, max_running=num_clients)
    scheduler.start()
    try:
        requests = [
            GenerationRequest(
                f"decode-{i}",
                layout,
                None,
                "full",
                engine.settings.blend_config(),
                SamplingParams(cap, ignore_eos=True),
            )
            for i in range(num_clients)
        ]
        per_client = await asyncio.gather(*(_client(scheduler, r) for r in requests))
    finally:
        scheduler.stop()
    opens = max(times[0] for times in per_client)
    closes = min(times[-1] for times in per_client)
    emitted = sum(sum(1 for t in times if opens < t <= closes) for times in per_client)
    window = closes - opens
    return {
        "clients": num_clients,
        "tokens_per_client": cap,
        "window_s": round(window, 4),
        "tokens_in_window": emitted,
        "tokens_per_s": round(emitted / window, 1) if window > 0 else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=128, help="tokens each client decodes inside the window")
    parser.add_argument("--clients", default="1,8", help="client counts to measure, comma-separated")
    parser.add_argument(
        "--decode-graphs", default="auto", choices=["auto", "off"], help="engine.decode_graphs (auto: captured on CUDA)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    settings = EngineSettings(model=args.model, dtype=args.dtype, decode_graphs=args.decode_graphs)
    engine = Engine(settings, models_dir=Path(args.model).parent)
    # Warm-up at every client count: kernels, allocator, prefix KV, and on CUDA the decode graph of every batch
    # size class the measured runs will step through (captured outside their windows).
    for n in args.clients.split(","):
        asyncio.run(aggregate_rate(engine, int(n), 8))
    runs = [asyncio.run(aggregate_rate(engine, int(n), args.tokens)) for n in args.clients.split(",")]
    graphs = engine.decode_graphs
    out = {
        "model": args.model,
        "device": str(engine.device),
        "dtype": str(engine.dtype),
        "decode_graphs": args.decode_graphs,
        "captured": graphs is not None and graphs.enabled,  # False: eager (off, not CUDA, or a capture failed)
        "runs": runs,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for run in runs:
        logging.info(
            "%d client(s): %.1f tokens/s (%s, %s, decode graphs %s)",
            run["clients"],
            run["tokens_per_s"],
            engine.device,
            engine.dtype,
            "captured" if out["captured"] else "off",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

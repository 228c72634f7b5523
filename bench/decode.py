"""`python -m bench decode`: decode speed and answer fidelity of each weight format decode can read.

For every format in --formats (`engine.decode_weights`: same, int8, int4), in one run:

- **Speed**, through the app as the server runs it (AppState on a throw-away data dir, the scheduler,
  batched decode; bench/decode_rate.py): aggregate decode tokens/s of 1 and 8 concurrent clients, each a
  question over its passages blended from stored KV, EOS ignored, the window where all decode together.
- **Fidelity**, on the engine the speed run served with: each example's prompt (the server's layout and
  default blend) is answered greedily with the model's own weights (the reference); the format then
  decodes the reference's tokens teacher-forced (KL of its next-token distribution against the reference's
  at every step, top-1 agreement) and on its own (whole answers equal to the reference's, the first step
  where they part). The first token comes from the prompt pass, which every format shares. Where int8's
  steps of many requests run W8A8 (`Int8Weight.matmul_w8a8`: the rows quantized too), `int8-w8a8` is that path
  at every step: a row's result there does not depend on the rows beside it, so one request decoded this way
  is what each request of a large step gets.

Formats are interleaved per client count and their order reversed every other round (--rounds), so drifting
load hits all alike; ratios against `same` in one run are the figures to quote.

With --kernels, two measurements below the server come first, on the model's own shapes: one pass of a row
(or --kernel-rows rows) through every layer's GEMMs and the LM head, per format (the weights stream from memory
as in decode), and the engine's decode step alone (`decode_batch`, one request, a --context-token cache) per
format beside `phases.decode`, the one-token prompt pass decode ran before it had a step of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bench import decode_rate, harness
from bench.data import load_dataset, select_examples
from bench.inprocess import running_app, temp_settings
from bench.metrics import mean
from engine.batched_decode import decode_batch

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.working_cache import WorkingCache

logger = logging.getLogger(__name__)

NAME = "decode"
HELP = "decode tokens/s (1 and 8 clients) and answer fidelity per decode weight format"
CHUNK_TOKENS = 1024  # a musique passage is one chunk, as in `throughput`


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--formats", default="same,int8,int4", help="engine.decode_weights values, comma-separated")
    parser.add_argument(
        "--clients", default="1,8", help="client counts for the decode rate, comma-separated ('': fidelity alone)"
    )
    parser.add_argument("--decode-tokens", type=int, default=96, help="tokens each client decodes in the window")
    parser.add_argument("--fidelity-examples", type=int, default=6, help="examples answered for fidelity (0: none)")
    parser.add_argument("--fidelity-tokens", type=int, default=48, help="answer length of the fidelity check")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the speed runs, alternating format order")
    parser.add_argument("--kernels", action="store_true", help="also time the GEMM pass and the bare decode step")
    parser.add_argument("--kernel-rows", default="1,4,8", help="--kernels: rows per GEMM pass, comma-separated")
    parser.add_argument("--context-tokens", type=int, default=3500, help="--kernels: the decode step's cache length")


def main(args: argparse.Namespace) -> int:
    run = harness.RunRecord.start(args)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    clients = [int(n) for n in args.clients.split(",") if n.strip()]
    examples = select_examples(load_dataset(args.dataset), args.examples, args.seed)
    speed: dict[str, list[dict[str, Any]]] = {f: [] for f in formats}
    fidelity: dict[str, Any] = {}
    header: dict[str, Any] = {}
    kernels = _kernels(args, formats) if args.kernels else None
    for round_ in range(args.rounds if clients else 0):  # --clients '': fidelity alone
        order = formats if round_ % 2 == 0 else formats[::-1]
        for fmt in order:
            with temp_settings("decode", args, engine={"decode_weights": fmt}) as settings:
                result = asyncio.run(_speed(settings, examples, clients, args))
            speed[fmt].append(result["rate"])
            header = header or result["header"]
    if args.fidelity_examples > 0:
        fidelity = _fidelity_all(args, formats, examples[: args.fidelity_examples])
    if not header:  # no speed run: the fidelity engine's header
        header = harness.result_header(NAME, args)
    summary = _summary(speed, fidelity, formats, clients)
    out = header | {
        "formats": formats,
        "clients": clients,
        "decode_tokens": args.decode_tokens,
        "fidelity_tokens": args.fidelity_tokens,
        "speed": speed,
        "fidelity": fidelity,
        "kernels": kernels,
        "summary": summary,
    }
    harness.write_result(args, out, run)
    for fmt in formats:
        logger.info("%s: %s", fmt, summary[fmt])
    if kernels is not None:
        logger.info("kernels: %s", kernels)
    return 0


# ----------------------------------------------------------------------------------------- kernels
def _kernels(args: argparse.Namespace, formats: list[str]) -> dict[str, Any]:
    """ms per GEMM pass (all layers + LM head) per format and row count; ms per decode step per format."""
    from engine.decode_weights import DECODE_WEIGHTS_DIR, build_decode_weights
    from engine.extend import decode, extend
    from engine.working_cache import WorkingCache

    engine = harness.build_engine(args, decode_weights="same")
    tf, cfg = engine.transformer, engine.config
    rows_list = [int(n) for n in args.kernel_rows.split(",") if n.strip()]
    cache = WorkingCache.allocate(
        cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, args.context_tokens + 64, engine.dtype, engine.device
    )
    # Any tokens will do for a cache of the right length: the step's cost does not depend on what it holds.
    with torch.no_grad():
        extend(tf, cache, [(7 * i) % cfg.vocab_size for i in range(args.context_tokens)])
    gemm: dict[str, dict[str, float]] = {}
    step: dict[str, float] = {"before (phases.decode)": _step_ms(lambda c: decode(tf, c, 11)[None], cache)}
    for fmt in formats:
        weights = build_decode_weights(engine.model, fmt, Path(args.models_dir) / DECODE_WEIGHTS_DIR).weights  # type: ignore[arg-type]
        gemm[fmt] = {str(n): _gemm_pass_ms(tf, weights, n) for n in rows_list}
        tf.with_decode_weights(weights)
        step[fmt] = _step_ms(lambda c, d=tf.decoder: decode_batch(d, [c], [11]), cache)
        tf.with_decode_weights(engine.model.weights)
        logger.info("%s: GEMM pass %s ms by rows, decode step %.1f ms", fmt, gemm[fmt], step[fmt])
    return {
        "gemm_pass_ms": gemm,
        "decode_step_ms": step,
        "context_tokens": args.context_tokens,
        "load_avg": harness.load_avg(),
    }


@torch.no_grad()
def _gemm_pass_ms(tf: Any, weights: Any, rows: int, repeats: int = 5) -> float:
    from engine.decode_weights import GEMM_FIELDS

    mats = [getattr(layer, name) for layer in weights.layers for name in GEMM_FIELDS] + [weights.lm_head]
    inputs = {}
    for m in mats:
        in_features = _in_features(m)
        inputs.setdefault(in_features, torch.randn(rows, in_features).to(tf.dtype))
    run = [(m, inputs[_in_features(m)]) for m in mats]
    for m, x in run:  # warm-up
        tf.linear(x, m)
    t0 = time.perf_counter()
    for _ in range(repeats):
        for m, x in run:
            tf.linear(x, m)
    return (time.perf_counter() - t0) / repeats * 1e3


def _in_features(weight: Any) -> int:
    return weight.shape[1] if isinstance(weight, torch.Tensor) else weight.in_features


@torch.no_grad()
def _step_ms(fn: Any, cache: WorkingCache, steps: int = 16) -> float:
    work = _clone(cache)
    for _ in range(3):
        fn(work)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn(work)
    return (time.perf_counter() - t0) / steps * 1e3


async def _speed(settings: Any, examples: list, clients: list[int], args: argparse.Namespace) -> dict[str, Any]:
    async with running_app(settings) as state:
        engine = state.services.engine
        # Warm-up: kernels, the allocator and the prompt prefix, outside any window.
        await decode_rate.measure(state, examples[:1], [1], args.passages, CHUNK_TOKENS, _ratio(engine), 4)
        rate = await decode_rate.measure(
            state, examples, clients, args.passages, CHUNK_TOKENS, _ratio(engine), args.decode_tokens
        )
        rate["decode_weights"] = engine.decode_weights.format
        rate["decode_weights_bytes"] = engine.decode_weights.num_bytes
        header = harness.result_header(NAME, args, engine)
        return {"rate": rate, "header": header}


def _ratio(engine: Engine) -> float:
    return engine.settings.blend_config().recompute_ratio


# ---------------------------------------------------------------------------------------- fidelity
def _fidelity_all(args: argparse.Namespace, formats: list[str], examples: list) -> dict[str, Any]:
    """One engine, the reference answers with its own weights, then every format against them."""
    from engine.decode_weights import DECODE_WEIGHTS_DIR, build_decode_weights

    engine = harness.build_engine(args, decode_weights="same")
    decoders = {}
    for fmt in formats:
        weights = build_decode_weights(engine.model, fmt, Path(args.models_dir) / DECODE_WEIGHTS_DIR)  # type: ignore[arg-type]
        engine.transformer.with_decode_weights(weights.weights)
        decoders[fmt] = engine.transformer.decoder
        if weights.w8a8_min_rows is not None:
            engine.transformer.with_decode_weights(_w8a8_every_step(weights.weights))
            decoders[f"{fmt}-w8a8"] = engine.transformer.decoder
    engine.transformer.with_decode_weights(engine.model.weights)
    per_format: dict[str, list[dict[str, Any]]] = {f: [] for f in decoders}
    for example in examples:
        result = _prompt_pass(engine, example, args)
        reference_tokens, reference_logits = _greedy(engine.transformer, result.cache, _first(result), args)
        for fmt, decoder in decoders.items():
            per_format[fmt].append(_compare(decoder, result.cache, _first(result), reference_tokens, reference_logits))
    return {fmt: {"per_example": rows, **_aggregate(rows)} for fmt, rows in per_format.items()}


def _w8a8_every_step(weights: Any) -> Any:
    """The same int8 weights with their W8A8 path taken from one row on."""
    import dataclasses

    from engine.decode_weights import GEMM_FIELDS
    from engine.quantized_weights import Int8Weight

    def every(w: Any) -> Any:
        if not isinstance(w, Int8Weight) or w.batched is None:
            return w
        return dataclasses.replace(w, batched=dataclasses.replace(w.batched, min_rows=1))

    layers = [
        dataclasses.replace(layer, **{n: every(getattr(layer, n)) for n in GEMM_FIELDS}) for layer in weights.layers
    ]
    return dataclasses.replace(weights, layers=layers, lm_head=every(weights.lm_head))


def _prompt_pass(engine: Engine, example: Any, args: argparse.Namespace):
    """The server's prompt for one example (ranked layout, default blend, the passages' stored KV)."""
    from kvcache.types import InMemoryLayerReader

    chunks = [
        engine.tokenizer.encode(p.text, add_special_tokens=False)[:CHUNK_TOKENS]
        for p in example.passages[: args.passages]
    ]
    layout = engine.prompt.layout_ranked(chunks, example.question)
    source = InMemoryLayerReader(engine.precompute_chunks(chunks))
    return engine.prompt_pass(
        layout, source, "blend", engine.settings.blend_config(), extra_capacity=args.fidelity_tokens + 1
    )


def _first(result: Any) -> int:
    return int(result.logits.argmax())


def _clone(cache: WorkingCache) -> WorkingCache:
    from engine.working_cache import WorkingCache

    bias = None if cache.key_bias is None else cache.key_bias.clone()
    return WorkingCache(k=cache.k.clone(), v=cache.v.clone(), length=cache.length, key_bias=bias)


@torch.no_grad()
def _greedy(tf: Any, cache: WorkingCache, first: int, args: argparse.Namespace) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy answer of `fidelity_tokens` tokens after `first`, and the log-probs of every step (vocab,)."""
    cache, tokens, logps = _clone(cache), [first], []
    for _ in range(args.fidelity_tokens):
        logits = decode_batch(tf, [cache], [tokens[-1]])[0]
        logps.append(torch.log_softmax(logits, dim=-1))
        tokens.append(int(logits.argmax()))
    return tokens[1:], logps


@torch.no_grad()
def _compare(
    decoder: Any, cache: WorkingCache, first: int, reference: list[int], reference_logps: list[torch.Tensor]
) -> dict[str, Any]:
    forced, kls, agree = _clone(cache), [], 0
    inputs = [first, *reference[:-1]]
    for token, ref_logp, want in zip(inputs, reference_logps, reference, strict=True):
        logp = torch.log_softmax(decode_batch(decoder, [forced], [token])[0], dim=-1)
        kls.append(float((ref_logp.exp() * (ref_logp - logp)).sum()))
        agree += int(int(logp.argmax()) == want)
    free, tokens = _clone(cache), [first]
    for _ in reference:
        tokens.append(int(decode_batch(decoder, [free], [tokens[-1]])[0].argmax()))
    answer = tokens[1:]
    parted = next((i for i, (a, b) in enumerate(zip(answer, reference, strict=True)) if a != b), None)
    return {
        "kl_mean": mean(kls),
        "kl_max": max(kls),
        "top1_agreement": agree / len(reference),
        "same_answer": parted is None,
        "first_difference": parted,
    }


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kl_mean": mean([r["kl_mean"] for r in rows]),
        "kl_max": max(r["kl_max"] for r in rows),
        "top1_agreement": mean([r["top1_agreement"] for r in rows]),
        "same_answers": sum(r["same_answer"] for r in rows),
        "answers": len(rows),
    }


def _summary(
    speed: dict[str, list[dict[str, Any]]], fidelity: dict[str, Any], formats: list[str], clients: list[int]
) -> dict[str, Any]:
    def rate(fmt: str, n: int) -> float | None:
        values = [r["per_clients"][str(n)]["decode_tokens_per_s"] for r in speed[fmt]]
        values = [v for v in values if v]
        return mean(values) if values else None

    base = {n: rate("same", n) if "same" in formats else None for n in clients}
    out: dict[str, Any] = {}
    for fmt in [*formats, *(f for f in fidelity if f not in formats)]:
        row: dict[str, Any] = {}
        for n in clients if fmt in speed else []:
            value = rate(fmt, n)
            row[f"tokens_per_s_{n}"] = value
            if base[n] and value:
                row[f"vs_same_{n}"] = value / base[n]
        if 1 in clients and max(clients) > 1 and row.get("tokens_per_s_1") and row.get(f"tokens_per_s_{max(clients)}"):
            row["batch_speedup"] = row[f"tokens_per_s_{max(clients)}"] / row["tokens_per_s_1"]
        if fmt in fidelity:
            row |= {k: v for k, v in fidelity[fmt].items() if k != "per_example"}
        out[fmt] = row
    return out

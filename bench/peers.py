"""`python -m bench peers`: time to first token and decode rate of what a CPU user would otherwise run, on the
same token ids.

Every example's prompt is /ask's (prefix, K passages of the dataset, question), as token ids; each peer
prefills exactly those ids and picks the first token, then (but blendrag_full) decodes greedily to
--decode-tokens tokens in all, EOS ignored, interleaved per example (one round: every peer once, in the
order below), so drifting machine load hits all of them alike:

  llamacpp_<q>    llama.cpp full prefill (llama-cpp-python) on the GGUF the model comes from, as shipped
                  (<q> its quantisation: q4_1 for SmolLM2, q4_k_m for Qwen2.5-Coder; --gguf for another)
  llamacpp_f16    llama.cpp on an F16 GGUF written from the same weights (`bench.gguf_f16`, under
                  bench/out/peers/ by default; 270 MB for SmolLM2, 1.3 GB for Qwen; never committed)
  hf_float32      Hugging Face transformers' own forward of the same checkpoint (what a plain RAG stack
  hf_bfloat16     runs), in float32 and in bfloat16
  blendrag_full   our full prefill, in the engine's compute dtype
  blendrag_blend  our default blend (the server's selector and ratio) over the chunks' stored KV, read
                  through the store in --kv-dtype as /ask reads it, then the engine's decode as the server
                  runs it (`Engine.generate`: the server's `engine.decode_weights`, its sampler at
                  temperature 0)

Reported: TTFT median and p90 per peer, and how many times slower each is than the default blend (the
ratio of medians and the median of per-example ratios); decode tokens/s per peer (the tokens after the
first ÷ the time from the first to the last, bench/peer_run.py; median over the examples) and blendrag's
decode rate ÷ each other peer's. Threads: --threads for torch and llama.cpp alike. transformers decodes
with its own KV cache, one `forward` of the last token per step (what `generate` runs, without its
per-step logits processors).

llama.cpp is optional (the `llamacpp` extra builds llama-cpp-python from source, ~10-20 min on two quiet
cores): without it, or with --no-llamacpp, its two rows are left out and the reason recorded. On an
Intel CPU with AMX tiles a GGML_NATIVE=ON build of llama-cpp-python 0.3.36 segfaults in llama_decode
(its AMX path); this non-native build works there:
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
  -DGGML_AMX_BF16=OFF" pip install llama-cpp-python==0.3.36
On a CPU without AMX (e.g. AMD Zen) a default build (no CMAKE_ARGS) works.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness
from bench.llamacpp import LlamaCppRunner, add_n_batch_arg, llama_cpp_available, ours_first_token
from bench.metrics import percentile
from bench.peer_run import PeerRun
from bench.prepared import PreparedPrompt, prepare_prompts

logger = logging.getLogger(__name__)

NAME = "peers"
HELP = (
    "TTFT and decode tokens/s of llama.cpp (the model's GGUF, F16), HF transformers (fp32, bf16), our full prefill "
    "and blend, same ids"
)
F16_DIR = harness.DEFAULT_OUT_DIR / "peers"
BLEND = "blendrag_blend"
DECODE_TOKENS = 64
# llama.cpp's `general.file_type` (enum llama_ftype) for the files a user meets, as a peer's name suffix.
_FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 15: "q4_k_m", 17: "q5_k_m", 18: "q6_k", 32: "bf16"}


def add_args(parser: argparse.ArgumentParser) -> None:
    harness.add_order_arg(parser)
    harness.add_kv_dtype_arg(parser)
    parser.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="llama.cpp's GGUF (default: the file --model comes from: a catalogue model's joined and checked "
        "GGUF, or --model itself when it is a GGUF file)",
    )
    parser.add_argument(
        "--f16-gguf",
        type=Path,
        default=None,
        help=f"F16 GGUF, written if missing (default: {F16_DIR}/<the GGUF's name>.F16.gguf)",
    )
    parser.add_argument("--no-llamacpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--hf-dtypes", default="float32,bfloat16", help="HF transformers dtypes ('' skips)")
    add_n_batch_arg(parser)
    parser.add_argument(
        "--decode-tokens",
        type=_at_least_one,
        default=DECODE_TOKENS,
        help="tokens each peer generates per example, the first included (greedy, EOS ignored); its decode rate "
        "is the tokens after the first ÷ their time (1: TTFT only)",
    )


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1 (the first token), got {value}")
    return value


class HFRunner:
    """transformers' AutoModelForCausalLM forward of a checkpoint dir: prefill the ids, argmax the last row."""

    def __init__(self, path: Path, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()

    def decode(self, token_ids: list[int], num_tokens: int) -> PeerRun:
        """Prefill, then `num_tokens` tokens in all, greedy, EOS ignored: the last token through the model
        with its KV cache (the `cache` each forward returns) per step."""
        torch = self.torch
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model(torch.tensor([token_ids]), use_cache=True, logits_to_keep=1)
            tokens = [int(out.logits[0, -1].argmax())]
            times = [time.perf_counter()]
            while len(tokens) < num_tokens:
                out = self.model(torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True, logits_to_keep=1)
                tokens.append(int(out.logits[0, -1].argmax()))
                times.append(time.perf_counter())
        return PeerRun(times[0] - t0, tuple(tokens), tuple(times))


def _checkpoint_dir(args: argparse.Namespace) -> Path:
    from engine.models.resolve import resolve_model

    return resolve_model(args.model, Path(args.models_dir)).path


def model_gguf(args: argparse.Namespace) -> Path | None:
    """The GGUF llama.cpp runs: --gguf, else the file the model comes from (a catalogue model's, joined from
    its packages and hash-checked, or --model itself when it is a GGUF file); None when there is none."""
    from app.calibration.shipped import model_name
    from engine.models.catalog import catalog_entry
    from engine.models.install import joined_gguf

    if args.gguf is not None:
        return Path(args.gguf)
    if Path(args.model).is_file():
        return Path(args.model)
    entry = catalog_entry(model_name(args.model))
    return None if entry is None else joined_gguf(entry, Path(args.models_dir))[0]


def gguf_peer_name(path: Path) -> str:
    """llamacpp_<quantisation> from the file's own `general.file_type` (llamacpp_gguf when it has none)."""
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("general.file_type")
    kind = _FILE_TYPES.get(int(field.contents())) if field is not None else None
    return f"llamacpp_{kind or 'gguf'}"


def llamacpp_peers(args: argparse.Namespace, n_ctx: int, threads: int) -> tuple[dict[str, Any], str | None]:
    """{name: runner} for llama.cpp's two GGUFs, or ({}, why not)."""
    if args.no_llamacpp:
        return {}, "--no-llamacpp"
    if not llama_cpp_available():
        return {}, "llama_cpp is not importable (install the llamacpp extra)"
    from bench.gguf_f16 import write_f16_gguf

    source = model_gguf(args)
    if source is None:
        return {}, f"no GGUF for --model {args.model} (a checkpoint dir): give --gguf, the file it came from"
    f16 = write_f16_gguf(source, args.f16_gguf or F16_DIR / f"{source.stem}.F16.gguf")
    runners = {
        gguf_peer_name(source): LlamaCppRunner(source, n_ctx, threads, args.n_batch),
        "llamacpp_f16": LlamaCppRunner(f16, n_ctx, threads, args.n_batch),
    }
    return runners, None


def ours_decode(engine: Any, ex: PreparedPrompt, kv_dtype: str, num_tokens: int) -> PeerRun:
    """The server's answer to one prompt: the default blend over the stored KV, then the engine's decode
    (`Engine.generate`, the server's sampler at temperature 0, EOS and the repeated-line stop off) to
    `num_tokens` tokens. TTFT as the engine reports it; each token timed as `generate` yields it."""
    from engine.types import FinishEvent, GenerationRequest, TokenEvent

    settings = engine.settings
    request = GenerationRequest(
        "bench",
        ex.layout,
        ex.source(kv_dtype),
        "blend",
        settings.blend_config(),
        settings.sampling_params(max_tokens=num_tokens, temperature=0.0, ignore_eos=True, stop_on_repeated_line=False),
    )
    tokens: list[int] = []
    times: list[float] = []
    finish: FinishEvent | None = None
    for event in engine.generate(request):
        if isinstance(event, TokenEvent):
            times.append(time.perf_counter())
            tokens.append(event.token_id)
        else:
            finish = event
    if finish is None or len(tokens) != num_tokens:
        raise RuntimeError(f"blendrag answered {len(tokens)} of {num_tokens} tokens ({finish})")
    return PeerRun(finish.ttft_s, tuple(tokens), tuple(times))


def run_peers(
    engine: Any, prepared: list[PreparedPrompt], peers: dict[str, Callable[[PreparedPrompt], PeerRun]]
) -> list[dict[str, Any]]:
    """One round per example, every peer once in order, after one untimed round on the first example."""
    for peer in peers.values():
        peer(prepared[0])
    rows = []
    for n, ex in enumerate(prepared, 1):
        row: dict[str, Any] = {"index": ex.prompt.example.index, "num_prompt_tokens": ex.layout.num_tokens}
        row["ttft_s"], row["first_token"], row["decode_tokens_per_s"] = {}, {}, {}
        for name, peer in peers.items():
            run = peer(ex)
            row["ttft_s"][name], row["first_token"][name] = run.ttft_s, run.first_token
            if run.decode_tokens_per_s is not None:
                row["decode_tokens_per_s"][name] = run.decode_tokens_per_s
        rows.append(row)
        logger.info(
            "peers %d/%d (%d tokens): %s; decode %s",
            n,
            len(prepared),
            ex.layout.num_tokens,
            "  ".join(f"{k}={v:.3f}s" for k, v in row["ttft_s"].items()),
            "  ".join(f"{k}={v:.2f}/s" for k, v in row["decode_tokens_per_s"].items()),
        )
    return rows


def summarize(rows: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    blend = statistics.median(r["ttft_s"][BLEND] for r in rows)
    for name in names:
        values = [r["ttft_s"][name] for r in rows]
        median = statistics.median(values)
        out[name] = {
            "ttft_s_median": round(median, 4),
            "ttft_s_p90": round(percentile(values, 90), 4),
            "times_blend": round(median / blend, 2),
            "times_blend_paired_median": round(
                statistics.median(r["ttft_s"][name] / r["ttft_s"][BLEND] for r in rows), 2
            ),
            "same_first_token_as_blendrag_full": statistics.fmean(
                float(r["first_token"][name] == r["first_token"]["blendrag_full"]) for r in rows
            ),
        }
        rates = [r["decode_tokens_per_s"][name] for r in rows if name in r.get("decode_tokens_per_s", {})]
        if rates:
            out[name]["decode_tokens_per_s_median"] = round(statistics.median(rates), 3)
            out[name]["decode_tokens_per_s_min"] = round(min(rates), 3)
    return out


def decode_ratios(modes: dict[str, dict[str, float]]) -> dict[str, float]:
    """blendrag's decode rate (the default blend's answer) ÷ each other decoding peer's, medians."""
    ours = modes.get(BLEND, {}).get("decode_tokens_per_s_median")
    if not ours:
        return {}
    return {
        name: round(ours / m["decode_tokens_per_s_median"], 3)
        for name, m in modes.items()
        if name != BLEND and m.get("decode_tokens_per_s_median")
    }


def _color(name: str) -> str:
    return "tab:green" if name.startswith("llamacpp") else "tab:orange" if name.startswith("hf") else "tab:blue"


def plot(result: dict[str, Any], path: Path) -> None:
    modes = result["modes"]
    names = list(modes)
    decoding = [n for n in names if "decode_tokens_per_s_median" in modes[n]]
    fig, axes = harness.new_figure(2 if decoding else 1, width_per_panel=7.0)
    ax = axes[0]
    medians = [modes[n]["ttft_s_median"] for n in names]
    ax.bar(names, medians, color=[_color(n) for n in names])
    ax.set_yscale("log")
    for i, name in enumerate(names):
        ax.annotate(f"{modes[name]['times_blend']:.1f}×", (i, medians[i]), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("TTFT (s), median")
    ax.set_title("time to first token (label: × the default blend)", fontsize=9)
    ax.tick_params(axis="x", rotation=30)
    if decoding:
        ax = axes[1]
        rates = [modes[n]["decode_tokens_per_s_median"] for n in decoding]
        ax.bar(decoding, rates, color=[_color(n) for n in decoding])
        for i, rate in enumerate(rates):
            ax.annotate(f"{rate:.1f}", (i, rate), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("decode tokens/s, median")
        ax.set_title(f"decode, one client ({result['decode']['tokens']} tokens, greedy)", fontsize=9)
        ax.tick_params(axis="x", rotation=30)
    harness.finish_figure(
        fig, path, result, f"{result['prompt_tokens_mean']:.0f} tokens", f"{result['threads']} threads"
    )


def main(args: argparse.Namespace) -> int:
    import torch

    run = harness.RunRecord.start(args)
    engine = harness.build_engine(args)
    threads = args.threads or torch.get_num_threads()
    prepared = prepare_prompts(engine, args.dataset, args.examples, args.passages, args.seed, order=args.order)
    num_tokens = args.decode_tokens
    n_ctx = max(p.layout.num_tokens for p in prepared) + num_tokens + 16
    cpp, cpp_skipped = llamacpp_peers(args, n_ctx, threads)
    if cpp_skipped:
        logger.info("llama.cpp left out: %s", cpp_skipped)
    peers: dict[str, Callable[[PreparedPrompt], PeerRun]] = {
        name: (lambda ex, r=runner: r.decode(ex.layout.all_ids(), num_tokens)) for name, runner in cpp.items()
    }
    checkpoint = _checkpoint_dir(args)
    for dtype in [d for d in args.hf_dtypes.split(",") if d]:
        runner = HFRunner(checkpoint, dtype)
        peers[f"hf_{dtype}"] = lambda ex, r=runner: r.decode(ex.layout.all_ids(), num_tokens)
    peers["blendrag_full"] = lambda ex: _first_token_only(*ours_first_token(engine, ex.layout, None, "full", None))
    peers[BLEND] = lambda ex: ours_decode(engine, ex, args.kv_dtype, num_tokens)
    rows = run_peers(engine, prepared, peers)
    modes = summarize(rows, list(peers))
    result = harness.result_header(
        NAME,
        args,
        engine,
        examples=len(rows),
        threads=threads,
        kv_dtype=args.kv_dtype,
        prompt_tokens_mean=statistics.fmean(r["num_prompt_tokens"] for r in rows),
        llamacpp={"skipped": cpp_skipped} if cpp_skipped else _llamacpp_facts(cpp),
        decode={
            "tokens": num_tokens,
            "decode_weights": engine.decode_weights.format,
            "blendrag_vs": decode_ratios(modes),
        },
        modes=modes,
        per_example=rows,
    )
    harness.write_result(args, result, run, plot)
    for name, m in modes.items():
        rate = m.get("decode_tokens_per_s_median")
        logger.info(
            "%-15s TTFT median %.3fs  %.1f× the blend%s",
            name,
            m["ttft_s_median"],
            m["times_blend"],
            "" if rate is None else f"; decode {rate:.2f} tokens/s",
        )
    return 0


def _first_token_only(ttft_s: float, token: int) -> PeerRun:
    return PeerRun(ttft_s, (token,), ())


def _llamacpp_facts(runners: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp

    (peer, source), (_, f16) = runners.items()
    return {
        "version": getattr(llama_cpp, "__version__", "?"),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "gguf": source.gguf.name,
        "peer": peer,
        "f16_gguf": f16.gguf.name,
    }

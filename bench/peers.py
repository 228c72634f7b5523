"""`python -m bench peers`: time to first token of what a CPU user would otherwise run, on the same token ids.

Every example's prompt is /ask's (prefix, K passages of the dataset, question), as token ids; each peer
prefills exactly those ids and picks the first token, interleaved per example (one round: every peer
once, in the order below), so drifting machine load hits all of them alike:

  llamacpp_<q>    llama.cpp full prefill (llama-cpp-python) on the GGUF the model comes from, as shipped
                  (<q> its quantisation: q4_1 for SmolLM2, q4_k_m for Qwen2.5-Coder; --gguf for another)
  llamacpp_f16    llama.cpp on an F16 GGUF written from the same weights (`bench.gguf_f16`, under
                  bench/out/peers/ by default; 270 MB for SmolLM2, 1.3 GB for Qwen; never committed)
  hf_float32      Hugging Face transformers' own forward of the same checkpoint (what a plain RAG stack
  hf_bfloat16     runs), in float32 and in bfloat16
  blendrag_full   our full prefill, in the engine's compute dtype
  blendrag_blend  our default blend (the server's selector and ratio) over the chunks' stored KV, read
                  through the store in --kv-dtype as /ask reads it

Reported: TTFT median and p90 per peer, and how many times slower each is than the default blend (the
ratio of medians and the median of per-example ratios). Threads: --threads for torch and llama.cpp alike.

llama.cpp is optional (the `llamacpp` extra builds llama-cpp-python from source, ~10-20 min on two
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
from bench.llamacpp import LlamaCppRunner, llama_cpp_available, ours_first_token
from bench.metrics import percentile
from bench.prepared import PreparedPrompt, prepare_prompts

logger = logging.getLogger(__name__)

NAME = "peers"
HELP = "TTFT of llama.cpp (the model's GGUF, F16), HF transformers (fp32, bf16), our full prefill and blend, same ids"
F16_DIR = harness.DEFAULT_OUT_DIR / "peers"
BLEND = "blendrag_blend"
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
    parser.add_argument("--n-batch", type=int, default=512, help="llama.cpp prompt batch size")


class HFRunner:
    """transformers' AutoModelForCausalLM forward of a checkpoint dir: prefill the ids, argmax the last row."""

    def __init__(self, path: Path, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()

    def ttft(self, token_ids: list[int]) -> tuple[float, int]:
        torch = self.torch
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model(torch.tensor([token_ids]), use_cache=True, logits_to_keep=1)
            token = int(out.logits[0, -1].argmax())
            return time.perf_counter() - t0, token


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


def run_peers(
    engine: Any, prepared: list[PreparedPrompt], peers: dict[str, Callable[[PreparedPrompt], tuple[float, int]]]
) -> list[dict[str, Any]]:
    """One round per example, every peer once in order, after one untimed round on the first example."""
    for peer in peers.values():
        peer(prepared[0])
    rows = []
    for n, ex in enumerate(prepared, 1):
        row: dict[str, Any] = {"index": ex.prompt.example.index, "num_prompt_tokens": ex.layout.num_tokens}
        row["ttft_s"], row["first_token"] = {}, {}
        for name, peer in peers.items():
            row["ttft_s"][name], row["first_token"][name] = peer(ex)
        rows.append(row)
        logger.info(
            "peers %d/%d (%d tokens): %s",
            n,
            len(prepared),
            ex.layout.num_tokens,
            "  ".join(f"{k}={v:.3f}s" for k, v in row["ttft_s"].items()),
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
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    modes = result["modes"]
    names = list(modes)
    fig, (ax,) = harness.new_figure(1, width_per_panel=7.0)
    colors = [
        "tab:green" if n.startswith("llamacpp") else "tab:orange" if n.startswith("hf") else "tab:blue" for n in names
    ]
    medians = [modes[n]["ttft_s_median"] for n in names]
    ax.bar(names, medians, color=colors)
    ax.set_yscale("log")
    for i, name in enumerate(names):
        ax.annotate(f"{modes[name]['times_blend']:.1f}×", (i, medians[i]), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("TTFT (s), median; label: × the default blend")
    ax.tick_params(axis="x", rotation=30)
    harness.finish_figure(
        fig, path, result, f"{result['prompt_tokens_mean']:.0f} tokens", f"{result['threads']} threads"
    )


def main(args: argparse.Namespace) -> int:
    import torch

    run = harness.RunRecord()
    engine = harness.build_engine(args)
    threads = args.threads or torch.get_num_threads()
    prepared = prepare_prompts(engine, args.dataset, args.examples, args.passages, args.seed, order=args.order)
    n_ctx = max(p.layout.num_tokens for p in prepared) + 16
    cpp, cpp_skipped = llamacpp_peers(args, n_ctx, threads)
    if cpp_skipped:
        logger.info("llama.cpp left out: %s", cpp_skipped)
    peers: dict[str, Callable[[PreparedPrompt], tuple[float, int]]] = {
        name: (lambda ex, r=runner: r.ttft(ex.layout.all_ids())) for name, runner in cpp.items()
    }
    checkpoint = _checkpoint_dir(args)
    for dtype in [d for d in args.hf_dtypes.split(",") if d]:
        runner = HFRunner(checkpoint, dtype)
        peers[f"hf_{dtype}"] = lambda ex, r=runner: r.ttft(ex.layout.all_ids())
    blend = engine.settings.blend_config()
    peers["blendrag_full"] = lambda ex: ours_first_token(engine, ex.layout, None, "full", None)
    peers[BLEND] = lambda ex: ours_first_token(engine, ex.layout, ex.source(args.kv_dtype), "blend", blend)
    rows = run_peers(engine, prepared, peers)
    result = harness.result_header(
        NAME,
        args,
        engine,
        examples=len(rows),
        threads=threads,
        kv_dtype=args.kv_dtype,
        prompt_tokens_mean=statistics.fmean(r["num_prompt_tokens"] for r in rows),
        llamacpp={"skipped": cpp_skipped} if cpp_skipped else _llamacpp_facts(cpp),
        modes=summarize(rows, list(peers)),
        per_example=rows,
    )
    harness.write_result(args, result, run, plot)
    for name, m in result["modes"].items():
        logger.info("%-15s median %.3fs  %.1f× the blend", name, m["ttft_s_median"], m["times_blend"])
    return 0


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

"""`python -m bench baseline-llamacpp`: full-prefill TTFT of llama.cpp next to ours, same prompts.

llama.cpp (through llama-cpp-python, the optional `llamacpp` extra) runs the built-in model's own GGUF
file (`engine.builtin.builtin_gguf_path()`, Q4_1 weights as shipped) on exactly the token ids our engine
builds (/ask's layout: prefix, K passages, question), with the same thread count. Per example, in one
interleaved round: llama.cpp full prefill + first token, ours full prefill + first token, ours blend@r.
Without llama_cpp installed this exits 0 with a message and writes nothing.

Note the two full prefills differ in weight format: llama.cpp computes on 4-bit Q4_1 weights with its
own kernels, ours on the same weights dequantized to float32 in plain PyTorch.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.metrics import percentile
from bench.peer_run import PeerRun

logger = logging.getLogger(__name__)

NAME = "baseline-llamacpp"
HELP = "full-prefill TTFT of llama.cpp on the same GGUF and prompts"
SKIP_MESSAGE = (
    "baseline-llamacpp skipped: llama_cpp is not importable. Install the optional extra "
    "(pip install 'blendrag[llamacpp]', i.e. llama-cpp-python, which builds llama.cpp from source) "
    "to compare with llama.cpp."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    harness.add_order_arg(parser)
    harness.add_kv_dtype_arg(parser)
    parser.add_argument("--ratio", type=float, default=0.15, help="our blend ratio shown beside the full prefills")
    parser.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: the built-in model's)")
    add_n_batch_arg(parser)


def add_n_batch_arg(parser: argparse.ArgumentParser) -> None:
    """`--n-batch`: the prompt batch size of every `LlamaCppRunner` a run builds."""
    parser.add_argument("--n-batch", type=int, default=512, help="llama.cpp prompt batch size")


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # ImportError, or a broken native library
        return False
    return True


class LlamaCppRunner:
    def __init__(self, gguf: Path, n_ctx: int, n_threads: int, n_batch: int) -> None:
        from llama_cpp import Llama

        self.gguf = Path(gguf)
        self.llm = Llama(
            model_path=str(gguf),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_batch=n_batch,
            verbose=False,
        )

    def ttft(self, token_ids: list[int]) -> tuple[float, int]:
        """(seconds to prefill token_ids from an empty cache and pick the first token, that token)."""
        run = self.decode(token_ids, 1)
        return run.ttft_s, run.first_token

    def decode(self, token_ids: list[int], num_tokens: int) -> PeerRun:
        """Prefill token_ids from an empty cache, then `num_tokens` tokens in all, greedy, EOS ignored: one
        `eval` of the last token and one `sample` per step, as llama-cpp-python's own `generate` loops (n_ctx
        must hold the prompt and the answer)."""
        self.llm.reset()  # n_tokens = 0: nothing of the previous prompt is reused
        t0 = time.perf_counter()
        self.llm.eval(token_ids)
        tokens = [int(self.llm.sample(temp=0.0))]  # temp 0: llama.cpp's greedy sampler
        times = [time.perf_counter()]
        while len(tokens) < num_tokens:
            self.llm.eval([tokens[-1]])
            tokens.append(int(self.llm.sample(temp=0.0)))
            times.append(time.perf_counter())
        return PeerRun(times[0] - t0, tuple(tokens), tuple(times))


def ours_first_token(engine: Any, layout: Any, source: Any, mode: str, blend: Any) -> tuple[float, int]:
    """(TTFT seconds as the engine reports it, first token id) of one request generating one token."""
    from engine.types import FinishEvent, GenerationRequest, SamplingParams, TokenEvent

    request = GenerationRequest(
        "bench",
        layout,
        source,
        mode,
        blend or engine.settings.blend_config(),  # type: ignore[arg-type]
        SamplingParams(max_tokens=1),
    )
    events = list(engine.generate(request))
    token = next(e.token_id for e in events if isinstance(e, TokenEvent))
    finish = next(e for e in events if isinstance(e, FinishEvent))
    return finish.ttft_s, token


def main(args: argparse.Namespace) -> int:
    if not llama_cpp_available():
        print(SKIP_MESSAGE)
        return 0
    import llama_cpp
    import torch

    from bench.passes import blend_name
    from bench.prepared import prepare_prompts
    from engine.builtin import builtin_gguf_path

    run = harness.RunRecord.start(args)
    engine = harness.build_engine(args)
    threads = args.threads or torch.get_num_threads()
    prepared = prepare_prompts(engine, args.dataset, args.examples, args.passages, args.seed, order=args.order)
    gguf = args.gguf or builtin_gguf_path()
    n_ctx = max(p.layout.num_tokens for p in prepared) + 16
    runner = LlamaCppRunner(gguf, n_ctx, threads, args.n_batch)
    blend = engine.settings.blend_config(recompute_ratio=args.ratio)
    blend_key = blend_name(args.ratio)

    # one untimed pass of each, so first-call costs (allocation, page faults) are not in the figures
    runner.ttft(prepared[0].layout.all_ids())
    ours_first_token(engine, prepared[0].layout, None, "full", None)
    rows = []
    for n, ex in enumerate(prepared, 1):
        ids = ex.layout.all_ids()
        cpp_s, cpp_token = runner.ttft(ids)
        ours_s, ours_token = ours_first_token(engine, ex.layout, None, "full", None)
        blend_s, _ = ours_first_token(engine, ex.layout, ex.source(args.kv_dtype), "blend", blend)
        rows.append(
            {
                "index": ex.prompt.example.index,
                "num_prompt_tokens": len(ids),
                "llamacpp_full_s": cpp_s,
                "ours_full_s": ours_s,
                f"ours_{blend_key}_s": blend_s,
                "same_first_token": cpp_token == ours_token,
            }
        )
        logger.info(
            "llama.cpp %d/%d (%d tokens): llama.cpp full %.2fs, ours full %.2fs, ours %s %.2fs",
            n,
            len(prepared),
            len(ids),
            cpp_s,
            ours_s,
            blend_key,
            blend_s,
        )

    def stats(key: str) -> dict[str, float]:
        values = [r[key] for r in rows]
        return {
            "ttft_s_median": statistics.median(values),
            "ttft_s_p90": percentile(values, 90),
            "ttft_s_mean": statistics.fmean(values),
        }

    result = harness.result_header(
        NAME,
        args,
        engine,
        gguf=str(gguf),
        llama_cpp_version=getattr(llama_cpp, "__version__", "?"),
        examples=len(rows),
        threads=threads,
        kv_dtype=args.kv_dtype,
        prompt_tokens_mean=statistics.fmean(r["num_prompt_tokens"] for r in rows),
        modes={
            "llamacpp_full": stats("llamacpp_full_s"),
            "ours_full": stats("ours_full_s"),
            f"ours_{blend_key}": stats(f"ours_{blend_key}_s"),
        },
        first_token_agreement=statistics.fmean(float(r["same_first_token"]) for r in rows),
        weights={"llamacpp": "GGUF as shipped (Q4_1)", "ours": f"dequantized, {engine.dtype}"},
        per_example=rows,
    )
    harness.write_result(args, result, run, plot)
    modes = result["modes"]
    for name, m in modes.items():
        logger.info("%-16s median %.3fs p90 %.3fs", name, m["ttft_s_median"], m["ttft_s_p90"])
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    modes = result["modes"]
    fig, (ax,) = harness.new_figure(1, width_per_panel=5.5)
    names = list(modes)
    ax.bar(names, [modes[n]["ttft_s_median"] for n in names], color=["tab:green", "tab:gray", "tab:blue"])
    ax.set_ylabel("TTFT (s), median")
    harness.finish_figure(
        fig, path, result, f"{result['prompt_tokens_mean']:.0f} tokens", f"{result['threads']} threads"
    )

"""Decode tokens/s of one client on a model (scripts/device-check.sh): one question over six passages, the
answer's tokens after the first timed (EOS ignored). `python scripts/decode_rate.py --model DIR --out F.json`."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from engine.config import EngineSettings
from engine.engine import Engine
from engine.types import FinishEvent, GenerationRequest, SamplingParams


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    engine = Engine(EngineSettings(model=args.model, dtype=args.dtype), models_dir=Path(args.model).parent)
    passages = [f"Passage {i}: " + "the quick brown fox jumps over the lazy dog. " * 60 for i in range(6)]
    chunks = [engine.tokenizer.encode(p, add_special_tokens=False) for p in passages]
    layout = engine.prompt.layout(chunks, "What does the fox do?")
    results = []
    for _ in range(2):  # the first run warms up the kernels
        request = GenerationRequest(
            "decode", layout, None, "full", engine.settings.blend_config(), SamplingParams(args.tokens, ignore_eos=True)
        )
        finish = [e for e in engine.generate(request) if isinstance(e, FinishEvent)][0]
        decode_s = finish.total_s - finish.ttft_s
        results.append({"tokens": finish.num_completion_tokens, "ttft_s": finish.ttft_s, "decode_s": decode_s})
    last = results[-1]
    rate = (last["tokens"] - 1) / last["decode_s"]
    out = {"model": args.model, "device": str(engine.device), "dtype": str(engine.dtype), "runs": results}
    out["decode_tokens_per_s"] = round(rate, 1)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    logging.info("decode %.1f tokens/s (%s, %s)", rate, engine.device, engine.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

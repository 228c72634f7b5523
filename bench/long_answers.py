"""`python -m bench long-answers`: whole answers of a few hundred tokens, the default blend against full prefill.

First-token KL and 32-token look-ups do not see an answer that starts right and drifts: into pasted documentation,
into a loop the repetition stop ends. This benchmark asks the docs questions (the standard library's reference
pages of bench/docs_corpus.py, or --docs-dir), each followed by a how-to request (HOWTO) unless --as-written,
through the AskService that POST /ask calls, greedy, up to --max-tokens, in full prefill and in the server's
default blend (and at --ratios), and reports per mode:

- finish reasons (stop, length, repetition), with the line each repetition stop withheld when the engine reports it;
- against full prefill's answer to the same question: identical answers, the divergence point (the first token,
  in the engine tokenizer's ids of the two answers, where they differ), the token-level F1 of the whole answers,
  and "agrees": identical, or F1 ≥ --agree-f1 with the same finish reason;
- the right answers (the answer key's names, as bench answers reads them).

`--ship` makes the run the record's check part (app/calibration/long_answers_check.py): the default blend's
repetition stops and unfinished (length) answers each within full prefill's + 1, written into the shipped record
of the model and dtype as `measured["long_answers_check"]`, refused (exit 1) when missed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from app.calibration.scoring import is_right
from bench import harness
from bench.answers import _ask
from bench.data import Passage
from bench.docs_corpus import read_corpus, write_corpus
from bench.inprocess import args_settings, ingest_passages, running_app
from bench.metrics import f1_score

logger = logging.getLogger(__name__)

NAME = "long-answers"
# What turns a look-up ("Which shlex function returns a shell-escaped version of a string?") into a question whose
# answer runs to a few hundred tokens, as a developer's how-to question does: the answer key still scores the name.
HOWTO = "Explain how to use it, with a short code example."
HELP = "whole answers (finish reasons, divergence from full prefill) of the default blend on the docs questions"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--docs-dir", type=Path, default=None, help="Markdown pages + answer_key.json")
    parser.add_argument("--max-tokens", type=int, default=300, help="answer length cap")
    parser.add_argument("--questions", type=int, default=None, help="ask only the first N questions (default: all)")
    parser.add_argument("--agree-f1", type=float, default=0.8, help="token F1 from which two answers agree")
    parser.add_argument(
        "--ratios", default="", help="also ask in blend at these recompute ratios (blend@r), comma-separated"
    )
    parser.add_argument(
        "--ship",
        action="store_true",
        help="write the check into the model's shipped record for its dtype (measured.long_answers_check; "
        "app/calibration/long_answers_check.py), only when the default blend's repetition stops and unfinished "
        "answers are each within full prefill's + 1; the built-in docs questions with the how-to request only",
    )
    parser.add_argument(
        "--as-written",
        action="store_true",
        help=f"ask the questions as written (short look-ups) instead of with the how-to request {HOWTO!r}",
    )


def divergence(full_ids: list[int], other_ids: list[int]) -> int | None:
    """The first token index where two answers differ; None when they are the same."""
    for i, (a, b) in enumerate(zip(full_ids, other_ids, strict=False)):
        if a != b:
            return i
    return None if len(full_ids) == len(other_ids) else min(len(full_ids), len(other_ids))


def compare(full: dict[str, Any], other: dict[str, Any], agree_f1: float) -> dict[str, Any]:
    """One question's answer against full prefill's."""
    at = divergence(full["token_ids"], other["token_ids"])
    f1 = f1_score(other["answer"], full["answer"])
    same_finish = other["finish_reason"] == full["finish_reason"]
    return {
        "identical": at is None,
        "divergence_token": at,
        "f1_vs_full": round(f1, 4),
        "agrees": at is None or (f1 >= agree_f1 and same_finish),
    }


def summarize(rows: list[dict[str, Any]], num_questions: int) -> dict[str, Any]:
    """A mode's counts over its questions (rows carry `compare`'s fields for modes other than full)."""
    finishes: dict[str, int] = {}
    for row in rows:
        finishes[row["finish_reason"]] = finishes.get(row["finish_reason"], 0) + 1
    out: dict[str, Any] = {
        "questions": num_questions,
        "finish_reasons": dict(sorted(finishes.items())),
        "repetition_stops": finishes.get("repetition", 0),
        "right": sum(r["right"] for r in rows),
        "answer_tokens_mean": round(statistics.fmean(len(r["token_ids"]) for r in rows), 1),
    }
    if rows and "agrees" in rows[0]:
        points = [r["divergence_token"] for r in rows if r["divergence_token"] is not None]
        out |= {
            "identical": sum(r["identical"] for r in rows),
            "agrees": sum(r["agrees"] for r in rows),
            "f1_vs_full_mean": round(statistics.fmean(r["f1_vs_full"] for r in rows), 4),
            "divergence_token_median": statistics.median(points) if points else None,
        }
    return out


async def run_modes(
    state: Any, questions: list[Any], modes: list[str], max_tokens: int, agree_f1: float
) -> dict[str, Any]:
    """Every question in every mode (`blend@r`: the default blend at ratio r), then each against full's."""
    tokenizer = state.services.engine.tokenizer
    per_mode: dict[str, list[dict[str, Any]]] = {}
    for mode in modes:
        rows = []
        name, _, ratio = mode.partition("@")
        for q in questions:
            done, _ = await _ask(state, q.question, name, max_tokens, recompute_ratio=float(ratio) if ratio else None)
            rows.append(
                {
                    "question": q.question,
                    "answer": done.answer,
                    "token_ids": tokenizer.encode(done.answer, add_special_tokens=False),
                    "finish_reason": done.finish_reason,
                    # What the repetition stop withheld (text, and where what it repeats begins), as JSON.
                    "repeated_line": dataclasses.asdict(done.repeated_line) if done.repeated_line else None,
                    "right": any(is_right(done.answer, a) for a in q.answers),
                    "ttft_ms": done.timings.ttft_ms,
                }
            )
            logger.info("%s %r: %s, %d tokens", mode, q.question[:50], done.finish_reason, len(rows[-1]["token_ids"]))
        per_mode[mode] = rows
    full = per_mode.get("full")
    out = {}
    for mode, rows in per_mode.items():
        if full is not None and mode != "full":
            rows = [r | compare(f, r, agree_f1) for f, r in zip(full, rows, strict=True)]
        out[mode] = {**summarize(rows, len(questions)), "answers": rows}
    return out


def _ship(result: dict[str, Any], model: str) -> int:
    """`--ship`: the default blend against full prefill into the shipped record of the model and dtype (exit 1 when
    refused: the target missed, no record, or another fingerprint's record)."""
    from datetime import UTC, datetime

    from app.calibration.long_answers_check import (
        LongAnswersCheck,
        LongAnswersCheckError,
        record_long_answers_check,
    )
    from app.calibration.shipped import model_name

    full, blend = result["modes"]["full"], result["modes"]["blend"]
    check = LongAnswersCheck(
        num_questions=full["questions"],
        max_tokens=result["max_tokens"],
        questions_as=result["questions_as"],
        finish_full=full["finish_reasons"],
        finish_blend=blend["finish_reasons"],
        identical=blend["identical"],
        agrees=blend["agrees"],
        agree_f1=result["agree_f1"],
        f1_vs_full_mean=blend["f1_vs_full_mean"],
        divergence_token_median=blend["divergence_token_median"],
        right_full=full["right"],
        right_blend=blend["right"],
        blend=result["blend"],
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        chunk_lead_in=result.get("chunk_lead_in"),
    )
    return harness.ship_check(
        lambda: record_long_answers_check(check, model_name(model), result["compute_dtype"], result["fingerprint"]),
        LongAnswersCheckError,
        "long-answers",
    )


def main(args: argparse.Namespace) -> int:
    harness.refuse_ship_with_lead_in(args)
    if args.ship and (args.docs_dir is not None or args.as_written or args.questions is not None):
        raise SystemExit("--ship records the built-in docs questions, all of them, with the how-to request")
    run = harness.RunRecord.start(args)
    with tempfile.TemporaryDirectory(prefix="blendrag-long-answers-") as tmp:
        docs_dir = args.docs_dir or write_corpus(Path(tmp) / "docs")
        pages, questions = read_corpus(docs_dir)
        questions = questions[: args.questions] if args.questions is not None else questions
        if not args.as_written:
            questions = [dataclasses.replace(q, question=f"{q.question} {HOWTO}") for q in questions]
        settings = args_settings(Path(tmp) / "data", args, retrieval={"top_k": args.passages})

        async def go() -> dict[str, Any]:
            async with running_app(settings) as state:
                if args.ship and settings.engine.mode != "blend":
                    raise SystemExit(f"--ship checks the default blend; this server's mode is {settings.engine.mode}")
                ingest_passages(state, [Passage(title=t, text=x) for t, x in pages])
                ratios = [f"blend@{float(r)}" for r in args.ratios.split(",") if r.strip()]
                modes = list(dict.fromkeys(["full", settings.engine.mode, *ratios]))
                result = await run_modes(state, questions, modes, args.max_tokens, args.agree_f1)
                engine = state.services.engine
                header = harness.result_header(NAME, args, engine, fingerprint=engine.fingerprint)
                return {**header, "modes": result}

        result = asyncio.run(go())
    result |= {
        "docs_corpus": "--docs-dir" if args.docs_dir else "bench/docs_corpus.py (standard library docstrings)",
        "max_tokens": args.max_tokens,
        "agree_f1": args.agree_f1,
        "questions_as": "written" if args.as_written else f"question + {HOWTO!r}",
        "top_k": args.passages,
    }
    harness.write_result(args, result, run)
    harness.log_rows(logger, result["modes"], _line)
    return _ship(result, settings.engine.model) if args.ship else 0


def _line(mode: str, row: dict[str, Any]) -> str:
    line = f"{mode:6s} finish {row['finish_reasons']}  right {row['right']}/{row['questions']}"
    if "agrees" in row:
        line += (
            f"  identical to full {row['identical']}  agree {row['agrees']}/{row['questions']}"
            f"  F1 vs full {row['f1_vs_full_mean']:.2f}  diverges at token {row['divergence_token_median']}"
        )
    return line

"""`python -m bench answers`: does the model answer? Per model, in full prefill and the default blend.

For each --models entry a throw-away data dir gets two corpora, ingested as the server ingests them:
the look-up documents of `bench lookup` (one made-up fact each: a code, a date, a name) and a real docs
corpus (the standard library's own reference pages, made by bench/docs_corpus.py, or --docs-dir: Markdown
pages + answer_key.json), and the project documents of `bench conversation`'s look-up test (one access code
each). Each look-up and each docs question is asked through the AskService that POST /ask calls, in `full`
and in the server's default blend; an answer is right when it contains the fact (or one of the answer key's
names), normalised. A follow-up is a stored conversation of two turns in the same mode: "Tell me about
project X." then "What is the access code of that project?" (the second turn names no project: the
conversation carries it); it is right when the second answer holds the code. TTFT is the AskService's own
(retrieval + KV load + prompt pass) over the look-ups and docs questions. One table and one plot compare the
models.

Each docs answer also records its citations (app/services/attribution.py): the [n] marks that stand,
the marks shared words alone would have given (before the check that a cited passage holds every code
identifier of its sentence), and the identifiers no source contains (`unsupported_identifiers`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from app.calibration.scoring import is_right
from bench import harness
from bench.conversation import Project, make_projects
from bench.data import Passage
from bench.docs_corpus import read_corpus, write_corpus
from bench.inprocess import bench_settings, ingest_passages, running_app
from bench.lookup import make_facts

logger = logging.getLogger(__name__)

NAME = "answers"
HELP = "look-ups and real docs questions answered right, per model"
DEFAULT_MODELS = "smollm2-135m,qwen2.5-coder-0.5b"


async def _ask(
    state: Any, question: str, mode: str, max_tokens: int, conversation: str | None = None, **fields: Any
) -> tuple[Any, list[Any]]:
    """(done event, sources best first) of one question through the AskService that POST /ask calls; with
    `conversation` ("new" or an id) the turn is recorded in that stored conversation. `fields`: more of the
    request's own values (e.g. recompute_ratio)."""
    from app.services.ask import ConversationRef
    from app.services.ask.types import AskRequest, DoneEvent, ErrorEvent, SourcesEvent

    request = AskRequest(
        question=question,
        mode=mode,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0.0,
        conversation=ConversationRef(conversation) if conversation is not None else None,
        **fields,
    )
    sources: list[Any] = []
    async for event in state.services.ask.ask(request):
        match event:
            case SourcesEvent():
                sources = list(event.sources)
            case DoneEvent():
                return event, sources
            case ErrorEvent():
                raise RuntimeError(f"/ask failed: {event.message}")
    raise RuntimeError("/ask ended without a done event")


def citation_counts(done: Any, sources: list[Any]) -> dict[str, Any]:
    """The [n] marks that stand on the answer (sentence, rank), the marks shared words alone give (before
    the identifier check), and the code identifiers no source contains."""
    from app.services.attribution import SourceText, attribute

    lexical = attribute(done.answer, [SourceText(s.rank, s.text) for s in sources], check_identifiers=False)
    return {
        "marks": [[done.answer[c.start : c.end], c.rank] for c in done.citations],
        "marks_lexical": [[done.answer[c.start : c.end], c.rank] for c in lexical],
        "unsupported": [u.identifier for u in done.unsupported_identifiers],
    }


async def _ask_followup(state: Any, project: Project, mode: str, max_tokens: int) -> dict[str, Any]:
    """Two turns of one stored conversation (the /ask path), both in `mode`; right when turn 2 holds the code."""
    conversation, answers = "new", []
    for question in (f"Tell me about project {project.name}.", "What is the access code of that project?"):
        done, _ = await _ask(state, question, mode, max_tokens, conversation)
        conversation = done.conversation_id
        answers.append(done.answer)
    return {"project": project.name, "answer": answers[-1], "right": is_right(answers[-1], project.code)}


async def run_model(
    state: Any,
    facts: list[Any],
    questions: list[Any],
    projects: list[Project],
    modes: list[str],
    max_tokens: int,
) -> dict:
    out: dict[str, Any] = {}
    for mode in modes:
        lookups, docs, ttfts = [], [], []
        for fact in facts:
            done, sources = await _ask(state, fact.question, mode, max_tokens)
            answer, ttft, titles = done.answer, done.timings.ttft_ms, [s.title for s in sources]
            lookups.append(
                {
                    "question": fact.question,
                    "answer": answer,
                    "right": is_right(answer, fact.answer),
                    "retrieved": fact.title in titles,
                }
            )
            ttfts.append(ttft)
            logger.info("%s look-up %r: %s", mode, fact.answer, "ok" if lookups[-1]["right"] else f"x {answer!r}")
        for q in questions:
            done, sources = await _ask(state, q.question, mode, max_tokens)
            answer, ttft, titles = done.answer, done.timings.ttft_ms, [s.title for s in sources]
            right = any(is_right(answer, a) for a in q.answers)
            docs.append(
                {
                    "question": q.question,
                    "answer": answer,
                    "right": right,
                    "retrieved": q.page in titles,
                    **citation_counts(done, sources),
                }
            )
            ttfts.append(ttft)
            logger.info("%s docs %r: %s", mode, q.answers[0], "ok" if right else f"x {answer!r}")
        followups = []
        for project in projects:
            followups.append(await _ask_followup(state, project, mode, max_tokens))
            logger.info("%s follow-up %r: %s", mode, project.code, "ok" if followups[-1]["right"] else "x")
        out[mode] = {
            "lookups_right": sum(r["right"] for r in lookups),
            "docs_right": sum(r["right"] for r in docs),
            "followups_right": sum(r["right"] for r in followups),
            "lookups_retrieved": sum(r["retrieved"] for r in lookups),
            "docs_retrieved": sum(r["retrieved"] for r in docs),
            "docs_marks": sum(len(r["marks"]) for r in docs),
            "docs_marks_lexical": sum(len(r["marks_lexical"]) for r in docs),
            "docs_unsupported_identifiers": sum(len(r["unsupported"]) for r in docs),
            "ttft_median_ms": round(statistics.median(ttfts), 1),
            "lookups": lookups,
            "docs": docs,
            "followups": followups,
        }
        logger.info(
            "%s: look-ups %d/%d, docs %d/%d, follow-ups %d/%d, TTFT median %.0f ms; "
            "docs marks %d standing of %d by shared words, %d identifiers in no source",
            mode,
            out[mode]["lookups_right"],
            len(facts),
            out[mode]["docs_right"],
            len(questions),
            out[mode]["followups_right"],
            len(projects),
            out[mode]["ttft_median_ms"],
            out[mode]["docs_marks"],
            out[mode]["docs_marks_lexical"],
            out[mode]["docs_unsupported_identifiers"],
        )
    return out


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated engine.model values")
    parser.add_argument("--docs-dir", type=Path, default=None, help="Markdown pages + answer_key.json")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length cap")
    parser.add_argument(
        "--modes", default="full,default", help="comma-separated modes to ask in; 'default': the server's engine.mode"
    )
    parser.add_argument(
        "--docs-questions", type=int, default=None, help="ask only the first N docs questions (default: all)"
    )
    parser.add_argument(
        "--followups", type=int, default=8, help="two-turn conversations (a project, then its access code)"
    )


def plot(result: dict[str, Any], path: Path) -> None:
    fig, (ax, bx) = harness.new_figure(2, width_per_panel=5.5)
    labels, lookups, docs, followups, ttft = [], [], [], [], []
    for model, per_mode in result["models"].items():
        for mode, row in per_mode["modes"].items():
            labels.append(f"{model}\n{mode}")
            lookups.append(row["lookups_right"])
            docs.append(row["docs_right"])
            followups.append(row["followups_right"])
            ttft.append(row["ttft_median_ms"])
    xs = range(len(labels))
    ax.bar([x - 0.27 for x in xs], lookups, 0.27, label=f"look-ups of {result['examples']}")
    ax.bar(list(xs), docs, 0.27, label=f"docs questions of {result['docs_questions']}")
    ax.bar([x + 0.27 for x in xs], followups, 0.27, label=f"follow-ups of {result['followups']}")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("right answers")
    ax.legend(fontsize=7)
    bx.bar(list(xs), ttft, color="tab:gray")
    bx.set_xticks(list(xs), labels, fontsize=7)
    bx.set_ylabel("median TTFT (ms)")
    fig.suptitle(f"answers through /ask · top_k {result['top_k']}", fontsize=9)
    harness.save_figure(fig, path)


def main(args: argparse.Namespace) -> int:
    run = harness.RunRecord.start(args)
    facts = make_facts(args.examples, args.seed)
    projects = make_projects(args.followups, args.seed)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="blendrag-answers-") as tmp:
        docs_dir = args.docs_dir or write_corpus(Path(tmp) / "docs")
        pages, questions = read_corpus(docs_dir)
        questions = questions[: args.docs_questions] if args.docs_questions is not None else questions
        passages = [Passage(title=f.title, text=f.text) for f in facts] + [Passage(title=t, text=x) for t, x in pages]
        passages += [Passage(title=p.title, text=p.text) for p in projects]
        models: dict[str, Any] = {}
        for i, model in enumerate(m.strip() for m in args.models.split(",") if m.strip()):
            settings = bench_settings(
                Path(tmp) / f"data-{i}", model, args.models_dir, args.threads, retrieval={"top_k": args.passages}
            )

            async def go(settings: Any = settings) -> dict[str, Any]:
                async with running_app(settings) as state:
                    ingest_passages(state, passages)
                    engine = state.services.engine
                    modes = [settings.engine.mode if m == "default" else m for m in args.modes.split(",") if m]
                    modes = await run_model(
                        state, facts, questions, projects, list(dict.fromkeys(modes)), args.max_tokens
                    )
                    return {"served_model": harness.result_header(NAME, args, engine), "modes": modes}

            logger.info("model %s", model)
            models[model] = asyncio.run(go())
        first = next(iter(models.values()))["served_model"]
        result = {
            **first,
            "models": models,
            "docs_questions": len(questions),
            "followups": len(projects),
            "docs_corpus": "--docs-dir" if args.docs_dir else "bench/docs_corpus.py (standard library docstrings)",
            "top_k": args.passages,
            "max_tokens": args.max_tokens,
        }
    harness.write_result(args, result, run, plot)
    for model, per_model in result["models"].items():
        for mode, row in per_model["modes"].items():
            logger.info(
                "%-20s %-6s look-ups %2d/%d  docs %2d/%d  follow-ups %2d/%d  TTFT %6.0f ms",
                model,
                mode,
                row["lookups_right"],
                len(facts),
                row["docs_right"],
                len(questions),
                row["followups_right"],
                len(projects),
                row["ttft_median_ms"],
            )
    return 0

"""`python -m bench lookup`: are look-up answers as right as full prefill's? Through the real /ask path.

A corpus of short made-up documents, each holding one unique fact (an access code, an opening date, the
name of a head), is ingested into a throw-away data dir by the IngestService (parse → chunk → embed →
KV precompute → commit, as the server does). Each document's question is then asked through the AskService
that POST /ask calls (retrieve → load stored KV → prompt pass → greedy answer), once per mode: full,
reuse, and blend with each --selectors at --ratio. An answer is right when it contains the fact
(normalised: case, punctuation and spaces ignored). Retrieval is the same for every mode; whether the
fact's document was retrieved first is reported too.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.calibration.calset import access_code
from app.calibration.scoring import is_right
from bench import harness
from bench.candidates import read_candidates
from bench.data import Passage
from bench.inprocess import ask_service, ingest_passages, running_app, temp_settings

logger = logging.getLogger(__name__)

NAME = "lookup"
HELP = "look-up questions answered right per mode, through /ask"

_PLACES = [
    "Harbor Lab",
    "Orvel Bridge",
    "Tarsin Observatory",
    "Kessel Library",
    "Mirren Dam",
    "Quill Museum",
    "Dovan Clinic",
    "Brask Station",
    "Pellow Archive",
    "Ostra Foundry",
    "Vantor Mill",
    "Lumen Hall",
    "Corvid Tower",
    "Saltmere Depot",
    "Fennick School",
    "Gault Hospital",
    "Ivory Quay",
    "Juno Garage",
    "Nettle Farm",
    "Rook Theatre",
    "Amber Yard",
    "Briar Chapel",
    "Cinder Works",
    "Delta Bakery",
]
_FIRST = ["Mirela", "Tomas", "Ines", "Odile", "Kasper", "Leona", "Ruben", "Sanne", "Viktor", "Yara", "Emil", "Noor"]
_LAST = ["Kovac", "Hallberg", "Moreau", "Okafor", "Lindqvist", "Barros", "Dvorak", "Nakamura", "Petrescu", "Vance"]
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


@dataclass(frozen=True)
class Fact:
    title: str
    text: str  # the document
    question: str
    answer: str  # what a right answer contains
    history: tuple[tuple[str, str], ...] = ()  # a follow-up's earlier turns (question, answer), oldest first


def make_facts(num: int, seed: int = 0) -> list[Fact]:
    """`num` documents with one unique fact each, three kinds in turn: a code, a date, a name."""
    if num > len(_PLACES):
        raise ValueError(f"at most {len(_PLACES)} look-up documents, asked for {num}")
    rng = random.Random(seed)
    places = rng.sample(_PLACES, num)
    facts = []
    for i, place in enumerate(places):
        staff, year = rng.randint(12, 480), rng.randint(1890, 1990)
        filler = (
            f"The {place} was founded in {year} and has {staff} staff. Visitors may enter on weekdays; "
            f"the {place} is closed on public holidays."
        )
        match i % 3:
            case 0:
                code = access_code(rng)
                facts.append(
                    Fact(
                        place,
                        f"{filler} The access code of the {place} is {code}.",
                        f"What is the access code of the {place}?",
                        code,
                    )
                )
            case 1:
                date = f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1995, 2024)}"
                facts.append(
                    Fact(
                        place,
                        f"{filler} The new wing of the {place} opened on {date}.",
                        f"When did the new wing of the {place} open?",
                        date,
                    )
                )
            case _:
                name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
                facts.append(
                    Fact(
                        place,
                        f"{filler} The director of the {place} is {name}.",
                        f"Who is the director of the {place}?",
                        name,
                    )
                )
    return facts


def similar_facts(num: int, seed: int, part: str, shape: str = "one") -> tuple[list[Fact], list[Passage]]:
    """`num` look-ups among similar chunks (app/calibration/similar.py) and the corpus that holds them: every
    document of every case, so retrieval returns the asked page among pages stating the same kind of value (one
    value a page, or several named values a page: `shape`)."""
    from app.calibration.similar import similar_cases

    cases = similar_cases(part, num, seed, shape=shape)  # type: ignore[arg-type]
    facts = [Fact(c.docs[0].title, c.docs[0].text, c.question, c.answer, c.history) for c in cases]
    return facts, [Passage(title=d.title, text=d.text) for c in cases for d in c.docs]


def lookup_corpus(args: argparse.Namespace) -> tuple[list[Fact], list[Passage]]:
    """The questions and the documents ingested for them (`--distractors`)."""
    if args.distractors == "similar":
        return similar_facts(args.examples, args.seed, args.part, args.shape)
    facts = make_facts(args.examples, args.seed)
    return facts, [Passage(title=f.title, text=f.text) for f in facts]


async def _ask(
    state: Any, fact: Fact, mode: str, selector: str | None, ratio: float | None, max_tokens: int
) -> tuple[str, list[str], str | None]:
    """(answer, source titles best first, selector that answered) of one question through AskService; a
    follow-up is asked with its earlier turns as a client's history (retrieval and the prompt read them)."""
    from app.services.ask.types import AskRequest
    from engine.prompt import Turn

    request = AskRequest(
        question=fact.question,
        history=tuple(Turn(question=q, answer=a) for q, a in fact.history),
        mode=mode,
        selector=selector,  # type: ignore[arg-type]
        recompute_ratio=ratio if mode == "blend" else None,
        max_tokens=max_tokens,
        temperature=0.0,
    )
    done, titles, _ = await ask_service(state, request)
    return done.answer, titles, done.selector


async def run_lookup(
    state: Any, facts: list[Fact], modes: list[tuple[str, str, str | None]], ratio: float | None, max_tokens: int
) -> dict[str, Any]:
    per_question = []
    for n, fact in enumerate(facts, 1):
        row: dict[str, Any] = {"question": fact.question, "answer": fact.answer, "modes": {}}
        for name, mode, selector in modes:
            answer, titles, used = await _ask(state, fact, mode, selector, ratio, max_tokens)
            row["modes"][name] = {"answer": answer, "right": is_right(answer, fact.answer), "selector": used}
            row["retrieved_first"] = bool(titles) and titles[0] == fact.title
        per_question.append(row)
        logger.info(
            "lookup %d/%d %r: %s",
            n,
            len(facts),
            fact.answer,
            "  ".join(f"{k}={'ok' if v['right'] else 'x'}" for k, v in row["modes"].items()),
        )
    summary = {name: sum(r["modes"][name]["right"] for r in per_question) for name, _, _ in modes}
    return {
        "right": summary,
        "retrieved_first": sum(r["retrieved_first"] for r in per_question),
        "per_question": per_question,
    }


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--distractors",
        choices=("unique", "similar"),
        default="unique",
        help="unique: every document states a different kind of fact; similar: the asked value among 1-5 pages "
        "stating the same kind of value with other characters (app/calibration/similar.py)",
    )
    parser.add_argument(
        "--part", choices=("check", "tune"), default="check", help="similar: which part of the set (default check)"
    )
    parser.add_argument(
        "--shape",
        choices=("one", "several"),
        default="one",
        help="similar: one value a page, or several named values a page (an access code, a budget, a contact; "
        "the question asks for one by the project's name)",
    )
    harness.add_selectors_arg(parser, "query,deviation", "blend selectors to ask with (each at --ratio)")
    parser.add_argument("--ratio", type=float, default=None, help="blend recompute ratio (default: the server's)")
    parser.add_argument("--max-tokens", type=int, default=24, help="answer length cap")
    harness.add_candidates_arg(
        parser,
        "a JSON list of blend settings (a study): each asked with its values set as the operator's, "
        "instead of --selectors at --ratio",
    )
    parser.add_argument(
        "--ship",
        action="store_true",
        help="similar, check part: write the check into the model's shipped record for its dtype "
        "(app/calibration/similar_check.py; measured.similar_check, or similar_several_check with --shape several), "
        "only when the default blend is within 1 of full prefill",
    )
    harness.add_kv_dtype_arg(parser, choices=("fp16", "bf16", "int8", "int4"))


def plot(result: dict[str, Any], path: Path) -> None:
    fig, (ax,) = harness.new_figure(1, width_per_panel=6.0)
    names = list(result["right"])
    ax.bar(names, [result["right"][n] for n in names], color="tab:blue")
    ax.axhline(result["questions"], color="gray", lw=0.8, ls="--")
    ax.set_ylabel(f"right answers of {result['questions']}")
    ax.set_title(f"look-up questions through /ask · {result['model']} · top_k {result['top_k']}", fontsize=9)
    harness.save_figure(fig, path)


async def _study(
    args: argparse.Namespace, facts: list[Fact], passages: list[Passage], candidates: list[dict[str, Any]]
) -> dict[str, Any]:
    """Each candidate's look-ups through an app whose engine settings set the candidate's values."""
    from bench.candidates import candidate_name, describe

    out: dict[str, Any] = {"right": {}, "per_question": [{"modes": {}} for _ in facts], "candidates": {}}
    for values in candidates:
        with temp_settings(
            NAME, args, retrieval={"top_k": args.passages}, kvcache={"storage_dtype": args.kv_dtype}, engine=values
        ) as settings:
            async with running_app(settings) as state:
                config = state.services.engine.settings.blend_config()
                name = candidate_name(values, config)
                ingest_passages(state, passages)
                outcome = await run_lookup(state, facts, [(name, "blend", None)], None, args.max_tokens)
        out["right"][name] = outcome["right"][name]
        out["candidates"][name] = {"candidate": values, "blend": describe(config)}
        for row, asked in zip(out["per_question"], outcome["per_question"], strict=True):
            row["modes"][name] = asked["modes"][name]
    return out


def default_mode(result: dict[str, Any]) -> str:
    """The name of the server's default blend among a result's modes (`right`, per question): selector@ratio."""
    return f"{result['default_selector']}@{result['ratio']}"


def _ship_similar_check(result: dict[str, Any], engine: Any) -> int:
    """`--ship`: the check part's figures into the shipped record of the model and dtype (exit 1 when refused)."""
    from datetime import UTC, datetime

    from app.calibration.shipped import model_name
    from app.calibration.similar_check import SimilarCheck, SimilarCheckError, record_similar_check

    default = default_mode(result)
    check = SimilarCheck(
        seed=result["seed"],
        num_cases=result["questions"],
        num_right_full=result["right"]["full"],
        num_right_reuse=result["right"]["reuse"],
        num_right_blend=result["right"][default],
        blend=result["blend"],
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        shape=result["shape"],
        chunk_lead_in=result.get("chunk_lead_in"),
    )
    return harness.ship_check(
        lambda: record_similar_check(
            check, model_name(engine.settings.model), result["compute_dtype"], engine.fingerprint
        ),
        SimilarCheckError,
        "similar",
    )


def main(args: argparse.Namespace) -> int:
    harness.refuse_ship_with_lead_in(args)
    if args.ship and (args.distractors != "similar" or args.part != "check" or args.candidates is not None):
        raise SystemExit("--ship records the check part of --distractors similar, without --candidates")
    run = harness.RunRecord.start(args)
    facts, passages = lookup_corpus(args)
    candidates = read_candidates(args.candidates) if args.candidates is not None else None
    with temp_settings(
        NAME, args, retrieval={"top_k": args.passages}, kvcache={"storage_dtype": args.kv_dtype}
    ) as settings:
        shipped_engine: Any = None

        async def go() -> dict[str, Any]:
            async with running_app(settings) as state:
                # The server's ratio is the one in force for its model (app/calibration), not the raw default.
                engine_settings = state.services.engine.settings
                ratio = args.ratio if args.ratio is not None else engine_settings.blend.recompute_ratio
                modes = [("full", "full", None), ("reuse", "reuse", None)]
                if candidates is None:
                    modes += [(f"{s}@{ratio}", "blend", s) for s in args.selectors]
                job, _ = ingest_passages(state, passages)
                logger.info("ingested %d documents (%s)", len(passages), getattr(job, "status", "?"))
                outcome = await run_lookup(state, facts, modes, ratio, args.max_tokens)
                engine = state.services.engine
                nonlocal shipped_engine
                shipped_engine = engine
            if candidates is not None:
                study = await _study(args, facts, passages, candidates)
                outcome["right"] |= study["right"]
                outcome["candidates"] = study["candidates"]
                for row, asked in zip(outcome["per_question"], study["per_question"], strict=True):
                    row["modes"] |= asked["modes"]
            return harness.result_header(
                NAME,
                args,
                engine,
                questions=len(facts),
                distractors=args.distractors,
                part=args.part if args.distractors == "similar" else None,
                shape=args.shape if args.distractors == "similar" else None,
                documents=len(passages),
                top_k=args.passages,
                ratio=ratio,
                default_selector=engine_settings.blend.selector,
                kv_dtype=settings.kvcache.storage_dtype,
                max_tokens=args.max_tokens,
                **outcome,
            )

        result = asyncio.run(go())
    harness.write_result(args, result, run, plot)
    for name, right in result["right"].items():
        logger.info("%-16s %d / %d right", name, right, len(facts))
    logger.info("retrieval put the fact's document first for %d / %d", result["retrieved_first"], len(facts))
    return _ship_similar_check(result, shipped_engine) if args.ship else 0

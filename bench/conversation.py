"""`python -m bench conversation`: multi-turn sessions through AskService, the path /ask and /v1 take.

Sessions from a dev set (default nq6, whose examples each hold a gold passage and passages answering other
questions; all passages of the chosen examples are ingested as one corpus). Session i, with gold passage G
and another passage O of the same example:

    turn 1  "Tell me about <title of G>."          names the subject        referenced passage: G
    turn 2  "What else do you know about it?"      refers back with "it"    referenced passage: G
    turn 3  "And what about <title of O>?"          another passage          referenced passage: O
    turn 4  "How is that related to the first one?" "that" = O               referenced passage: O

Every turn is asked with the earlier turns (questions and the default's answers) as its history, statelessly
(as a /v1 client resends them), so every method sees the same history. Per turn:

- TTFT of full prefill, of the default (blend) with the history's stored KV reused, and of the default with
  the history recomputed (its entries deleted first, so they are computed at question time);
- first-token KL(full ‖ default) and KL(full ‖ reuse) on the same prompt and KV, and the same with a
  client's own system prompt (CLIENT_SYSTEM_PROMPT: another prefix, the stored KV blended behind it);
- retrieval recall of the referenced passage (in the top 3 / top k) with `followup` concat, rewrite, off.

The look-up test (`--lookup N`, like `bench lookup`): N made-up projects, one document each holding its
access code. Turn 1 "Tell me about project X.", turn 2 "What is the access code of that project?", asked
on the /ask path (a stored conversation) and on the /v1 path (the messages array, stateless). Reported per
path: the project's document in the top 3 sources and first, right answers of the default and of full
prefill (full prefill's turn 2 takes the same path: on /ask, a conversation of its own whose turn 1 was
asked as the default's was, so its retrieval reads the stored turn's sources too), and second turns with
`history_reused_tokens > 0`.

`--ship` makes the look-up test the record's follow-ups check part (app/calibration/followups_check.py): the
default blend within one right answer of full prefill on both paths, written into the shipped record of the model
and dtype (measured.followups_check); exit 1 when it misses or cannot be written. `--examples 0` skips the
sessions (the gate runs the look-ups alone).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.calibration.calset import access_code
from app.calibration.scoring import is_right
from bench import harness
from bench.data import Example, Passage, load_dataset, select_examples
from bench.inprocess import ask_service, ingest_passages, running_app, temp_settings
from bench.metrics import kl_divergence, mean

logger = logging.getLogger(__name__)

NAME = "conversation"
HELP = "multi-turn sessions: TTFT, KL and follow-up retrieval recall per turn; the look-up test"
FOLLOWUPS = ("concat", "rewrite", "off")
TOP = 3  # "in the top 3 sources"
CLIENT_SYSTEM_PROMPT = "You are a librarian. Answer in one short sentence, citing the passage you used."

_PROJECTS = [
    "Zorblat",
    "Quenmoor",
    "Velastra",
    "Brindlewick",
    "Oxtane",
    "Marrowfen",
    "Tidelark",
    "Cobaltine",
    "Pyrewood",
    "Hollowmere",
    "Sablecrest",
    "Norvane",
    "Glimmerholt",
    "Ashcombe",
    "Kestrelbay",
    "Duskvale",
]
_CITIES = ["Lisbon", "Tampere", "Gdansk", "Porto", "Leeds", "Graz", "Turku", "Brno", "Bergen", "Ghent", "Kaunas"]


@dataclass(frozen=True)
class SessionTurn:
    question: str
    referenced_title: str  # the passage this turn is about


@dataclass(frozen=True)
class Session:
    turns: list[SessionTurn]


@dataclass(frozen=True)
class Project:
    name: str
    title: str
    text: str
    code: str


def make_sessions(examples: list[Example], num_turns: int) -> list[Session]:
    """One session per example (see the module docstring); examples without a second titled passage are
    skipped."""
    sessions = []
    for ex in examples:
        gold = next((p for p in ex.passages if p.is_gold), ex.passages[0])
        other = next((p for p in ex.passages if p.title and p.title != gold.title), None)
        if not gold.title or other is None:
            continue
        turns = [
            SessionTurn(f"Tell me about {gold.title}.", gold.title),
            SessionTurn("What else do you know about it?", gold.title),
            SessionTurn(f"And what about {other.title}?", other.title),
            SessionTurn("How is that related to the first one?", other.title),
        ]
        sessions.append(Session(turns[:num_turns]))
    return sessions


def make_projects(num: int, seed: int = 0) -> list[Project]:
    if num > len(_PROJECTS):
        raise ValueError(f"at most {len(_PROJECTS)} look-up projects, asked for {num}")
    rng = random.Random(seed)
    projects = []
    for name in rng.sample(_PROJECTS, num):
        code = access_code(rng)
        city, year, staff = rng.choice(_CITIES), rng.randint(1995, 2022), rng.randint(4, 90)
        text = (
            f"Project {name} is a research programme run from {city}. It started in {year} and has {staff} "
            f"members. The access code of project {name} is {code}. Visitors must sign in at the front desk."
        )
        projects.append(Project(name=name, title=f"Project {name}", text=text, code=code))
    return projects


# ---- one ask ------------------------------------------------------------------------------------------


def _request(question: str, history: list[Any], max_tokens: int, **extra: Any) -> Any:
    from app.services.ask.types import AskRequest

    return AskRequest(question=question, history=tuple(history), max_tokens=max_tokens, temperature=0.0, **extra)


def _ref(context: Any) -> Any:
    """The request's name for a conversation opened here: "new" until its first turn is recorded."""
    from app.services.ask import ConversationRef

    return ConversationRef("new" if context.is_new else context.conversation_id)


def _delete_history_entries(state: Any, layout: Any) -> int:
    space = state.services.kv_space
    return sum(space.store.delete(space.key(ids)) for ids in layout.history_ids)


async def _kl(state: Any, request: Any) -> dict[str, float]:
    """First-token KL(full ‖ default) and KL(full ‖ reuse) on the prompt and KV the service builds."""
    plan = await state.services.ask.plan(request)
    engine = state.services.engine
    blend = state.services.engine.settings.blend_config()  # the settings in force (app/calibration)

    def passes() -> dict[str, float]:
        full = engine.prompt_pass(plan.layout, None, "full")
        out = {}
        for name, mode in (("default", "blend"), ("reuse", "reuse")):
            opened = state.services.ask.open_plan_kv(plan)
            try:
                result = engine.prompt_pass(plan.layout, opened.reader, mode, blend)
            finally:
                opened.reader.close()
            out[name] = kl_divergence(full.logits, result.logits)
        return out

    return await asyncio.to_thread(passes)


# ---- parts ----------------------------------------------------------------------------------------------


async def run_sessions(
    state: Any, sessions: list[Session], top_k: int, max_tokens: int, timings: bool
) -> list[dict[str, Any]]:
    from engine.prompt import Turn

    rows = []
    for n, session in enumerate(sessions, 1):
        history: list[Turn] = []
        # A stored conversation, as the chat page keeps one: each finished turn's KV is written for the next.
        context = state.services.conversations.open(None, None, None, None)
        for t, turn in enumerate(session.turns, 1):
            row: dict[str, Any] = {
                "session": n,
                "turn": t,
                "question": turn.question,
                "referenced": turn.referenced_title,
            }
            done, titles, _ = await ask_service(
                state, _request(turn.question, list(context.history), max_tokens, conversation=_ref(context))
            )
            context = state.services.conversations.open(done.conversation_id, None, None, None)
            row["answer"] = done.answer
            row["history_tokens"] = done.usage.history_tokens
            row["history_reused_tokens"] = done.usage.history_reused_tokens
            row["recall"] = {}
            for followup in FOLLOWUPS:
                plan = await state.services.ask.plan(_request(turn.question, history, max_tokens, followup=followup))
                found = [s.title for s in plan.sources]
                row["recall"][followup] = {
                    f"top{TOP}": turn.referenced_title in found[:TOP],
                    f"top{top_k}": turn.referenced_title in found,
                }
            if history:
                row["kl"] = await _kl(state, _request(turn.question, history, max_tokens))
            # A client's own system prompt: another prefix, the chunks and turns stored behind the server's.
            row["kl_client_system"] = await _kl(
                state, _request(turn.question, history, max_tokens, system_prompt=CLIENT_SYSTEM_PROMPT)
            )
            if timings:
                ttft = {}
                full, _, _ = await ask_service(state, _request(turn.question, history, max_tokens, mode="full"))
                ttft["full"] = full.timings.ttft_ms
                reused, _, _ = await ask_service(state, _request(turn.question, history, max_tokens))
                ttft["default_history_reused"] = reused.timings.ttft_ms
                plan = await state.services.ask.plan(_request(turn.question, history, max_tokens))
                _delete_history_entries(state, plan.layout)
                recomputed, _, _ = await ask_service(state, _request(turn.question, history, max_tokens))
                ttft["default_history_recomputed"] = recomputed.timings.ttft_ms
                row["ttft_ms"] = ttft
                row["prompt_tokens"] = reused.usage.prompt_tokens
            rows.append(row)
            history.append(Turn(turn.question, done.answer))
            logger.info(
                "session %d turn %d: history %d tok (%d reused) recall %s kl %s ttft %s",
                n,
                t,
                row["history_tokens"],
                row["history_reused_tokens"],
                {k: v[f"top{TOP}"] for k, v in row["recall"].items()},
                row.get("kl"),
                row.get("ttft_ms"),
            )
    return rows


async def run_lookup(state: Any, projects: list[Project], max_tokens: int) -> dict[str, Any]:
    from pydantic import TypeAdapter

    from app.api.openai_messages import ChatMessage, read_messages  # /v1's own reading of `messages`

    messages_of = TypeAdapter(list[ChatMessage])

    conversations = state.services.conversations
    rows = []
    for project in projects:
        first = f"Tell me about project {project.name}."
        second = "What is the access code of that project?"
        row: dict[str, Any] = {"project": project.name, "code": project.code}
        # /ask: a stored conversation, continued by id. Full prefill's reference takes the same path: turn 1
        # asked (as the default) in a conversation of its own, turn 2 in full prefill, so its retrieval reads
        # the stored turn's sources as the default's does.
        context = conversations.open(None, None, None, None)
        done1, _, _ = await ask_service(state, _request(first, [], max_tokens, conversation=_ref(context)))
        context = conversations.open(done1.conversation_id, None, None, None)
        reference = conversations.open(None, None, None, None)
        ref1, _, _ = await ask_service(state, _request(first, [], max_tokens, conversation=_ref(reference)))
        reference = conversations.open(ref1.conversation_id, None, None, None)
        row["same_first_answer"] = ref1.answer == done1.answer
        for path in ("ask", "v1"):
            if path == "ask":
                request = _request(second, list(context.history), max_tokens, conversation=_ref(context))
                full_request = replace(
                    request, history=tuple(reference.history), conversation=_ref(reference), mode="full"
                )
            else:
                messages = messages_of.validate_python(
                    [
                        {"role": "user", "content": first},
                        {"role": "assistant", "content": done1.answer},
                        {"role": "user", "content": second},
                    ]
                )
                chat = read_messages(messages)
                request = _request(chat.question, list(chat.history), max_tokens, system_prompt=chat.system_prompt)
                full_request = replace(request, mode="full")
            done, titles, _ = await ask_service(state, request)
            full, full_titles, _ = await ask_service(state, full_request)
            row[path] = {
                "in_top3": project.title in titles[:TOP],
                "rank": titles.index(project.title) + 1 if project.title in titles else 0,
                "answer": done.answer,
                "right": is_right(done.answer, project.code),
                "full_answer": full.answer,
                "full_right": is_right(full.answer, project.code),
                "full_same_sources": full_titles == titles,
                "history_reused_tokens": done.usage.history_reused_tokens,
            }
        rows.append(row)
        logger.info(
            "lookup %s: top3 ask=%s v1=%s right default=%s full=%s reused=%s",
            project.name,
            row["ask"]["in_top3"],
            row["v1"]["in_top3"],
            row["ask"]["right"],
            row["ask"]["full_right"],
            row["ask"]["history_reused_tokens"],
        )
    summary: dict[str, Any] = {}
    for path in ("ask", "v1"):
        summary[path] = {
            "in_top3": sum(r[path]["in_top3"] for r in rows),
            "first": sum(r[path]["rank"] == 1 for r in rows),
            "default_right": sum(r[path]["right"] for r in rows),
            "full_right": sum(r[path]["full_right"] for r in rows),
            "history_reused": sum(r[path]["history_reused_tokens"] > 0 for r in rows),
        }
    return {"questions": len(rows), "summary": summary, "per_project": rows}


def summarize(rows: list[dict[str, Any]], top_k: int) -> dict[str, Any]:
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_turn.setdefault(row["turn"], []).append(row)
    out: dict[str, Any] = {}
    for turn, group in sorted(by_turn.items()):
        entry: dict[str, Any] = {
            "sessions": len(group),
            "history_tokens_mean": mean(r["history_tokens"] for r in group),
            "history_reused_share": mean(
                r["history_reused_tokens"] / r["history_tokens"] for r in group if r["history_tokens"]
            )
            if any(r["history_tokens"] for r in group)
            else None,
            "recall": {
                f: {k: mean(float(r["recall"][f][k]) for r in group) for k in (f"top{TOP}", f"top{top_k}")}
                for f in FOLLOWUPS
            },
        }
        client = [r["kl_client_system"] for r in group if "kl_client_system" in r]
        if client:
            entry["kl_client_system_default"] = mean(k["default"] for k in client)
            entry["kl_client_system_reuse"] = mean(k["reuse"] for k in client)
        kls = [r["kl"] for r in group if "kl" in r]
        if kls:
            entry["kl_default"] = mean(k["default"] for k in kls)
            entry["kl_reuse"] = mean(k["reuse"] for k in kls)
            entry["kl_ratio"] = entry["kl_default"] / entry["kl_reuse"] if entry["kl_reuse"] > 0 else None
        ttfts = [r["ttft_ms"] for r in group if "ttft_ms" in r]
        if ttfts:
            entry["ttft_ms"] = {k: mean(t[k] for t in ttfts) for k in ttfts[0]}
            entry["speedup_vs_full"] = entry["ttft_ms"]["full"] / entry["ttft_ms"]["default_history_reused"]
        out[str(turn)] = entry
    return out


# ---- CLI --------------------------------------------------------------------------------------------------


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=3, choices=[2, 3, 4], help="turns per session")
    parser.add_argument("--lookup", type=int, default=12, help="look-up projects (0: skip the look-up test)")
    parser.add_argument("--no-timings", action="store_true", help="skip the TTFT runs (quality and recall only)")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length cap")
    parser.add_argument(
        "--ship",
        action="store_true",
        help="the look-up test as the record's follow-ups check: written into the model's shipped record for its "
        "dtype (measured.followups_check) when the default blend is within 1 of full prefill on /ask and /v1",
    )


def plot(result: dict[str, Any], path: Path) -> None:
    turns = result["by_turn"]
    names = sorted(turns, key=int)
    fig, axes = harness.new_figure(3, width_per_panel=4.4)
    ax = axes[0]
    if all("ttft_ms" in turns[t] for t in names):
        for key, color in (
            ("full", "tab:red"),
            ("default_history_recomputed", "tab:orange"),
            ("default_history_reused", "tab:blue"),
        ):
            ax.plot([int(t) for t in names], [turns[t]["ttft_ms"][key] for t in names], "o-", color=color, label=key)
        ax.set_ylabel("TTFT (ms)")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not measured (--no-timings)", ha="center", va="center", transform=ax.transAxes)
        ax.set_yticks([])
    ax.set_xlabel("turn")
    ax.set_title("time to first token", fontsize=9)
    ax = axes[1]
    kl_turns = [t for t in names if "kl_default" in turns[t]]
    ax.plot(
        [int(t) for t in kl_turns], [turns[t]["kl_reuse"] for t in kl_turns], "o-", color="tab:orange", label="reuse"
    )
    ax.plot(
        [int(t) for t in kl_turns], [turns[t]["kl_default"] for t in kl_turns], "o-", color="tab:blue", label="default"
    )
    ax.set_xlabel("turn")
    ax.set_ylabel("first-token KL vs full")
    ax.legend(fontsize=7)
    ax.set_title("closeness to full prefill", fontsize=9)
    ax = axes[2]
    width = 0.25
    for i, followup in enumerate(FOLLOWUPS):
        ax.bar(
            [int(t) + (i - 1) * width for t in names],
            [turns[t]["recall"][followup][f"top{TOP}"] for t in names],
            width,
            label=followup,
        )
    ax.set_xlabel("turn")
    ax.set_ylabel(f"referenced passage in top {TOP}")
    ax.set_ylim(0, 1.25)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    ax.set_title("follow-up retrieval", fontsize=9)
    for ax in axes:
        ax.set_xticks([int(t) for t in names])
    fig.suptitle(f"conversations · {result['model']} · {result['sessions']} sessions", fontsize=9)
    harness.save_figure(fig, path)


def main(args: argparse.Namespace) -> int:
    if args.ship and args.lookup <= 0:
        raise SystemExit("--ship records the look-up test: give --lookup N (N ≥ 1)")
    run = harness.RunRecord.start(args)
    examples = select_examples(load_dataset(args.dataset), args.examples, args.seed) if args.examples else []
    sessions = make_sessions(examples, args.turns)
    projects = make_projects(args.lookup, args.seed) if args.lookup else []
    with temp_settings(NAME, args, retrieval={"top_k": args.passages}, engine={"dtype": args.dtype}) as settings:

        async def go() -> dict[str, Any]:
            async with running_app(settings) as state:
                if args.ship and settings.engine.mode != "blend":
                    raise SystemExit(f"--ship checks the default blend; this server's mode is {settings.engine.mode}")
                passages = [Passage(title=p.title, text=p.text) for ex in examples for p in ex.passages]
                passages += [Passage(title=p.title, text=p.text) for p in projects]
                ingest_passages(state, _unique(passages))
                rows = await run_sessions(state, sessions, args.passages, args.max_tokens, not args.no_timings)
                lookup = await run_lookup(state, projects, args.max_tokens) if projects else None
                return harness.result_header(
                    NAME,
                    args,
                    state.services.engine,
                    sessions=len(sessions),
                    turns=args.turns,
                    top_k=args.passages,
                    mode=settings.engine.mode,
                    selector=state.services.engine.settings.blend.selector,
                    ratio=state.services.engine.settings.blend.recompute_ratio,
                    history_ratio=state.services.engine.settings.blend.history_ratio,
                    followup_default=settings.retrieval.followup,
                    history_max_tokens=settings.engine.history_max_tokens,
                    client_system_prompt=CLIENT_SYSTEM_PROMPT,
                    max_tokens=args.max_tokens,
                    by_turn=summarize(rows, args.passages),
                    per_turn=rows,
                    lookup=lookup,
                    fingerprint=state.services.engine.fingerprint,
                )

        result = asyncio.run(go())
    harness.write_result(args, result, run, plot)
    for turn, entry in result["by_turn"].items():
        logger.info(
            "turn %s: %s", turn, {k: v for k, v in entry.items() if k != "recall"} | {"recall": entry["recall"]}
        )
    if result["lookup"] is not None:
        logger.info("lookup: %s", result["lookup"]["summary"])
    return _ship(result, settings.engine.model) if args.ship else 0


def _ship(result: dict[str, Any], model: str) -> int:
    """`--ship`: the look-up test's right answers per path into the shipped record of the model and dtype (exit 1
    when refused: the target missed, no record, or another fingerprint's record)."""
    from datetime import UTC, datetime

    from app.calibration.followups_check import PATHS, FollowupsCheck, FollowupsCheckError, record_followups_check
    from app.calibration.shipped import model_name

    summary = result["lookup"]["summary"]
    check = FollowupsCheck(
        seed=result["seed"],
        num_projects=result["lookup"]["questions"],
        num_right_full={path: summary[path]["full_right"] for path in PATHS},
        num_right_blend={path: summary[path]["default_right"] for path in PATHS},
        num_in_top3={path: summary[path]["in_top3"] for path in PATHS},
        blend=result["blend"],
        checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        chunk_lead_in=result.get("chunk_lead_in"),
    )
    return harness.ship_check(
        lambda: record_followups_check(check, model_name(model), result["compute_dtype"], result["fingerprint"]),
        FollowupsCheckError,
        "follow-ups",
    )


def _unique(passages: list[Passage]) -> list[Passage]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in passages:
        if (p.title, p.text) not in seen:
            seen.add((p.title, p.text))
            out.append(p)
    return out

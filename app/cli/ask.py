"""`blendrag ask`: one question, its answer printed as it streams, in this process or through the server."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from app.cli.common import EXIT_USAGE, add_client, add_data_dir, settings_of, take_data_dir
from app.settings import Settings
from engine.blend.config import SELECTORS
from engine.types import MODES

if TYPE_CHECKING:
    from app.remote import RemoteServer


def _print_sources(sources: list[dict[str, Any]], notice: str | None = None) -> None:
    print("\n")
    if not sources:
        print(f"Sources: none ({notice or 'no documents match'}: the answer comes from the model alone)")
        return
    if notice:  # with sources, what the answer's reader must know about it (e.g. names mostly invented)
        print(f"[{notice}]\n")
    print("Sources:")
    for s in sources:
        page = f", p. {s['page']}" if s.get("page") else ""
        section = f" · {s['section']}" if s.get("section") and s["section"] != s["title"] else ""
        print(f"  [{s['rank']}] {s['title']}{section}{page} (score {s['score']:.3f})")


MAX_REPEAT_CHARS = 160  # of the withheld repeat a note shows (a loop of code lines can be long)


def finish_note(done: dict[str, Any]) -> str | None:
    """The line that says why an answer ended when it did not end by itself (cut at its length cap, stopped
    on a repeat, cancelled), else None: a stop is never silent, or the answer seems to end mid-sentence."""
    match done.get("finish_reason"):
        case "length":
            tokens = (done.get("usage") or {}).get("completion_tokens")
            return f"answer cut off at {tokens} tokens (raise it with --max-tokens)"
        case "repetition":
            line = (done.get("repeated_line") or {}).get("text")
            if not line:  # a server from before the withheld repeat was reported
                return "stopped: the answer started repeating itself"
            shown = line if len(line) <= MAX_REPEAT_CHARS else line[:MAX_REPEAT_CHARS] + "…"
            return f"stopped: the answer started repeating: «{shown}»"
        case "cancelled":
            return "stopped: the server stopped before the answer was done"
    return None


def unsupported_note(done: dict[str, Any]) -> str | None:
    """The line that names the code identifiers the answer wrote and no source contains, else None."""
    names = list(dict.fromkeys(u["identifier"] for u in done.get("unsupported_identifiers") or []))
    return f"not in any source (may be invented): {', '.join(names)}" if names else None


def _print_done(done: dict[str, Any]) -> None:
    for note in (finish_note(done), unsupported_note(done)):
        if note is not None:
            print(f"\n[{note}]")
    t = done["timings"]
    how = f"{done['mode']} ({done['selector']})" if done.get("selector") else done["mode"]
    rate = t.get("decode_tokens_per_s")  # null for a one-token answer (and absent from an older server)
    decode = f", decode {rate:.1f} tokens/s" if rate is not None else ""
    print(
        f"\nmode {how}, recompute ratio {done['recompute_ratio']:.2f}; "
        f"retrieval {t['retrieval_ms']:.0f} ms, KV load {t['kv_load_ms']:.0f} ms, "
        f"TTFT {t['ttft_ms']:.0f} ms, total {t['total_ms']:.0f} ms{decode}; "
        f"KV hits {done['kv_hits']}, misses {done['kv_misses']}"
    )
    usage = done.get("usage") or {}
    if usage.get("history_tokens"):
        print(
            f"history: {done.get('history_turns', 0)} earlier turn(s), {usage['history_tokens']} tokens, "
            f"{usage.get('history_reused_tokens', 0)} from stored KV"
            + (f"; {done['history_dropped_turns']} oldest left out" if done.get("history_dropped_turns") else "")
        )
    if done.get("conversation_id"):
        print(
            f"conversation {done['conversation_id']} "
            f"(continue it: blendrag ask --conversation {done['conversation_id']} …)"
        )


# POST /ask's body fields the command sets: field -> (its argument's dest, the flag an error names).
_BODY_ARGS = {
    "question": ("question", "question"),
    "top_k": ("top_k", "--top-k"),
    "mode": ("mode", "--mode"),
    "recompute_ratio": ("ratio", "--ratio"),
    "selector": ("selector", "--selector"),
    "max_tokens": ("max_tokens", "--max-tokens"),
    "conversation_id": ("conversation", "--conversation"),
    "collections": ("collections", "--collection"),
}


def _body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /ask body of the command's arguments (a flag not given is left out: the server's default)."""
    values = {field: getattr(args, dest) for field, (dest, _) in _BODY_ARGS.items()}
    return {field: value for field, value in values.items() if value is not None}


class _AnswerOutput:
    """Prints one answer's events as they arrive (`sources`, `token`, `done`, `error`, with their wire
    data: the server's SSE events, or the in-process service's events as they would be sent)."""

    def __init__(self) -> None:
        from app.cli.answer import AnswerPrinter

        self.printer = AnswerPrinter()
        self.sources: list[dict[str, Any]] = []
        self.code = 0  # 1 once an error ended the answer

    def event(self, name: str, data: dict[str, Any]) -> None:
        match name:
            case "sources":
                self.sources = data["sources"]
            case "token":
                self.printer.token(data["text"])
            case "done":
                self.printer.done(data.get("answer"), data.get("citations") or [])
                _print_sources(self.sources, data.get("notice"))
                _print_done(data)
            case "error":
                self.printer.done(None, [])
                print(f"\nerror: {data.get('message')}", file=sys.stderr)
                self.code = 1


def _ask_remote(remote: RemoteServer, args: argparse.Namespace) -> int:
    output = _AnswerOutput()
    with remote:
        for event, data in remote.ask(_body(args)):
            output.event(event, data)
    return output.code


def cmd_ask(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from app.ask_params import AskIn

    settings = settings_of(args)
    try:  # the body and limits of POST /ask (app/ask_params.py), before any model is loaded
        body = AskIn(**_body(args))
    except ValidationError as exc:
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else "question"
            print(f"error: {_BODY_ARGS.get(name, (name, name))[1]}: {err['msg']}", file=sys.stderr)
        return EXIT_USAGE
    # A question never creates a data dir: without a catalog here, it goes to a running server or nowhere.
    remote, lock = take_data_dir(settings, "ask", "blendrag ask", remote=True, args=args, server_only=True)
    if remote is not None:
        return _ask_remote(remote, args)
    assert lock is not None
    with lock:
        request = body.to_request(body.question)
        request = dataclasses.replace(
            request, filters=dataclasses.replace(request.filters, collections=body.collections)
        )
        return _ask_local(settings, request, body.conversation_id)


def _ask_local(settings: Settings, request: Any, conversation_id: str | None) -> int:
    from app.build import build_services
    from app.services.ask import ConversationRef, DoneEvent, ErrorEvent, SourcesEvent, TokenDelta
    from app.services.conversation_service import ConversationNotFound, owner_of

    if conversation_id is not None:
        # The owner is the one a request with this server's key would be, so the CLI and HTTP see the same
        # conversations; in-process, the CLI reads every collection (it owns the data dir), like the admin.
        ref = ConversationRef(conversation_id, owner=owner_of(settings.server.api_key), readable=None)
        request = dataclasses.replace(request, conversation=ref)
        # Before the model loads: an unknown conversation is a quick usage error.
        first = build_services(settings, {"conversations"})
        try:
            assert first.conversations is not None
            first.conversations.open(conversation_id, ref.owner, None, request.filters.collections)
        except ConversationNotFound as exc:
            print(f"error: --conversation: {exc}", file=sys.stderr)
            return EXIT_USAGE
        finally:
            first.close()
    services = build_services(settings, {"ask"})

    async def run() -> int:
        service, scheduler = services.ask, services.scheduler
        assert service is not None and scheduler is not None
        scheduler.start()
        output = _AnswerOutput()
        try:
            async for event in service.ask(request):
                match event:
                    case SourcesEvent():
                        output.event("sources", {"sources": [dataclasses.asdict(s) for s in event.sources]})
                    case TokenDelta():
                        output.event("token", {"text": event.text})
                    case DoneEvent():
                        output.event("done", dataclasses.asdict(event))
                    case ErrorEvent():
                        output.event("error", {"message": event.message})
        finally:
            await asyncio.to_thread(scheduler.stop)
        return output.code

    try:
        return asyncio.run(run())
    finally:
        services.close()


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="ask a question; prints the answer as it streams")
    p.add_argument("question")
    p.add_argument("--mode", choices=MODES, default=None)
    p.add_argument("--ratio", type=float, default=None, help="recompute ratio in [0, 1]")
    p.add_argument(
        "--selector", choices=SELECTORS, default=None, help="which context tokens blend recomputes (default: settings)"
    )
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument(
        "--conversation",
        default=None,
        metavar="ID",
        help='store the turn: "new" starts a conversation, an ID continues one (an earlier answer names it); '
        "without it nothing is stored",
    )
    p.add_argument(
        "--collection",
        action="append",
        default=None,
        dest="collections",
        metavar="NAME",
        help="only search this collection (repeat for several; default: every collection)",
    )
    add_data_dir(p)
    add_client(p)
    p.set_defaults(func=cmd_ask)

"""A question's path from the router to the engine, read top-down in `service.py` (`AskService.admit`).

| module | stage |
|---|---|
| `types.py` | the values: `AskRequest` → `AskPlan` → (`answer.Answer`) → the engine's `GenerationRequest`; the events |
| `followup.py` | the retrieval query of a follow-up (`concat`, `rewrite`, `off`) |
| `prompt.py` | the prompt's layout with the earlier turns that fit; the turns' KV keys and writes (`TurnKV`) |
| `kv.py` | opening a plan's stored KV, computing what is missing (`PromptKV`) |
| `answer.py` | an accepted question: submit, stream, retry once on a corrupt entry (`Answer`) |
| `recorder.py` | metrics and the usage and timings of a finished answer (`AnswerRecorder`) |
| `turn.py` | finishing a turn: its KV stored, recorded in its conversation, the one `DoneEvent` (`TurnFinisher`) |
"""

from app.services.ask.answer import Answer
from app.services.ask.service import AskService
from app.services.ask.types import (
    AskBusy,
    AskEvent,
    AskPlan,
    AskRequest,
    AskValidationError,
    ConversationRef,
    DoneEvent,
    ErrorEvent,
    Source,
    SourcesEvent,
    TokenDelta,
)

__all__ = [
    "Answer",
    "AskBusy",
    "AskEvent",
    "AskPlan",
    "AskRequest",
    "AskService",
    "AskValidationError",
    "ConversationRef",
    "DoneEvent",
    "ErrorEvent",
    "Source",
    "SourcesEvent",
    "TokenDelta",
]

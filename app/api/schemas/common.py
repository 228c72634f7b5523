"""Error bodies and what every Out model built from a catalog record shares."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

JobStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]
DocumentStatusName = Literal["pending", "ready", "failed"]
KVState = Literal["fresh", "stale", "missing"]


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


# A record's datetime, as the API has always written it (`datetime.isoformat()`).
Timestamp = Annotated[str, BeforeValidator(_iso)]


class RecordOut(BaseModel):
    """An Out model read from a record's attributes (`Model.model_validate(record)`): a field is named
    once, on the record, and here only where the wire name differs (a `validation_alias`)."""

    model_config = ConfigDict(from_attributes=True, populate_by_name=True)


class ErrorOut(BaseModel):
    detail: str = Field(description="What went wrong, for a human")


class ValidationErrorOut(ErrorOut):
    """422: `detail` is one readable line; `errors` the per-field list (absent for checks made by services)."""

    errors: list[dict[str, Any]] = Field(default_factory=list, description="loc, msg, type per problem")


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorOut(BaseModel):
    error: OpenAIErrorBody


API_KEY_REQUIRED = "API key required"
MODELS_LOADING = "Models still loading"
# What every key check (app/api/deps.py) may answer on any route behind it: 429 past an address's wrong-key
# budget, 503 for a collection key before the catalog is open (and for a route's services before start-up).
GUARD_ERRORS = {
    429: "Too many requests with a wrong API key from this address; see Retry-After",
    503: MODELS_LOADING,
}
# What `guard_questions` (app/api/deps.py) answers, for the routers behind it.
QUESTION_GUARD_ERRORS = {
    401: "API key required (`server.protect_ask`, or collection keys exist)",
    429: "Too many requests from this API key / IP; see Retry-After",
}


# Every 429 and 503 carries it (app/api/errors.py `retry_after`): a rate limit's refill, a busy engine's estimate
# of when a place in its queue frees (engine/admission.py), a few seconds while the server starts.
RETRY_AFTER_HEADER: dict[str, Any] = {
    "Retry-After": {
        "description": "Seconds to wait before retrying: when the rate limit's bucket has refilled (429), when the "
        "engine expects a place in its queue to be free (503 busy), or a few while the server starts (503)",
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
    }
}
RETRY_STATUSES = (429, 503)  # the statuses that carry Retry-After


def error_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """A route's (or router's) `responses=` for its error statuses: each answers a `detail` body, 422 with
    the per-field `errors` too, 429 and 503 a Retry-After header."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status, description in descriptions.items():
        entry: dict[str, Any] = {"model": ValidationErrorOut if status == 422 else ErrorOut, "description": description}
        if status in RETRY_STATUSES:
            entry["headers"] = RETRY_AFTER_HEADER
        responses[status] = entry
    return responses

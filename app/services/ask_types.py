"""The question's values under their former module name, for importers not yet moved to
`app.services.ask.types` (app/api/schemas.py)."""

from app.services.ask.types import MAX_QUESTION_CHARS, MAX_SEED, AskRequest

__all__ = ["MAX_QUESTION_CHARS", "MAX_SEED", "AskRequest"]

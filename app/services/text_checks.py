"""Checks on untrusted text shared by the services and the API schemas (one definition of "blank")."""

from __future__ import annotations

from typing import Any

# Characters str.isspace() calls white space but Unicode's White_Space property (what `\s` means in the
# OpenAPI spec's regular expressions) does not: the ASCII information separators.
_NOT_UNICODE_SPACE = frozenset("\x1c\x1d\x1e\x1f")


def is_blank(text: str) -> bool:
    """True for text made only of Unicode White_Space (the empty string included)."""
    return all(ch.isspace() and ch not in _NOT_UNICODE_SPACE for ch in text)


def is_valid_utf8(text: str) -> bool:
    """False for strings JSON can carry but UTF-8 cannot (lone surrogates such as "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def nesting_depth(value: Any, limit: int) -> int:
    """Depth of nested lists/dicts in a JSON value, counting up to `limit + 1` (then it stops looking)."""
    depth, level = 0, [value]
    while level and depth <= limit:
        children = [c for v in level if isinstance(v, dict | list) for c in (v.values() if isinstance(v, dict) else v)]
        if any(isinstance(v, dict | list) for v in level):
            depth += 1
        level = children
    return depth


def invalid_strings(value: Any) -> bool:
    """True if any string (dict keys included) in a JSON value is not valid UTF-8."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not is_valid_utf8(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False

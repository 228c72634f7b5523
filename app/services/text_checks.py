"""Checks on untrusted text shared by the services and the API schemas (one definition of "blank")."""

from __future__ import annotations

import re
from typing import Any

# "Blank" has one definition, used by the request schemas (as a pattern in the OpenAPI spec) and the
# services: text with no character left once ingest's normalization (ingest/normalize.py) drops the
# characters that carry no text: white space, zero-width space/joiners, BOM, soft hyphen, control
# characters. The pattern matches one character that is none of those. (Python's and ECMA-262's `\s`
# differ at U+001C..U+001F, U+0085 (NEL) and U+FEFF, which are listed here explicitly, with all C1 controls.)
NOT_BLANK = r"[^\s\u200b\u200c\u200d\u2060\ufeff\u00ad\u0000-\u001f\u007f-\u009f]"
_NOT_BLANK = re.compile(NOT_BLANK)


def is_blank(text: str) -> bool:
    """True for text with no visible character: only white space, zero-width or control characters."""
    return _NOT_BLANK.search(text) is None


INVALID_UNICODE = "text must be valid Unicode (a lone surrogate such as \\ud800 is not)"


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

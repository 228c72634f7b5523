"""The repeated-line stop (`SamplingParams.stop_on_repeated_line`): tell a loop from a legitimate repeat in the
text an answer has generated so far, and hold back what could still turn out to be a loop's repeat, so that
it is never sent. It reads the generated text only (never the prompt, the mode or the model), so it is the
same in every mode.

The text is read as units: outside a fenced code block each sentence of a line is one (a heading, or a line
or sentence ending in ":" such as "Example:", is a label); inside one each non-blank line is; a fence line
is a marker, as is a bare list marker. A small model loops by writing again what it has just written, but an
answer with code repeats lines for good reasons: the same import in a second example, a closing brace,
`return x` in two functions, a fence, the same call made three times in a row to show a cache at work (the
default model's `print(expensive_function(3))  # Output: 9` × 3, which the former rule, any line equal to an
earlier one, cut off). So a unit just completed ends a loop only when:

1. (sentence) it is a prose sentence of at least MIN_REPEATED_LINE_CHARS that an earlier prose sentence
   already said: prose has no reason to say a sentence twice (a label or heading may: "Example:");
2. (run) the last units are back-to-back copies of the same p units (p ≥ 1) whose copies after the first hold
   at least MIN_REPEATED_UNITS units, not all of them code syntax (closing brackets, `else:`, `pass`): one
   line on its fourth copy in a row ("Yes." four times), two lines on their third, three lines or more (a
   whole example pasted again) on their second; never `}` after `}` after `}`.

A code line that comes back after other lines is never a loop by itself: only as part of a run.
A loop inside one line (`find_inline_loop`) is the other stop: a line that ends in one unit repeated back to
back, "`test_client.get` and `test_client.get` and …".

`RepeatedLineGuard` applies both to a stream: it holds back the completed units that repeat the units a
period before them (another copy may have begun), the unit being written while it is the start of an earlier
one, and a line's repeated tail, and releases them once they depart. A loop is thus found before its last
copy is sent; what it withheld is reported (`RepeatedLine`), so a reader can see what the stop judged repeated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from engine.types import RepeatedLine

MIN_REPEATED_LINE_CHARS = 8  # a shorter prose sentence said again ("Yes.", "- a") is not a loop by itself
# Back-to-back copies are a loop once the copies after the first hold this many units: a short line's fourth copy
# ("Ç¨\n\n" × 363 ran to the token cap), two lines' third, a longer block's second.
MIN_REPEATED_UNITS = 3
# A loop inside one line ("`test_client.get` and `test_client.get` and …"): the line ends with one unit
# repeated back to back. Its smallest period must be this long and hold a letter or digit, so table rules
# ("| --- | --- |"), rows of zeros ("| 0 | 0 | 0 |") and "....." are never loops; and it must come this many
# times, so a value written out three times in a list ("[1, 2, 3, 1, 2, 3, 1, 2, 3]") is not one either.
MIN_LOOP_UNIT_CHARS = 8
MIN_LOOP_COPIES = 4
# Held from this many characters of a possible second copy: at most three characters of a loop's repeats are
# sent; ordinary text is delayed only while its last characters echo the line so far.
_HOLD_REPEATED_CHARS = 4
_LOOP_WINDOW_CHARS = 2048  # of the current line searched (a loop is found long before it grows past this)

UnitKind = Literal["prose", "label", "code", "syntax", "marker"]
LoopRule = Literal["sentence", "run", "inline"]

_SPACES = re.compile(r"\s+")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")  # between two sentences of one line
# A fence at any indent: a model nests an example in a list item by four spaces or more.
_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_FENCE_LINE = re.compile(r"^[ \t]*(```|~~~)", re.MULTILINE)
# A heading or a bold label line ("## Example", "**Output:**"); a sentence ending in ":" is a label too.
_HEADING = re.compile(r"^ {0,3}(#{1,6}(\s|$)|\*\*[^*]+\*\*:?\s*$)")
_LIST_MARKER = re.compile(r"^\s*([-*+]|\d{1,3}[.)])\s*$")
# Code lines that recur in any program: brackets and separators alone, a bare keyword.
_SYNTAX = re.compile(
    r"^[()\[\]{}<>;,:\s]*$|^(else|try|finally|except|pass|return|break|continue|end|do|done|fi|then|\.\.\.)\s*:?;?$",
    re.IGNORECASE,
)
# Where a sentence may have ended, or a line: the guard checks for a loop there.
_BOUNDARY = re.compile(r"[.!?](?=\s|$)|\n")


@dataclass(frozen=True)
class Unit:
    """A sentence, label or line of the text (see the module doc)."""

    start: int  # in the text
    end: int  # one past its last character (trailing white space excluded)
    key: str  # what is compared: lower case, white space collapsed
    kind: UnitKind


@dataclass(frozen=True)
class Units:
    done: list[Unit]  # the completed units, in order
    in_progress: int | None  # where the unit being written begins (None: the text ends at a unit's end)


@dataclass(frozen=True)
class LineLoop:
    start: int  # where the repeat begins in the text: it is withheld, with the white space before it
    earlier_start: int  # where what it repeats begins (the earlier sentence, or the copy before)
    rule: LoopRule


@dataclass(frozen=True)
class InlineLoop:
    start: int  # index in the text where the first copy of the unit begins
    period: int  # the unit's length in characters
    num_copies: float  # how many times it occurs back to back (the last copy may be partial)


def _key(text: str) -> str:
    return _SPACES.sub(" ", text.strip().lower())


def split_units(text: str) -> Units:
    """`text` as units (see the module doc). A line is complete at its newline; inside a line a sentence
    is complete once white space follows its end, and the text's last sentence once it ends in . ! or ?."""
    done: list[Unit] = []
    in_progress: int | None = None
    in_code = False
    lines = text.split("\n")
    pos = 0
    for i, line in enumerate(lines):
        start, complete = pos, i < len(lines) - 1
        pos += len(line) + 1
        body = line.strip()
        if not body:
            continue
        lead = start + len(line) - len(line.lstrip())
        end = start + len(line.rstrip())
        if _FENCE.match(line) or in_code:
            if not complete:  # a code line (or a fence) is only known once its line ends
                in_progress = lead
            elif _FENCE.match(line):
                done.append(Unit(lead, end, _key(body), "marker"))
                in_code = not in_code
            else:
                done.append(Unit(lead, end, _key(body), "syntax" if _SYNTAX.match(body) else "code"))
            continue
        if _HEADING.match(line) or _LIST_MARKER.match(line) or _SYNTAX.match(body):
            if not complete:
                in_progress = lead  # a heading's "." is not a sentence's end
            elif _HEADING.match(line):
                done.append(Unit(lead, end, _key(body), "label"))
            else:  # a bare list marker, or a closing bracket of code written without a fence
                done.append(Unit(lead, end, _key(body), "marker" if _LIST_MARKER.match(line) else "syntax"))
            continue
        breaks = list(_SENTENCE_BREAK.finditer(line))
        spans = zip([0] + [b.end() for b in breaks], [b.start() for b in breaks] + [end - start], strict=True)
        for k, (s, e) in enumerate(spans):
            piece = line[s:e]
            if not piece.strip():
                continue
            piece_start = start + s + len(piece) - len(piece.lstrip())
            if not complete and k == len(breaks) and piece.rstrip()[-1] not in ".!?":
                in_progress = piece_start  # the sentence being written
                break
            kind: UnitKind = "label" if piece.rstrip().endswith(":") else "prose"
            done.append(Unit(piece_start, start + e, _key(piece), kind))
    return Units(done, in_progress)


def _loop_at_end(units: list[Unit]) -> LineLoop | None:
    """The loop the last unit completes, by the rules of the module doc, else None."""
    last, n = units[-1], len(units)
    if last.kind == "prose" and len(last.key) >= MIN_REPEATED_LINE_CHARS:
        earlier = next((u for u in units[:-1] if u.kind == "prose" and u.key == last.key), None)
        if earlier is not None:
            return LineLoop(last.start, earlier.start, "sentence")
    keys = [u.key for u in units]
    for p in range(1, n // 2 + 1):
        period = keys[n - p :]
        copies = 1
        while n >= (copies + 1) * p and keys[n - (copies + 1) * p : n - copies * p] == period:
            copies += 1
        if copies == 1 or (copies - 1) * p < MIN_REPEATED_UNITS:
            continue
        if not all(u.kind == "syntax" for u in units[n - p :]):
            return LineLoop(units[n - p].start, units[n - 2 * p].start, "run")
    return None


def find_line_loop(text: str) -> LineLoop | None:
    """The loop that the unit `text` has just completed ends, else None (also None while a unit is being
    written)."""
    units = split_units(text)
    if units.in_progress is not None or not units.done:
        return None
    return _loop_at_end(units.done)


def hold_start(text: str) -> int:
    """Where the text that could still become a loop's repeat begins (len(text): none could): the completed
    units that repeat, in order, the units a period before them, and the unit being written while it is the
    start of an earlier unit. White space before it is held with it."""
    units = split_units(text)
    done, n = units.done, len(units.done)
    keys = [u.key for u in done]
    hold = len(text)
    longest = 0  # the most trailing units that are the start of a second copy of the units before them
    for p in range(2, n):
        j = 0
        while j < p and n - 1 - j - p >= 0 and keys[n - 1 - j] == keys[n - 1 - j - p]:
            j += 1
        if j < p:
            longest = max(longest, j)
    if longest:
        hold = done[n - longest].start
    if units.in_progress is not None:
        current = _key(text[units.in_progress :])
        if current and any(k.startswith(current) for k in keys):
            hold = min(hold, units.in_progress)
    while len(text) > hold > 0 and text[hold - 1].isspace():
        hold -= 1
    return hold


def find_inline_loop(text: str, min_copies: float = MIN_LOOP_COPIES, min_repeated_chars: int = 0) -> InlineLoop | None:
    """The loop the current line of `text` ends in: its smallest period p repeated at least `min_copies`
    times with at least `min_repeated_chars` after the first copy (p ≥ MIN_LOOP_UNIT_CHARS, the unit
    holding a letter or digit), else None."""
    line_start = max(text.rfind("\n") + 1, len(text) - _LOOP_WINDOW_CHARS)
    line = text[line_start:]
    n = len(line)
    for p in range(MIN_LOOP_UNIT_CHARS, min(int(n // min_copies), n - min_repeated_chars) + 1):
        i = n - 1
        while i >= p and line[i] == line[i - p]:
            i -= 1
        total = n - 1 - i + p  # the periodic tail: one unit plus every character equal to the one p before it
        if total / p < min_copies or total - p < min_repeated_chars:
            continue
        unit = line[n - p :]
        # Found at the smallest p ≥ MIN_LOOP_UNIT_CHARS; a unit that is itself a shorter repeat ("0 | 0 | ")
        # or holds no letter or digit ("--------") is a rule or a row of values, not a loop.
        shortest = next(q for q in range(1, p + 1) if p % q == 0 and unit == unit[:q] * (p // q))
        if shortest < MIN_LOOP_UNIT_CHARS or not any(c.isalnum() for c in unit):
            return None
        return InlineLoop(start=line_start + n - total, period=p, num_copies=total / p)
    return None


def ends_in_loop(text: str) -> bool:
    """Whether `text` ends a loop, by either stop (the test `RepetitionControl.should_stop` makes)."""
    return find_line_loop(text) is not None or find_inline_loop(text) is not None


class RepeatedLineGuard:
    """Holds back what could still be a loop's repeat and ends the stream, withholding it, once it is one.

    `push` returns the text that may be sent and, when the text just completed a loop, what was withheld
    (the caller then finishes with reason "repetition"). Disabled, it passes text through. New text streams
    at once; a loop lags by at most the units being checked. Inside one line, once its tail repeats what
    came a unit earlier (a second copy may have begun) that copy is held; at MIN_LOOP_COPIES copies the
    answer ends after the first copy, so of a loop's repeats at most their first characters are ever sent.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._sent = ""  # every character released so far
        self._held = ""  # written but not yet released
        self._checked = 0  # boundaries up to here (in sent + held) were checked for a loop already

    def push(self, text: str) -> tuple[str, RepeatedLine | None]:
        if not self.enabled:
            return text, None
        self._held += text
        for boundary in _BOUNDARY.finditer(self._held):
            upto = self._sent + self._held[: boundary.end()]
            if len(upto) <= self._checked:
                continue  # the same text as at an earlier push: the same answer
            self._checked = len(upto)
            loop = find_line_loop(upto)
            if loop is not None:
                return self._stop(upto, loop.start, RepeatedLine(upto[loop.start :].strip(), loop.earlier_start))
        full = self._sent + self._held
        inline = find_inline_loop(full)
        if inline is not None:  # the line loops: keep its first copy, drop the rest
            first_end = inline.start + inline.period
            return self._stop(full, first_end, RepeatedLine(full[inline.start : first_end].strip(), inline.start))
        hold = hold_start(full)
        maybe = find_inline_loop(full, min_copies=1, min_repeated_chars=_HOLD_REPEATED_CHARS)
        if maybe is not None:  # a second copy may have begun: hold it until it departs or the loop is found
            hold = min(hold, maybe.start + maybe.period)
        release = max(0, hold - len(self._sent))
        out, self._held = self._held[:release], self._held[release:]
        self._sent += out
        return out, None

    def _stop(self, text: str, cut: int, repeated: RepeatedLine) -> tuple[str, RepeatedLine]:
        """Release `text` up to `cut` (less the white space before it), withhold the rest."""
        while cut > len(self._sent) and text[cut - 1].isspace():
            cut -= 1
        out = text[len(self._sent) : max(len(self._sent), cut)]
        self._sent += out
        self._held = ""
        return out, repeated

    def flush(self) -> str:
        """What is held, at a finish that is not a repetition (EOS, a stop string, max_tokens)."""
        out, self._held = self._held, ""
        self._sent += out
        return out

    def closing_fence(self) -> str:
        """Text that closes a code fence the released answer left open (empty if none is open), so a
        repetition stop inside a code block does not leave the rest of a rendered page in code."""
        fences = _FENCE_LINE.findall(self._sent)
        if len(fences) % 2 == 0:
            return ""
        return ("" if self._sent.endswith("\n") else "\n") + fences[-1]

"""The calibration set, generated from word lists here (never a held-out dev set, nothing from a hub).

Three kinds of prompt, each laid out as /ask lays it out (the passage that answers placed nearest the
question, five others before it):

- look-ups: made-up places, each passage holding one unique fact (an access code, a date, a name);
- two-hop questions: passage A names a person, passage B says where that person was born;
- follow-ups: turn 1 "Tell me about the X.", turn 2 "What is the access code of that place?", the
  turn-1 answer being full prefill's (so every candidate sees the same history). Each of the six passages
  ends with a profile of its own place (where, since when, who, how many), so turn 1 has something to tell;
  the first, third and fifth profiles hold an access code, so turn 2 has three to choose from.

Each passage is a ~250–450-token section of real documentation (app/calibration/prose.py) with the fact
inserted as a paragraph of its own: no text repeats across a prompt's passages or across the set.
(calset-1 padded ~120-token passages with six shared filler templates; on Qwen2.5 that repetition made the
set disagree with held-out data. calset-2's follow-up passages held the code as one sentence in a section
about something else: "Tell me about the X" had nothing to tell, full prefill's turn 1 wandered to other
places, and it then read the right code on 2 of 6 follow-ups, too few for the set to see a blend lose one.
With profiles it reads 4–5 of 8 on Qwen2.5-Coder-0.5B in float32 (two draws); with a code in all six
profiles, or the profile opening the page, fewer: a 0.5B model confuses near-identical sentences ~2k tokens
apart. On these pages the blends read the right code more often than full prefill does, so the held-out
conversation check, not this set, decides a follow-up budget: docs/benchmarks.md, "The calibration set".)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from app.calibration.prose import insert_paragraph, sections

SET_VERSION = "calset-3"
NUM_PASSAGES = 6
CASES_PER_KIND = (8, 4, 8)  # look-ups, two-hop questions, follow-ups: the default set

_STEMS = [
    "Ash",
    "Bel",
    "Cor",
    "Dun",
    "Eld",
    "Fal",
    "Gor",
    "Hal",
    "Isk",
    "Jor",
    "Kel",
    "Lor",
    "Mar",
    "Nor",
    "Oss",
    "Pel",
]
_ENDS = ["ford", "mere", "holt", "wick", "stead", "vale", "moor", "by", "ton", "haven", "field", "gate"]
_KINDS = ["Institute", "Library", "Workshop", "Depot", "Gallery", "Archive", "Clinic", "Mill", "Observatory", "Hall"]
_FIRST = ["Alma", "Bruno", "Celia", "Dario", "Elin", "Farid", "Greta", "Hugo", "Ilse", "Jonas", "Katya", "Lucas"]
_LAST = ["Abara", "Berg", "Castell", "Dunmore", "Eklund", "Ferro", "Gallo", "Haas", "Ibsen", "Jovic", "Kaur", "Lund"]
_CITIES = ["Arendal", "Bruges", "Coimbra", "Debrecen", "Esbjerg", "Florina", "Girona", "Hamar", "Izmir", "Jena"]
_MONTHS = ["January", "March", "April", "June", "July", "August", "October", "November"]
LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # of made-up codes: no I or O


@dataclass(frozen=True)
class CalibrationCase:
    """One prompt of the set. `passages` are best first (retrieval order); `history` is (question, None)
    for a follow-up, whose answer is full prefill's, filled in when the set is measured."""

    kind: str  # "lookup", "two_hop", "followup"
    passages: tuple[str, ...]
    question: str
    answer: str  # what a right answer contains
    first_question: str | None = None  # follow-ups: turn 1


def access_code(rng: random.Random) -> str:
    """A made-up access code, two letters and four digits (`KX-4821`): the form every generated set and look-up
    corpus gives them."""
    return f"{rng.choice(LETTERS)}{rng.choice(LETTERS)}-{rng.randint(1000, 9999)}"


def _name(rng: random.Random) -> str:
    return f"{rng.choice(_STEMS)}{rng.choice(_ENDS)} {rng.choice(_KINDS)}"


def _fact(rng: random.Random, place: str, i: int) -> tuple[str, str, str]:
    """(sentence, question, answer) of one unique fact about `place`."""
    match i % 3:
        case 0:
            code = access_code(rng)
            return f"The access code of the {place} is {code}.", f"What is the access code of the {place}?", code
        case 1:
            date = f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1995, 2024)}"
            question = f"When did the east wing of the {place} open?"
            return f"The east wing of the {place} opened on {date}.", question, date
        case _:
            person = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
            return f"The head of the {place} is {person}.", f"Who is the head of the {place}?", person


def _profile(rng: random.Random, place: str, code: str | None) -> str:
    """A paragraph about `place`, the last of its page: where, since when, who, how many, and the access
    code when it has one."""
    city, year = rng.choice(_CITIES), rng.randint(1950, 2020)
    head, staff = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", rng.randint(6, 120)
    code_sentence = f" The access code of the {place} is {code}." if code is not None else ""
    return (
        f"The {place} stands in {city} and has been open since {year}. Its {staff} staff work under "
        f"{head}.{code_sentence} Deliveries come in at the side entrance."
    )


class _Prose:
    """The documentation sections in a seeded order, each handed out once."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._sections = sections()
        rng.shuffle(self._sections)

    def passage(self, *facts: str, profile: str | None = None) -> str:
        """A section with each fact inserted as a paragraph of its own, spread over its length; `profile`,
        when given, is its last paragraph."""
        if not self._sections:
            raise ValueError("the calibration set asks for more passages than the documentation sections hold")
        text = self._sections.pop()
        if profile is not None:
            text = insert_paragraph(text, profile, 1.0)
        for i, fact in enumerate(facts):
            text = insert_paragraph(text, fact, (i + 1) / (len(facts) + 1) + self._rng.uniform(-0.15, 0.15))
        return text


def make_cases(
    num_lookups: int = CASES_PER_KIND[0],
    num_two_hop: int = CASES_PER_KIND[1],
    num_followups: int = CASES_PER_KIND[2],
    seed: int = 0,
) -> list[CalibrationCase]:
    rng = random.Random(f"{SET_VERSION}-{seed}")
    prose = _Prose(rng)
    cases: list[CalibrationCase] = []
    places: set[str] = set()

    def new_place() -> str:
        while (name := _name(rng)) in places:
            pass
        places.add(name)
        return name

    for i in range(num_lookups):
        docs = []
        for j in range(NUM_PASSAGES):
            place = new_place()
            fact, question, answer = _fact(rng, place, i + j)
            docs.append((prose.passage(fact), question, answer))
        target = docs[0]
        cases.append(CalibrationCase("lookup", tuple(d[0] for d in docs), target[1], target[2]))
    for _ in range(num_two_hop):
        place, person, city = new_place(), f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", rng.choice(_CITIES)
        a = prose.passage(f"The head of the {place} is {person}.")
        b = prose.passage(f"{person} was born in {city}.", f"{person} studied in {rng.choice(_CITIES)}.")
        others = []
        for j in range(NUM_PASSAGES - 2):
            other = new_place()
            others.append(prose.passage(_fact(rng, other, j)[0]))
        question = f"In which city was the head of the {place} born?"
        cases.append(CalibrationCase("two_hop", (b, a, *others), question, city))
    for _ in range(num_followups):
        docs = []
        for j in range(NUM_PASSAGES):
            place = new_place()
            code = access_code(rng)
            # Every other page holds a code too (three in the prompt): with a code on all six, a 0.5B model's
            # full prefill read another page's code for the place it had just described.
            listed = code if j % 2 == 0 else None
            docs.append((prose.passage(profile=_profile(rng, place, listed)), place, code))
        text, place, code = docs[0]
        cases.append(
            CalibrationCase(
                "followup",
                tuple(d[0] for d in docs),
                "What is the access code of that place?",
                code,
                first_question=f"Tell me about the {place}.",
            )
        )
    return cases


def describe(cases: list[CalibrationCase]) -> str:
    kinds = {k: sum(c.kind == k for c in cases) for k in ("lookup", "two_hop", "followup")}
    return f"{SET_VERSION}: " + ", ".join(f"{n} {k}" for k, n in kinds.items()) + f", {NUM_PASSAGES} passages each"

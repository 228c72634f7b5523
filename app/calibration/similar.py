"""Look-ups among similar chunks: the value a question asks for stands in one chunk, and the other retrieved chunks
state the same kind of value with the same words and other characters (config pages with other ports, release
notes with other versions, price lists, API pages with near-identical signatures).

Each case is a group of 2–6 documents built from one template, one document per made-up project, each a short
page of its own real prose (`app.calibration.prose`, ~700 characters) under the project's name, with the
project's facts inserted mid-passage. The question asks
for one project's value; a right answer contains it (normalised, as every look-up is checked). Four kinds:

- sentence: one sentence per document, e.g. "The access code of project Arbor is K56-1950.";
- table: a Markdown table of several projects per document (several values per chunk, rows alike);
- code: a config block (TOML / YAML / JSON) per document;
- multi: several values of one project in one sentence (its main, admin and metrics ports).

Two parts that share no template, no value form, no project name and no prose section: `tune` (what a
calibration may be tuned on) and `check` (what a record must pass before it ships, and what
`bench lookup --distractors similar` asks). Deterministic for a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from app.calibration.prose import insert_paragraph, sections

Part = Literal["tune", "check"]
KINDS = ("sentence", "table", "code", "multi")

_NAMES: dict[Part, list[str]] = {
    "tune": [
        "Arbor", "Basalt", "Cobalt", "Delphi", "Ember", "Falcon", "Garnet", "Harrow", "Indigo", "Juniper",
        "Kestrel", "Lantern", "Marble", "Nimbus", "Onyx", "Pebble", "Quartz", "Raven", "Saffron", "Thistle",
        "Umber", "Velvet", "Willow", "Zephyr",
    ],
    "check": [
        "Acorn", "Bramble", "Cinder", "Dune", "Egret", "Fjord", "Glacier", "Heron", "Iris", "Jasper", "Kelp",
        "Lichen", "Meadow", "Nectar", "Orchid", "Prism", "Quill", "Ripple", "Sorrel", "Tundra", "Upland",
        "Vireo", "Wren", "Yarrow",
    ],
}  # fmt: skip
# A project is named by one word of its part's list and one of these: names never repeat across a part's cases,
# so all of them can be ingested into one corpus, and projects of one word ("Arbor North", "Arbor Delta") are
# near-identical names as well.
_SECONDS: dict[Part, list[str]] = {
    "tune": ["North", "South", "Delta", "Prime", "Nova", "Atlas"],
    "check": ["Alpha", "Omega", "Sigma", "Kappa", "Lumen", "Vector"],
}
_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
_OWNERS = ["infra", "payments", "search", "billing", "mobile", "data", "identity", "growth"]


@dataclass(frozen=True)
class SimilarDoc:
    title: str
    text: str


@dataclass(frozen=True)
class SimilarCase:
    kind: str
    part: Part
    docs: tuple[SimilarDoc, ...]  # the group; the asked project's document first
    question: str
    answer: str  # what a right answer contains

    @property
    def num_similar(self) -> int:
        """Documents stating the same kind of value with other characters."""
        return len(self.docs) - 1


# -- values: each part has its own forms ------------------------------------------------------------------
def _code(rng: random.Random, part: Part) -> str:
    if part == "tune":  # K56-1950
        return f"{rng.choice(_LETTERS)}{rng.randint(10, 99)}-{rng.randint(1000, 9999)}"
    return f"{rng.choice(_LETTERS)}{rng.choice(_LETTERS)}{rng.randint(1, 9)}/{rng.randint(100, 999)}"  # QX4/512


def _version(rng: random.Random, part: Part) -> str:
    if part == "tune":
        return f"{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 20)}"
    return f"{rng.randint(2019, 2026)}.{rng.randint(1, 12):02d}.{rng.randint(1, 9)}"  # calendar versions


def _port(rng: random.Random, used: set[str]) -> str:
    while True:
        port = str(rng.randint(1025, 65000))
        if port not in used:
            used.add(port)
            return port


def _price(rng: random.Random) -> str:
    return f"{rng.randint(1, 9)},{rng.randint(100, 999)}.{rng.choice(['00', '50', '90', '95'])}"


# -- the four kinds, two templates each (tune / check) ---------------------------------------------------
def _sentence(rng: random.Random, part: Part, names: list[str], used: set[str]) -> tuple[list[str], str, str]:
    """(one paragraph per project, the question about names[0], its answer)."""
    if part == "tune":
        values = [_code(rng, part) for _ in names]
        paragraphs = [f"The access code of project {n} is {v}." for n, v in zip(names, values, strict=True)]
        return paragraphs, f"What is the access code of project {names[0]}?", values[0]
    values = [_price(rng) for _ in names]
    paragraphs = [
        f"A yearly licence for the {n} suite costs ${v}, billed per seat." for n, v in zip(names, values, strict=True)
    ]
    return paragraphs, f"How much does a yearly licence for the {names[0]} suite cost?", values[0]


def _table(rng: random.Random, part: Part, names: list[str], used: set[str]) -> tuple[list[str], str, str]:
    """Each document a table of its project and two more (several values per chunk, rows alike)."""
    ports = {n: _port(rng, used) for n in names}
    paragraphs = []
    spare = [f"{a} {b}" for a in _NAMES[part] for b in _SECONDS[part] if f"{a} {b}" not in names]
    for n in names:
        others = rng.sample(spare, 2)
        for m in others:
            ports.setdefault(m, _port(rng, used))
        rows = [n, *others]
        rng.shuffle(rows)
        if part == "tune":
            lines = ["| Project | Port | Owner |", "|---|---|---|"]
            lines += [f"| {r} | {ports[r]} | {rng.choice(_OWNERS)} |" for r in rows]
        else:
            lines = ["| Service | Team | Listens on |", "| --- | --- | --- |"]
            lines += [f"| {r} gateway | {rng.choice(_OWNERS)} | `:{ports[r]}` |" for r in rows]
        paragraphs.append("\n".join(lines))
    question = (
        f"Which port does project {names[0]} use?"
        if part == "tune"
        else f"On which port does the {names[0]} gateway listen?"
    )
    return paragraphs, question, ports[names[0]]


def _config(rng: random.Random, part: Part, names: list[str], used: set[str]) -> tuple[list[str], str, str]:
    values = [_version(rng, part) for _ in names]
    slugs = [n.lower().replace(" ", "-") for n in names]
    paragraphs = []
    for slug, v in zip(slugs, values, strict=True):
        port = _port(rng, used)
        if part == "tune":
            paragraphs.append(f'```toml\n[project.{slug}]\nversion = "{v}"\nport = {port}\n```')
        else:
            paragraphs.append(f"```yaml\nservice: {slug}-api\nrelease: {v}\nreplicas: {rng.randint(2, 9)}\n```")
    question = (
        f"Which version does the config of project {names[0]} pin?"
        if part == "tune"
        else f"Which release does the {slugs[0]}-api service run?"
    )
    return paragraphs, question, values[0]


def _multi(rng: random.Random, part: Part, names: list[str], used: set[str]) -> tuple[list[str], str, str]:
    """Three values of one project per paragraph; the question asks for the middle one."""
    paragraphs, asked = [], ""
    for i, n in enumerate(names):
        a, b, c = (_port(rng, used) for _ in range(3))
        if part == "tune":
            paragraphs.append(f"Project {n} serves on port {a}; its admin port is {b} and its metrics port is {c}.")
        else:
            paragraphs.append(f"{n} exposes HTTP on {a}, gRPC on {b} and Prometheus metrics on {c}.")
        if i == 0:
            asked = b
    question = (
        f"What is the admin port of project {names[0]}?"
        if part == "tune"
        else f"On which port does {names[0]} serve gRPC?"
    )
    return paragraphs, question, asked


_MAKERS = {"sentence": _sentence, "table": _table, "code": _config, "multi": _multi}


def _short(section: str, max_chars: int = 700) -> str:
    """The section's first paragraphs, about `max_chars` (at least two): a short page, as the pages users look a
    value up in are, so its project and value are a large share of what retrieval embeds."""
    parts = section.split("\n\n")
    kept, size = parts[:2], sum(len(p) for p in parts[:2])
    for part in parts[2:]:
        if size + len(part) > max_chars:
            break
        kept.append(part)
        size += len(part)
    return "\n\n".join(kept)


def similar_cases(part: Part, num: int, seed: int = 0, max_similar: int = 5) -> list[SimilarCase]:
    """`num` cases of `part`, the kinds in turn, each a group of 2 … max_similar + 1 documents."""
    rng = random.Random(f"{part}-{seed}")
    all_names = [f"{a} {b}" for a in _NAMES[part] for b in _SECONDS[part]]
    rng.shuffle(all_names)
    prose = sections()
    # The parts read disjoint prose: tune the even sections, check the odd ones.
    pool = prose[0::2] if part == "tune" else prose[1::2]
    rng.shuffle(pool)
    cases = []
    cursor = 0
    for i in range(num):
        kind = KINDS[i % len(KINDS)]
        size = rng.randint(2, max_similar + 1)
        names, all_names = all_names[:size], all_names[size:]
        if len(names) < size:
            raise ValueError(f"at most {len(_NAMES[part]) * len(_SECONDS[part])} projects per part")
        paragraphs, question, answer = _MAKERS[kind](rng, part, names, set())
        docs = []
        for name, paragraph in zip(names, paragraphs, strict=True):
            section = _short(pool[cursor % len(pool)])
            cursor += 1
            title = f"Project {name}: {section.splitlines()[0].lstrip('# ').strip()}"
            # The page names its project at the top, as a real page does, and states the value mid-passage.
            heading = f"# Project {name}" if part == "tune" else f"# {name} reference"
            text = f"{heading}\n\n{insert_paragraph(section, paragraph, rng.uniform(0.3, 0.7))}"
            docs.append(SimilarDoc(title=title, text=text))
        cases.append(SimilarCase(kind=kind, part=part, docs=tuple(docs), question=question, answer=answer))
    return cases

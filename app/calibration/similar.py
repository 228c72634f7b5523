"""Look-ups among similar chunks: the value a question asks for stands in one chunk, and the other retrieved chunks
state the same kind of value with the same words and other characters (config pages with other ports, release
notes with other versions, price lists, API pages with near-identical signatures).

Each case is a group of 2–6 documents built from one template, one short page (~500–700 characters) per made-up
project. A page is about its project and about what the question asks (its licence, its services and ports, its
release): the project's name is in the title, the heading and the prose, and the prose around the value talks
about the same topic, as a real reference page does, so the embedder retrieves the page for the question and it
clears the relevance floor. Project names are single made-up words, and the names of one case differ in both
syllables ("Kalorn", "Bevex"), so the name alone tells the pages apart. The question asks for one project's value;
a right answer contains it (normalised, as every look-up is checked). Five kinds:

- sentence: one sentence states the value, e.g. "The access code of project Kalorn is K56-1950.";
- table: a Markdown table of the project's services (several values per chunk, rows alike across pages);
- code: a config block (TOML / YAML) per page;
- multi: several values of one project in one sentence (its main, admin and metrics ports);
- followup: a conversation's second question, "… of that project?", after a first turn about the project (the
  case's `history`); the value stands in a sentence.

A second shape, `several` (`similar_cases(..., shape="several")`): every page of a case holds three different
named values of its project (an access code, a budget and a contact person; a rack position, a serial number and
a renewal date), and the question asks for one of them by the project's name, so a right answer takes the asked
value from the asked page among the same three labels on every page, and not its neighbour on the same page. Two
kinds in turn, the asked value's label moving through the three:

- prose: the three values in three sentences of one paragraph;
- list: a bulleted list of the three, after a line naming the project.

Two parts that share no template, no value form and no project name: `tune` (what a calibration may be tuned on)
and `check` (what a record must pass before it ships, and what `bench lookup --distractors similar` asks). The
shapes share no project name either (their names end differently). Every project name is unique within a part and
shape, so all of its cases can be ingested into one corpus, where a question also retrieves the same kind of page
from other cases. Deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.calibration.calset import LETTERS

Part = Literal["tune", "check"]
Shape = Literal["one", "several"]
KINDS = ("sentence", "table", "code", "multi", "followup")
SEVERAL_KINDS = ("prose", "list")
SHAPES: tuple[Shape, ...] = ("one", "several")

# Names are an onset and an ending from the part's own lists: the parts' onsets differ, so no name is in both.
_ONSETS: dict[Part, list[str]] = {
    "tune": ["Ka", "Be", "Do", "Fi", "Ga", "Hu", "Jo", "Ke", "Lu", "Mo", "Ni", "Po", "Ra", "Si", "Tu", "Va"],
    "check": [
        "Al", "Bru", "Cre", "Dra", "El", "Fro", "Gli", "Gro", "Il", "Kri", "Or", "Pla", "Qui", "Ska", "Tre", "Ul",
    ],
}  # fmt: skip
_ENDINGS: dict[Part, list[str]] = {
    "tune": ["lorn", "vex", "drin", "mask", "tal", "venor", "rik", "zum", "barra", "nox", "pell", "dory"],
    "check": ["anth", "esk", "ivo", "mont", "ora", "nyx", "ello", "andt", "ufel", "ison", "arek", "obo"],
}
# The several-values shape's endings: no name of one shape is a name of the other.
_SEVERAL_ENDINGS: dict[Part, list[str]] = {
    "tune": ["quist", "bane", "ford", "mire", "tock", "wyn", "zar", "dell", "grim", "holt", "pax", "rune"],
    "check": ["ard", "ebb", "isk", "oon", "umb", "yre", "alf", "enz", "ock", "urst", "ilt", "aph"],
}
_TEAMS = ["infra", "payments", "search", "billing", "mobile", "data", "identity", "growth"]
_REGIONS = ["Frankfurt", "Dublin", "Oregon", "Singapore", "Sydney", "Montreal", "Tokyo", "Sao Paulo"]


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
    # A follow-up's earlier turn(s), oldest first: (question, answer) as a client sent and the server answered.
    history: tuple[tuple[str, str], ...] = ()
    shape: Shape = "one"

    @property
    def num_similar(self) -> int:
        """Documents stating the same kind of value with other characters."""
        return len(self.docs) - 1


@dataclass(frozen=True)
class _Template:
    """One kind in one part: the topic's prose, the value paragraph and the question."""

    title: str  # "{name}: …"
    heading: str  # "# …{name}…"
    prose: tuple[str, ...]  # topical sentences about {name}; {team}, {region}, {year}, {count} are filled in
    # (rng, name, values used in the case) -> (the paragraph stating the project's value(s), the asked value)
    value: Callable[[random.Random, str, set[str]], tuple[str, str]]
    question: str  # about {name} ({slug}: its lower-case id)
    first_turn: tuple[str, str] | None = None  # followup: the earlier turn (question, answer) about {name}


# -- values: each part has its own forms ------------------------------------------------------------------
def _unique(rng: random.Random, used: set[str], make: Callable[[random.Random], str]) -> str:
    """A value no other value of the case equals or holds (so the asked one stands in one page only)."""
    while True:
        value = make(rng)
        if not any(value in u or u in value for u in used):
            used.add(value)
            return value


def _port(rng: random.Random) -> str:
    return str(rng.randint(3000, 9899))  # four digits, never a year of the prose


def _access_code(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    code = _unique(rng, used, lambda r: f"{r.choice(LETTERS)}{r.randint(10, 99)}-{r.randint(1000, 9999)}")
    return f"The access code of project {name} is {code}.", code


def _ports_table(
    rng: random.Random, name: str, used: set[str], head: tuple[str, str], parts: tuple[str, ...], cell: str
) -> tuple[str, str]:
    """A Markdown table of the project's parts, each with a unique port (written as `cell`) and a team; the
    first row's port is the value asked."""
    ports = [_unique(rng, used, _port) for _ in parts]
    teams = rng.sample(_TEAMS, len(parts))
    rows = [
        f"| {name} {part} | {cell.format(port)} | {team} |"
        for part, port, team in zip(parts, ports, teams, strict=True)
    ]
    return "\n".join([*head, *rows]), ports[0]


def _worker_table(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    head = ("| Component | Port | Owner |", "|---|---|---|")
    return _ports_table(rng, name, used, head, ("worker", "API", "dashboard"), "{}")


def _toml(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    version = _unique(rng, used, lambda r: f"{r.randint(1, 9)}.{r.randint(0, 30)}.{r.randint(0, 20)}")
    port = _unique(rng, used, _port)
    return f'```toml\n[project.{name.lower()}]\nversion = "{version}"\nport = {port}\n```', version


def _three_ports(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    a, b, c = (_unique(rng, used, _port) for _ in range(3))
    return f"Project {name} serves on port {a}; its admin port is {b} and its metrics port is {c}.", b


def _deploy_token(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    token = _unique(rng, used, lambda r: f"DT-{r.randint(10000, 99999)}-{r.choice(LETTERS)}")
    return f"The deploy token of project {name} is {token}.", token


def _price(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    price = _unique(
        rng, used, lambda r: f"{r.randint(1, 9)},{r.randint(100, 999)}.{r.choice(['00', '50', '90', '95'])}"
    )
    return f"A yearly licence for the {name} suite costs ${price}, billed per seat.", price


def _gateway_table(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    head = ("| Service | Listens on | Team |", "| --- | --- | --- |")
    return _ports_table(rng, name, used, head, ("scheduler", "gateway", "indexer"), "`{}`")


def _yaml(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    release = _unique(rng, used, lambda r: f"{r.randint(2019, 2026)}.{r.randint(1, 12):02d}.{r.randint(1, 9)}")
    block = f"```yaml\nservice: {name.lower()}-api\nrelease: {release}\nreplicas: {rng.randint(2, 9)}\n```"
    return block, release


def _protocols(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    a, b, c = (_unique(rng, used, _port) for _ in range(3))
    return f"{name} serves gRPC on port {b}, HTTP on port {a} and Prometheus metrics on port {c}.", b


def _queue(rng: random.Random, name: str, used: set[str]) -> tuple[str, str]:
    queue = _unique(
        rng, used, lambda r: f"{r.choice(LETTERS)}{r.choice(LETTERS)}{r.randint(1, 9)}/{r.randint(100, 999)}"
    )
    return f"Support tickets for {name} go to queue {queue}.", queue


# -- the templates: five kinds per part, no sentence shared between the parts -------------------------------
_TEMPLATES: dict[Part, dict[str, _Template]] = {
    "tune": {
        "sentence": _Template(
            "{name}: access and security",
            "# Project {name}",
            (
                "Project {name} is an internal tool of the {team} team, in service since {year}.",
                "Access to project {name} is granted per person and reviewed once a year.",
                "The {name} servers stand in the {region} data centre and only accept staff on the office network.",
                "Visitors to project {name} sign in at the front desk first.",
                "The security team audits project {name} every {count} months.",
                "Staff who leave the {team} team lose their access to project {name} on their last day.",
            ),
            _access_code,
            "What is the access code of project {name}?",
        ),
        "table": _Template(
            "{name}: components and ports",
            "# Project {name}",
            (
                "Project {name} runs as {count} processes on hosts of the {team} team.",
                "The {name} worker handles background jobs and reports to the dashboard.",
                "Firewall rules in {region} let only the office network reach project {name}.",
                "The components of project {name} were set up in {year} and have not moved since.",
                "Health checks call each {name} component every ten seconds.",
                "Logs of project {name} are kept for {count} weeks.",
            ),
            _worker_table,
            "Which port does the {name} worker use?",
        ),
        "code": _Template(
            "{name}: configuration",
            "# Project {name}",
            (
                "The configuration of project {name} lives in one TOML file checked into its repository.",
                "Upgrades of project {name} change the pin in that file and nothing else.",
                "The {team} team owns the config of project {name} and reviews every change to it.",
                "Project {name} has been deployed from this configuration since {year}.",
                "A pinned version keeps every {name} host in {region} on the same build.",
                "Project {name} reads its config once, when it starts.",
            ),
            _toml,
            "Which version does the config of project {name} pin?",
        ),
        "multi": _Template(
            "{name}: network ports",
            "# Project {name}",
            (
                "Project {name} is a service of the {team} team.",
                "Only operators may connect to the admin interface of project {name}.",
                "Monitoring scrapes the metrics of project {name} every minute.",
                "Project {name} moved to the {region} network in {year}.",
                "Load balancers send customer traffic to project {name}.",
                "The runbook of the {team} team describes how to restart project {name}.",
            ),
            _three_ports,
            "What is the admin port of project {name}?",
        ),
        "followup": _Template(
            "{name}: deployment",
            "# Project {name}",
            (
                "Project {name} is deployed by the {team} team from its release pipeline.",
                "The pipeline of project {name} rotates its credentials every {count} months.",
                "Project {name} ships to the {region} cluster first and to the other regions a day later.",
                "Deployments of project {name} have been automated since {year}.",
                "A failed deploy of project {name} is rolled back by the pipeline without a person.",
                "Secrets of project {name} are kept in the team's secret manager.",
            ),
            _deploy_token,
            "And what is the deploy token of that project?",
            first_turn=(
                "Tell me about project {name}.",
                "Project {name} is deployed by the {team} team from its release pipeline.",
            ),
        ),
    },
    "check": {
        "sentence": _Template(
            "{name} suite: licensing",
            "# {name} suite pricing",
            (
                "The {name} suite is sold to companies as yearly licences, one per seat.",
                "Licences for the {name} suite renew each year unless cancelled thirty days before.",
                "Orders of more than {count}0 seats of the {name} suite get a volume discount.",
                "The {name} suite has been on sale since {year}; prices are reviewed every January.",
                "Invoices for the {name} suite are sent from the {region} office.",
                "A licence for the {name} suite includes updates and support by email.",
            ),
            _price,
            "How much does a yearly licence for the {name} suite cost?",
        ),
        "table": _Template(
            "{name} services: where they listen",
            "# {name} services",
            (
                "{name} runs three services, each owned by a team.",
                "The {name} scheduler plans the nightly jobs.",
                "Clients reach {name} through the gateway; the scheduler and the indexer are internal.",
                "{name} was split into services in {year} by the {team} team.",
                "The {name} hosts stand in {region}.",
                "Every {name} service answers a health check once a minute.",
            ),
            _gateway_table,
            "On which port does the {name} scheduler listen?",
        ),
        "code": _Template(
            "{name} API: release and replicas",
            "# {name} API deployment",
            (
                "The {slug}-api service belongs to the {team} team.",
                "Its manifest pins one release of the {slug}-api service at a time.",
                "Releases of the {slug}-api service are named by date, year first.",
                "Replicas of the {slug}-api service stand in {region} behind one load balancer.",
                "A new release of the {slug}-api service goes out once the {team} team has tested it.",
                "A rollback of the {slug}-api service pins an earlier release in the same manifest.",
            ),
            _yaml,
            "Which release does the {slug}-api manifest pin?",
        ),
        "multi": _Template(
            "{name}: protocols and ports",
            "# {name} network",
            (
                "{name} speaks HTTP to browsers, gRPC to other services and exports Prometheus metrics.",
                "Internal clients of the {team} team call {name} over gRPC.",
                "{name} opened its gRPC interface in {year}; HTTP stayed for browsers.",
                "Prometheus in {region} scrapes the metrics of {name}.",
                "Each protocol of {name} can be firewalled apart from the others.",
                "Client libraries for {name} speak gRPC by default.",
            ),
            _protocols,
            "On which port does {name} serve gRPC?",
        ),
        "followup": _Template(
            "{name}: support",
            "# {name} support",
            (
                "Customers of {name} get support from the {team} team on working days.",
                "Tickets about {name} are answered within {count} hours.",
                "{name} has offered support in {region} business hours since {year}.",
                "Urgent {name} problems carry a priority flag.",
                "Customers of {name} can also ask for help by email.",
                "The {team} team reviews the support of {name} every quarter.",
            ),
            _queue,
            "Which queue do support tickets for that one go to?",
            first_turn=(
                "What is {name}?",
                "{name} is a product whose customers get support from the {team} team on working days.",
            ),
        ),
    },
}


def _names(rng: random.Random, part: Part, endings: list[str]) -> list[str]:
    """Every name of the part with these endings, shuffled."""
    names = [onset + ending for onset in _ONSETS[part] for ending in endings]
    rng.shuffle(names)
    return names


def _take_group(pool: list[str], size: int, part: Part, endings: list[str]) -> list[str]:
    """`size` names of `pool` (removed from it) that differ pairwise in onset and ending: clearly different."""
    group: list[str] = []
    for name in list(pool):
        if all(
            not name.startswith(_onset(other, part)) and not name.endswith(_ending(other, endings)) for other in group
        ):
            group.append(name)
            pool.remove(name)
            if len(group) == size:
                return group
    raise ValueError(f"too many similar cases for the {part} part's names ({len(_ONSETS[part]) * len(endings)})")


def _onset(name: str, part: Part) -> str:
    return next(o for o in _ONSETS[part] if name.startswith(o))


def _ending(name: str, endings: list[str]) -> str:
    return next(e for e in endings if name.endswith(e))


def _slots(rng: random.Random, name: str) -> dict[str, str]:
    """What a page says about its project besides the value (the prose's other numbers: a year, a count)."""
    return {
        "name": name,
        "slug": name.lower(),
        "team": rng.choice(_TEAMS),
        "region": rng.choice(_REGIONS),
        "year": str(rng.randint(2008, 2018)),
        "count": str(rng.randint(2, 9)),
    }


def _page(
    rng: random.Random, title: str, heading: str, prose: tuple[str, ...], slots: dict[str, str], paragraph: str,
    num_sentences: int = 5,
) -> SimilarDoc:  # fmt: skip
    """Topical prose about the project in two paragraphs, the value paragraph between them."""
    sentences = [s.format(**slots) for s in rng.sample(prose, num_sentences)]
    before = " ".join(sentences[:2])
    after = " ".join(sentences[2:])
    text = f"{heading.format(**slots)}\n\n{before}\n\n{paragraph}\n\n{after}"
    return SimilarDoc(title=title.format(**slots), text=text)


def similar_cases(part: Part, num: int, seed: int = 0, max_similar: int = 5, shape: Shape = "one") -> list[SimilarCase]:
    """`num` cases of `part` in `shape`, the kinds in turn, each a group of 2 … max_similar + 1 documents."""
    if part not in _TEMPLATES:
        raise ValueError(f"part must be 'tune' or 'check', got {part!r}")
    if shape == "several":
        return _several_cases(part, num, seed, max_similar)
    if shape != "one":
        raise ValueError(f"shape must be 'one' or 'several', got {shape!r}")
    rng = random.Random(f"{part}-{seed}")
    pool = _names(rng, part, _ENDINGS[part])
    cases = []
    for i in range(num):
        kind = KINDS[i % len(KINDS)]
        template = _TEMPLATES[part][kind]
        names = _take_group(pool, rng.randint(2, max_similar + 1), part, _ENDINGS[part])
        used: set[str] = set()
        pages = [(_slots(rng, name), template.value(rng, name, used)) for name in names]
        docs = tuple(
            _page(rng, template.title, template.heading, template.prose, slots, paragraph)
            for slots, (paragraph, _) in pages
        )
        asked, (_, answer) = pages[0]
        history: tuple[tuple[str, str], ...] = ()
        if template.first_turn is not None:
            first_question, first_answer = template.first_turn
            history = ((first_question.format(**asked), first_answer.format(**asked)),)
        cases.append(
            SimilarCase(
                kind=kind,
                part=part,
                docs=docs,
                question=template.question.format(**asked),
                answer=answer,
                history=history,
            )
        )
    return cases


# -- the several-values shape ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Field:
    """One named value of a several-values page: its form and the question asking for it by the project's name."""

    make: Callable[[random.Random], str]
    question: str


@dataclass(frozen=True)
class _SeveralTemplate:
    title: str
    heading: str
    prose: tuple[str, ...]  # four of them on a page, two before the values and two after
    values: str  # the paragraph stating the three values: {name}, {v0}, {v1}, {v2}
    fields: tuple[_Field, _Field, _Field]


_PEOPLE_FIRST = ["Mirela", "Tomas", "Ines", "Odile", "Kasper", "Leona", "Ruben", "Sanne", "Viktor", "Yara", "Emil"]
_PEOPLE_LAST = ["Kovac", "Hallberg", "Moreau", "Okafor", "Lindqvist", "Barros", "Dvorak", "Nakamura", "Petrescu"]
_MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October")

_SEVERAL: dict[Part, dict[str, _SeveralTemplate]] = {
    "tune": {
        "prose": _SeveralTemplate(
            "{name}: project facts",
            "# Project {name} at a glance",
            (
                "Project {name} is run by the {team} team from the {region} office.",
                "Project {name} started in {year} and has {count} people on it.",
                "The steering group of project {name} meets once a month.",
                "Project {name} reports to the {team} lead every quarter.",
                "Changes to the plan of project {name} go through its steering group.",
                "New staff on project {name} get a week of onboarding.",
            ),
            "The access code of project {name} is {v0}. Its budget for this year is {v1}. The contact person for "
            "project {name} is {v2}.",
            (
                _Field(
                    lambda r: f"{r.choice(LETTERS)}{r.randint(10, 99)}-{r.randint(1000, 9999)}",
                    "What is the access code of project {name}?",
                ),
                _Field(lambda r: f"€{r.randint(100, 999)},000", "What is the budget of project {name} this year?"),
                _Field(
                    lambda r: f"{r.choice(_PEOPLE_FIRST)} {r.choice(_PEOPLE_LAST)}",
                    "Who is the contact person for project {name}?",
                ),
            ),
        ),
        "list": _SeveralTemplate(
            "{name}: office details",
            "# Project {name}: where to find it",
            (
                "Project {name} has worked from the {region} office since {year}.",
                "Visitors to project {name} ask at the reception first.",
                "The {team} team shares its floor with project {name}.",
                "Invoices of project {name} are approved by the {team} lead.",
                "Calls to project {name} are answered on working days.",
                "Project {name} has {count} desks by the windows.",
            ),
            "Office details of project {name}:\n\n- Room: {v0}\n- Phone extension: {v1}\n- Cost centre: {v2}",
            (
                _Field(lambda r: f"{r.choice(LETTERS)}-{r.randint(100, 999)}", "Which room is project {name} in?"),
                _Field(lambda r: str(r.randint(10000, 99999)), "What is the phone extension of project {name}?"),
                _Field(lambda r: f"CC-{r.randint(1000, 9999)}", "Which cost centre does project {name} book to?"),
            ),
        ),
    },
    "check": {
        "prose": _SeveralTemplate(
            "{name} programme: key figures",
            "# The {name} programme",
            (
                "The {name} programme is run by the {team} team.",
                "The {name} programme began in {year} and funds {count} projects.",
                "Progress of the {name} programme is reported to the board each quarter.",
                "The {name} programme is managed from the {region} office.",
                "Spending of the {name} programme is audited once a year.",
                "The {name} programme publishes a summary of its results every spring.",
            ),
            "The {name} programme runs under purchase order {v0}. It has a grant of {v1} for the year. Questions "
            "about the {name} programme go to {v2}.",
            (
                _Field(
                    lambda r: f"PO {r.randint(10000, 99999)}",
                    "Which purchase order does the {name} programme run under?",
                ),
                _Field(
                    lambda r: f"£{r.randint(11, 99)},{r.randint(100, 999)}",
                    "How large is the grant of the {name} programme?",
                ),
                _Field(
                    lambda r: f"+44 20 {r.randint(1000, 9999)} {r.randint(1000, 9999)}",
                    "Which phone number do questions about the {name} programme go to?",
                ),
            ),
        ),
        "list": _SeveralTemplate(
            "{name} appliance: inventory record",
            "# {name} appliance",
            (
                "The {name} appliance stores backups for the {team} team.",
                "The {name} appliance was installed in {region} in {year}.",
                "Firmware on the {name} appliance is updated every {count} months.",
                "The {name} appliance is monitored around the clock.",
                "Only the {team} team may open the case of the {name} appliance.",
                "The {name} appliance replaced an older model of the same make.",
            ),
            "Inventory of the {name} appliance:\n\n- Rack position: {v0}\n- Serial number: {v1}\n- Support "
            "renewal: {v2}",
            (
                _Field(
                    lambda r: f"R{r.randint(10, 48)}-U{r.randint(1, 42):02d}",
                    "In which rack position is the {name} appliance?",
                ),
                _Field(
                    lambda r: f"{r.choice(LETTERS)}{r.randint(0, 9)}{r.choice(LETTERS)}{r.randint(100000, 999999)}",
                    "What is the serial number of the {name} appliance?",
                ),
                _Field(
                    lambda r: f"{r.randint(1, 28)} {r.choice(_MONTH_NAMES)} {r.randint(2027, 2031)}",
                    "When is the support of the {name} appliance renewed?",
                ),
            ),
        ),
    },
}


def _several_cases(part: Part, num: int, seed: int, max_similar: int) -> list[SimilarCase]:
    """The several-values shape: case i is kind i mod 2 and asks the value of label (i div 2) mod 3."""
    rng = random.Random(f"{part}-several-{seed}")
    endings = _SEVERAL_ENDINGS[part]
    pool = _names(rng, part, endings)
    cases = []
    for i in range(num):
        kind = SEVERAL_KINDS[i % len(SEVERAL_KINDS)]
        template = _SEVERAL[part][kind]
        asked_field = (i // len(SEVERAL_KINDS)) % len(template.fields)
        names = _take_group(pool, rng.randint(2, max_similar + 1), part, endings)
        used: set[str] = set()
        pages = []
        for name in names:
            values = [_unique(rng, used, f.make) for f in template.fields]
            slots = _slots(rng, name)
            paragraph = template.values.format(name=name, v0=values[0], v1=values[1], v2=values[2])
            pages.append((slots, values, _page(rng, template.title, template.heading, template.prose, slots,
                                               paragraph, num_sentences=4)))  # fmt: skip
        asked, values, _ = pages[0]
        cases.append(
            SimilarCase(
                kind=kind,
                part=part,
                docs=tuple(doc for _, _, doc in pages),
                question=template.fields[asked_field].question.format(**asked),
                answer=values[asked_field],
                shape="several",
            )
        )
    return cases

"""A real docs corpus with an answer key, made on this machine from the Python standard library's own
docstrings (PSF licence): one Markdown page per module (its public functions and classes, signature +
docstring), and twelve questions whose answer is a name those pages hold. `python -m bench answers`
writes it under its own output folder, outside the repository, unless --docs-dir points to one."""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import asdict, dataclass
from pathlib import Path

MODULES = (
    "shutil",
    "tempfile",
    "textwrap",
    "functools",
    "itertools",
    "heapq",
    "bisect",
    "json",
    "subprocess",
    "collections",
    "shlex",
    "statistics",
)
_MAX_DOC_CHARS = 600  # per function: the first paragraphs are the reference a question needs


@dataclass(frozen=True)
class DocsQuestion:
    question: str
    answers: list[str]  # a right answer contains one of these (normalised)
    page: str  # the page that holds it


ANSWER_KEY = [
    DocsQuestion("Which shutil function deletes an entire directory tree?", ["rmtree"], "shutil"),
    DocsQuestion("Which shutil function recursively copies a directory tree?", ["copytree"], "shutil"),
    DocsQuestion(
        "Which tempfile function creates a temporary directory and returns its path?", ["mkdtemp"], "tempfile"
    ),
    DocsQuestion("Which textwrap function removes common leading whitespace from every line?", ["dedent"], "textwrap"),
    DocsQuestion(
        "Which functools decorator wraps a function with a least-recently-used cache?", ["lru_cache"], "functools"
    ),
    DocsQuestion(
        "Which heapq function pushes an item on the heap and then pops the smallest item?", ["heappushpop"], "heapq"
    ),
    DocsQuestion(
        "Which bisect function returns the insertion point to the left of any existing entries?",
        ["bisect_left"],
        "bisect",
    ),
    DocsQuestion("Which argument of json.dumps sorts the output of dictionaries by key?", ["sort_keys"], "json"),
    DocsQuestion("Which subprocess function runs a command and returns its output?", ["check_output"], "subprocess"),
    DocsQuestion(
        "Which collections class is a dict subclass for counting hashable objects?", ["Counter"], "collections"
    ),
    DocsQuestion("Which shlex function returns a shell-escaped version of a string?", ["quote"], "shlex"),
    DocsQuestion("Which statistics function returns the median of numeric data?", ["median"], "statistics"),
]


def module_page(name: str) -> str:
    """One Markdown page: the module's docstring, then each public function / class with its signature."""
    module = importlib.import_module(name)
    lines = [f"# {name}", "", (inspect.getdoc(module) or "").split("\n\n")[0], ""]
    for attr in sorted(getattr(module, "__all__", None) or [a for a in dir(module) if not a.startswith("_")]):
        obj = getattr(module, attr, None)
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        if getattr(obj, "__module__", name).split(".")[0] not in (name, f"_{name}"):
            continue  # re-exported from elsewhere
        try:
            signature = str(inspect.signature(obj))
        except (TypeError, ValueError):
            signature = "(...)"
        doc = (inspect.getdoc(obj) or "").strip()
        if not doc:
            continue
        lines += [f"## {name}.{attr}{signature}", "", doc[:_MAX_DOC_CHARS], ""]
    return "\n".join(lines)


def write_corpus(folder: Path) -> Path:
    """The pages (one .md per module) and answer_key.json in `folder`; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in MODULES:
        (folder / f"{name}.md").write_text(module_page(name), encoding="utf-8")
    key = [asdict(q) for q in ANSWER_KEY]
    (folder / "answer_key.json").write_text(json.dumps(key, indent=1) + "\n", encoding="utf-8")
    return folder


def read_corpus(folder: Path) -> tuple[list[tuple[str, str]], list[DocsQuestion]]:
    """([(title, page text)], answer key) of a corpus folder (Markdown pages + answer_key.json)."""
    key = [DocsQuestion(**q) for q in json.loads((folder / "answer_key.json").read_text(encoding="utf-8"))]
    return read_pages(folder), key


def read_pages(folder: Path) -> list[tuple[str, str]]:
    """[(title, page text)] of the Markdown pages in `folder`, by file name; an answer key is not needed."""
    pages = [(p.stem, p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.md"))]
    if not pages:
        raise ValueError(f"no Markdown pages (*.md) in {folder}")
    return pages

"""No import circle among the project's modules: every import counts, at module level, under TYPE_CHECKING and
inside functions, since each makes the same circle for a reader and a type checker (a lazy or type-only import
only hides it from the interpreter). Computed with ast over the packages, nothing is imported. An edge goes to the
module an import names; the package `__init__` Python runs first is no edge of its own (its imports are its edges)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine", "kvcache", "retrieval", "ingest", "bench", "fsio")


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    return {_module_name(root, path): path for package in packages for path in sorted((root / package).rglob("*.py"))}


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The project modules `node` (in module `name`, file `path`) imports: a name imported from a package is its
    submodule when there is one, else the package; a module outside the project is no edge."""

    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:  # `import engine.model.x` where x is a name, not a module
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    if isinstance(node, ast.Import):
        found = {known(alias.name) for alias in node.names}
    else:
        base = node.module or ""
        if node.level:  # relative: from the module's own package, one level up per extra dot
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        found = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else known(base) for alias in node.names}
    return {module for module in found if module is not None and module != name}


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Each project module → the project modules it imports, anywhere in its file."""
    modules = _modules(root, packages)
    return {
        name: {
            target
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Import | ast.ImportFrom)
            for target in _imported(name, path, node, modules)
        }
        for name, path in modules.items()
    }


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import themselves through others, grouped by circle (modules that reach each other)."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(graph.get(module, ()))
        reach[start] = seen
    circles = {frozenset({m} | {n for n in reach[m] if m in reach[n]}) for m in graph if m in reach[m]}
    return sorted(sorted(circle) for circle in circles)


def test_no_import_circle_among_the_projects_modules() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert set(PACKAGES) <= set(graph)  # every package was read (a wrong root finds no circle in nothing)
    assert import_circles(graph) == []


def test_the_graph_sees_type_checking_function_level_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .leaf import Leaf\n")
    (package / "sub" / "leaf.py").write_text("import os\nclass Leaf: ...\n")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\nimport pkg.sub.leaf\n"
    )
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("from pkg import a\nfrom pkg.sub import Leaf\n")
    (package / "d.py").write_text("from pkg.a import x\n")  # into the circle, not part of it
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b", "pkg.sub.leaf"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.a", "pkg.sub"},
        "pkg.d": {"pkg.a"},
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": set(),
    }
    assert import_circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]

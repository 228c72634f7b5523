"""Nothing below the HTTP routers imports them: app/api is imported by app/main.py (which mounts it) only.
Nothing below the composition root imports it: app/build.py wires the services and the calibration, never the
other way round."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
ALLOWED = {"main.py"}


def _imports_of(path: Path, package: str) -> list[str]:
    """Every import of `package` or a module under it in `path`, at any depth (TYPE_CHECKING and function-level
    imports count: they make the same circle for a reader and a type checker)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.ImportFrom) and node.module == package.rpartition(".")[0]:
            names = [f"{node.module}.{alias.name}" for alias in node.names]  # from app import build
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [n for n in names if n == package or n.startswith(package + ".")]
    return found


def _imports_app_api(path: Path) -> list[str]:
    return _imports_of(path, "app.api")


def test_only_the_app_itself_imports_the_routers() -> None:
    offenders = {
        str(path.relative_to(APP)): imports
        for path in APP.rglob("*.py")
        if path.relative_to(APP).parts[0] != "api" and str(path.relative_to(APP)) not in ALLOWED
        for imports in [_imports_app_api(path)]
        if imports
    }
    assert offenders == {}


def test_no_service_or_calibration_module_imports_the_composition_root() -> None:
    offenders = {
        str(path.relative_to(APP)): imports
        for below in ("services", "calibration")
        for path in (APP / below).rglob("*.py")
        for imports in [_imports_of(path, "app.build")]
        if imports
    }
    assert offenders == {}


def test_the_import_finder_sees_every_spelling(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.build import Services\n"
        "def f():\n    import app.build\n    from app import build, settings\n"
    )
    assert _imports_of(module, "app.build") == ["app.build", "app.build", "app.build"]

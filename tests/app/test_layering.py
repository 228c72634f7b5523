"""Nothing below the HTTP routers imports them: app/api is imported by app/main.py (which mounts it) only."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
ALLOWED = {"main.py"}


def _imports_app_api(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [n for n in names if n == "app.api" or n.startswith("app.api.")]
    return found


def test_only_the_app_itself_imports_the_routers() -> None:
    offenders = {
        str(path.relative_to(APP)): imports
        for path in APP.rglob("*.py")
        if path.relative_to(APP).parts[0] != "api" and str(path.relative_to(APP)) not in ALLOWED
        for imports in [_imports_app_api(path)]
        if imports
    }
    assert offenders == {}

"""`blendrag ask` checks its arguments with `app.ask_params.AskIn` (the limits of POST /ask) before any model
loads, and imports nothing of the HTTP routers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_cli_imports_nothing_of_the_http_api(tmp_path: Path) -> None:
    code = (
        "import sys; from app.cli import main; "
        "code = main(['ask', 'q', '--ratio', '2', '--data-dir', sys.argv[1]]); "
        "print(code, sorted(m for m in sys.modules if m == 'app.api' or m.startswith('app.api.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env={**os.environ, "BLENDRAG_URL": ""},
        timeout=120,
    )
    assert done.stdout.strip() == "2 []", done.stderr
    assert done.stderr == "error: --ratio: Input should be less than or equal to 1\n"

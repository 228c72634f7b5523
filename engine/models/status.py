"""Where each catalogue model stands on this machine: packages installed, GGUF joined, converted, sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.models.catalog import CATALOG, CatalogEntry
from engine.models.install import part_states
from engine.models.resolve import converted_path, is_catalog_model_converted


@dataclass(frozen=True)
class ModelStatus:
    entry: CatalogEntry
    num_parts_installed: int
    joined: bool  # the joined GGUF sits in models/ (only between the join and the end of a conversion)
    converted: bool
    installed_bytes: int  # of the installed parts' data files
    converted_bytes: int  # of the converted directory, 0 when not converted

    @property
    def installed(self) -> bool:
        return self.num_parts_installed == len(self.entry.parts)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def model_status(entry: CatalogEntry, models_dir: Path) -> ModelStatus:
    states = part_states(entry)
    converted = is_catalog_model_converted(entry, models_dir)
    return ModelStatus(
        entry=entry,
        num_parts_installed=sum(s.installed for s in states),
        joined=len(entry.parts) > 1 and (Path(models_dir) / f"{entry.name}.gguf").is_file(),
        converted=converted,
        installed_bytes=sum(s.path.stat().st_size for s in states if s.path is not None),
        converted_bytes=_dir_bytes(converted_path(entry, models_dir)) if converted else 0,
    )


def catalog_status(models_dir: Path) -> list[ModelStatus]:
    return [model_status(entry, models_dir) for entry in CATALOG.values()]

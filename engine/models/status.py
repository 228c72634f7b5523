"""Where each catalogue model stands on this machine: packages installed, GGUF joined, converted, sizes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.models.cache import dir_bytes
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
    converted_in: Path | None = None  # the models dir that holds the conversion the engine loads

    @property
    def installed(self) -> bool:
        return self.num_parts_installed == len(self.entry.parts)


def model_status(entry: CatalogEntry, models_dir: Path, read_also: Sequence[Path] = ()) -> ModelStatus:
    """The entry's state; a conversion is looked for where the engine looks: `read_also` first, then the cache."""
    states = part_states(entry)
    where = next((Path(d) for d in (*read_also, models_dir) if is_catalog_model_converted(entry, Path(d))), None)
    return ModelStatus(
        entry=entry,
        num_parts_installed=sum(s.installed for s in states),
        joined=len(entry.parts) > 1 and (Path(models_dir) / f"{entry.name}.gguf").is_file(),
        converted=where is not None,
        installed_bytes=sum(s.path.stat().st_size for s in states if s.path is not None),
        converted_bytes=dir_bytes(converted_path(entry, where)) if where is not None else 0,
        converted_in=where,
    )


def catalog_status(models_dir: Path, read_also: Sequence[Path] = ()) -> list[ModelStatus]:
    return [model_status(entry, models_dir, read_also) for entry in CATALOG.values()]

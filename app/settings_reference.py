"""The settings reference (docs/settings.md), generated from the settings models themselves.

Every leaf of the tree in `app.settings.Settings` is one row: its dotted name, the environment variable
that overrides it, its type, default and description. The description is the field's own, so the
reference cannot drift from the code: tests/app/test_settings_reference.py fails when a leaf has no
description or when docs/settings.md is not what this module writes.

    python -m app.settings_reference            # print the reference
    python -m app.settings_reference --write    # rewrite docs/settings.md
    python -m app.settings_reference --check    # exit 1 if docs/settings.md is stale
"""

from __future__ import annotations

import argparse
import enum
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

REFERENCE_PATH = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
ENV_PREFIX = "BLENDRAG_"

_HEADER = """# Settings reference

Generated from the settings models by `python -m app.settings_reference --write`; do not edit by hand.

Settings come from, in order of precedence: command-line flags, `BLENDRAG_*` environment variables (nested
names joined by a double underscore), `settings.yaml` in the working directory (or the file named by
`BLENDRAG_SETTINGS_FILE`), then the defaults below. In `settings.yaml` the dotted name is a nested key:
`engine.blend.recompute_ratio: 0.3` is

```yaml
engine:
  blend:
    recompute_ratio: 0.3
```

A setting whose type includes null takes `null`, `none` or `off` (any case) from its environment variable too:
`BLENDRAG_SERVER__ASK_RATE_PER_MINUTE=null` turns the rate limit off. A setting that has one of those words among
its own values keeps it (`BLENDRAG_ENGINE__DECODE_GRAPHS=off`).
"""

_SECTIONS = {
    "": "Top level",
    "server": "`server`: HTTP, keys, limits",
    "catalog": "`catalog`: the SQL catalog",
    "worker": "`worker`: the PostgreSQL queue worker",
    "engine": "`engine`: the model and the blend",
    "kvcache": "`kvcache`: the KV store",
    "retrieval": "`retrieval`: embedder, index, search",
    "ingest": "`ingest`: loaders and chunking",
}


@dataclass(frozen=True)
class SettingRow:
    name: str  # dotted, e.g. engine.blend.recompute_ratio
    env: str  # BLENDRAG_ENGINE__RECOMPUTE_RATIO
    type: str
    default: str
    description: str


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model an annotation names (`X` or `X | None`), else None: a leaf."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is tuple and typing.get_args(annotation)[-1:] == (Ellipsis,):  # a list in a settings file
        return f"list[{_type_name(typing.get_args(annotation)[0])}]"
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if value is None:
        return "null"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, tuple):  # written as a list in a settings file
        value = list(value)
    if isinstance(value, Path):
        return f"`{value}`"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def setting_rows(model: type[BaseModel], prefix: str = "") -> list[SettingRow]:
    """Every leaf setting under `model`, depth first in declaration order."""
    rows: list[SettingRow] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        sub = _model_of(field.annotation)
        if sub is not None:
            rows.extend(setting_rows(sub, dotted + "."))
            continue
        description = " ".join((field.description or "").split())
        rows.append(
            SettingRow(
                name=dotted,
                env=ENV_PREFIX + dotted.replace(".", "__").upper(),
                type=_type_name(field.annotation),
                default=_default(field),
                description=description,
            )
        )
    return rows


def render(rows: list[SettingRow]) -> str:
    parts = [_HEADER]
    section = None
    for row in rows:
        top = row.name.split(".")[0] if "." in row.name else ""
        if top != section:
            section = top
            title = _SECTIONS.get(top, f"`{top}`")
            parts.append(f"\n## {title}\n\n| setting | type | default | what it does |\n|---|---|---|---|")
        description = row.description.replace("|", "\\|")
        parts.append(f"| `{row.name}`<br>`{row.env}` | {row.type} | {row.default} | {description} |")
    return "\n".join(parts) + "\n"


def reference() -> str:
    from app.settings import Settings

    return render(setting_rows(Settings))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.settings_reference", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"rewrite {REFERENCE_PATH.name}")
    group.add_argument("--check", action="store_true", help=f"exit 1 if {REFERENCE_PATH.name} is stale")
    args = parser.parse_args(argv)
    text = reference()
    if args.write:
        REFERENCE_PATH.write_text(text, encoding="utf-8")
        return 0
    if args.check:
        current = REFERENCE_PATH.read_text(encoding="utf-8") if REFERENCE_PATH.is_file() else ""
        if current != text:
            sys.stderr.write(f"{REFERENCE_PATH} is stale: run python -m app.settings_reference --write\n")
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The `BLENDRAG_*` environment source of the settings tree, where a nullable setting can say "no value".

An environment variable holds a string, so `null` (what settings.yaml and docs/settings.md write for "no
value", e.g. `server.ask_rate_per_minute: null` for no rate limit) would reach the field as the text
"null" and be refused. Here `null`, `none` and `off` (any case) become None for every setting whose type
includes None, at any depth of the tree (`BLENDRAG_SERVER__ASK_RATE_PER_MINUTE=off`). A setting that does
not take None keeps the word, so its own validation says what it expects; so does a setting that takes
the word itself as one of its values (a `Literal[..., "off"]`).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource
from pydantic_settings.sources.types import EnvNoneType

NULL_WORDS = frozenset({"null", "none", "off"})


class NullableEnvSource(EnvSettingsSource):
    """`EnvSettingsSource` (prefix and `__` nesting from the settings class's config) that reads the words of
    NULL_WORDS as None for the settings that take None (see the module docstring)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        env_vars = super()._load_env_vars()
        prefix = self.env_prefix if self.case_sensitive else self.env_prefix.lower()
        delimiter = self.env_nested_delimiter or ""
        marked: dict[str, str | None] = {}
        for name, value in env_vars.items():
            if value is not None and name.startswith(prefix) and is_null_word(value):
                path = name[len(prefix) :].split(delimiter) if delimiter else [name[len(prefix) :]]
                found = field_at(self.settings_cls, path)
                if found is not None and takes_null(found.annotation, value):
                    # pydantic-settings' own marker for "this variable means None", carried through nesting.
                    value = EnvNoneType(value)
            marked[name] = value
        return marked

    def decode_complex_value(self, field_name: str, field: FieldInfo | None, value: Any) -> Any:
        # A nullable list or mapping (engine.ratio_schedule) is decoded as JSON, which `off` is not.
        if isinstance(value, EnvNoneType):
            return value
        return super().decode_complex_value(field_name, field, value)

    def __call__(self) -> dict[str, Any]:
        return _without_markers(super().__call__())


def is_null_word(value: str) -> bool:
    return value.strip().lower() in NULL_WORDS


def field_at(model: type[BaseModel], path: Sequence[str]) -> FieldInfo | None:
    """The field a dotted path names in a settings model (`["server", "ask_rate_per_minute"]`), names
    compared without case as environment names are; None when the path names no field."""
    field: FieldInfo | None = None
    current: type[BaseModel] | None = model
    for key in path:
        if current is None:
            return None
        field = _own_field(current, key)
        if field is None:
            # A flat key a model reads into one of its parts (engine.recompute_ratio for engine.blend's).
            parts = [m for f in current.model_fields.values() if (m := _model_of(f.annotation)) is not None]
            found = [f for m in parts if (f := _own_field(m, key)) is not None]
            if len(found) != 1:
                return None
            field = found[0]
        current = _model_of(field.annotation)
    return field


def _own_field(model: type[BaseModel], key: str) -> FieldInfo | None:
    return next((f for name, f in model.model_fields.items() if name.lower() == key.lower()), None)


def takes_null(annotation: Any, word: str | None = None) -> bool:
    """Whether a field of this type takes None, and `word` (if given) is not one of its literal values."""
    args = _union_members(annotation)
    if type(None) not in args:
        return False
    if word is None:
        return True
    literals = [str(v).lower() for a in args if typing.get_origin(a) is typing.Literal for v in typing.get_args(a)]
    return word.strip().lower() not in literals


def _union_members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (`X` or `X | None`), else None: a leaf."""
    models = [a for a in _union_members(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else None


def _without_markers(values: dict[str, Any]) -> dict[str, Any]:
    return {
        key: None if isinstance(value, EnvNoneType) else _without_markers(value) if isinstance(value, dict) else value
        for key, value in values.items()
    }

"""One settings tree, built once at start-up from `settings.yaml` plus `BLENDRAG_*` environment overrides.

Each package receives only its own sub-settings (`settings.engine`, `settings.kvcache`, …) and never reads
the environment itself. Nested values are overridden with a double underscore, e.g.
`BLENDRAG_ENGINE__RECOMPUTE_RATIO=0.3` or `BLENDRAG_KVCACHE__STORAGE_DTYPE=bf16`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from app.settings_env import NullableEnvSource, field_at, takes_null
from engine.config import EngineSettings, nest_flat_blend_keys
from ingest.config import IngestSettings
from kvcache.config import KVCacheSettings
from retrieval.config import RetrievalSettings

SETTINGS_FILE_ENV = "BLENDRAG_SETTINGS_FILE"
DEFAULT_SETTINGS_FILE = Path("settings.yaml")


class SettingsError(ValueError):
    """Settings that cannot be used; the message names each bad field and why."""


class ServerSettings(BaseModel):
    host: str = Field(default="127.0.0.1", description="Address `blendrag serve` listens on (0.0.0.0: every interface)")
    port: int = Field(default=8000, ge=1, le=65535, description="TCP port `blendrag serve` listens on")
    api_key: str | None = Field(
        default=None, description="When set, ingest, delete and admin routes need `Authorization: Bearer`."
    )
    protect_ask: bool = Field(
        default=False,
        description="With api_key set: /ask and /v1/* need the key too (else anyone may ask, "
        "and answers quote stored passages)",
    )
    public_collections: list[str] = Field(
        default_factory=list,
        description="Collections anyone may ask about without a key; when set, a request without a key sees "
        "only these. Empty: once any collection key exists, the question routes need a key",
    )
    key_cache_s: float = Field(
        default=0.5,
        ge=0,
        le=5,
        description="How long a replica trusts its lookup of a collection key: a key revoked through one "
        "replica is refused by every replica within this",
    )
    ask_rate_per_minute: float | None = Field(
        default=120.0,
        gt=0,
        description="Question requests per minute per API key (or IP without one); null: no limit",
    )
    ask_burst: int = Field(default=30, ge=1, description="Question requests a client may send at once")
    max_question_tokens: int = Field(
        default=1024,
        gt=0,
        description="LLM tokens a question may have (the last user message(s) of /v1 together), counted before "
        "any retrieval or prompt pass: 2,000 one-letter user messages stayed under the character cap and cost a "
        "minute of prompt pass; over it: 422 (/ask) or 400 (/v1)",
    )
    max_prompt_tokens: int = Field(
        default=2048,
        gt=0,
        description="LLM tokens a request may bring to the prompt: its system messages (a /v1 client's own; the "
        "server's prompt is not counted) + its question + the earlier turns kept, counted before any retrieval or "
        "prompt pass. Earlier turns only fill what is left (oldest left out first); system messages + question "
        "over it: 422 (/ask) or 400 (/v1). A 7 KB system message cost a 77 s prompt pass without it",
    )
    anonymous_max_tokens: int | None = Field(
        default=512,
        ge=1,
        description="New tokens an answer may have for a request without the valid API key (every request "
        "when api_key is unset); a larger max_tokens is clipped to it. null: only the request limit (4096)",
    )
    wrong_key_per_minute: float = Field(
        default=10.0,
        gt=0,
        description="Requests with a wrong API key an IP address may send per minute (401 each); past it 429",
    )
    wrong_key_burst: int = Field(default=10, ge=1, description="Wrong-key requests an IP address may send at once")
    forwarded_allow_ips: str = Field(
        default="",
        description="Reverse proxies whose X-Forwarded-For names the client (comma-separated IPs or CIDRs, '*' for "
        "any). Empty (the default): no forwarded header is trusted, every client is its TCP peer, a local one "
        "included. Behind docker/compose.yaml's Caddy the api replicas trust '*' (only the compose network reaches "
        "them)",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins (scheme://host:port) allowed to call the API, CORS and state-changing "
        "requests included; the server's own pages are always allowed",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, gt=0, description="Largest JSON (non-multipart) request body; larger is a 413"
    )
    max_upload_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, description="Largest multipart request (all files together); larger is a 413"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Server log level")
    refresh_stale_kv: bool = Field(
        default=True,
        description="After a model or system prompt switch, recompute every stale chunk's KV in the background "
        "(the old entries evicted first); off: each chunk is recomputed when a question first needs it",
    )
    memory_trim_idle_s: float | None = Field(
        default=2.0,
        gt=0,
        description="After work, once the engine has been idle this long, collect unreachable cycles (which "
        "hold finished requests' KV tensors) and return freed heap memory to the system (glibc malloc_trim); "
        "null: never (RSS then stays near its peak after a burst of clients)",
    )
    malloc_mmap_threshold_bytes: int | None = Field(
        default=1024 * 1024,
        ge=4096,
        le=32 * 1024 * 1024,
        description="Allocations at least this large get their own mapping, unmapped when freed (glibc "
        "M_MMAP_THRESHOLD, fixed instead of growing to 32 MiB); null: the C library's default",
    )


class CatalogSettings(BaseModel):
    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL: sqlite:///<data_dir>/catalog.db (default) or postgresql+psycopg://user@host/db. "
        "PostgreSQL turns on scale-out: ingest jobs go to the PostgreSQL queue for `blendrag worker`, "
        "and each replica's index follows the catalog.",
    )
    auto_upgrade: bool = Field(default=True, description="Apply pending schema migrations when opening")
    index_sync_interval_s: float = Field(
        default=0.5, gt=0, le=60, description="PostgreSQL: how often a replica polls the index change log"
    )
    index_events_retention_s: float = Field(
        default=24 * 3600, gt=0, description="PostgreSQL: change log kept this long"
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("sqlite://", "postgresql://", "postgresql+psycopg://")):
            raise ValueError("url must start with sqlite:// or postgresql+psycopg://")
        if value.startswith("postgresql://"):
            value = "postgresql+psycopg://" + value.removeprefix("postgresql://")
        return value

    @property
    def is_postgres(self) -> bool:
        return (self.url or "").startswith("postgresql")


class WorkerSettings(BaseModel):
    """`blendrag worker` (PostgreSQL catalog only): takes ingest jobs from the PostgreSQL queue."""

    heartbeat_timeout_s: float = Field(
        default=30.0, gt=0, description="A job whose worker is silent this long goes to another worker"
    )
    poll_interval_s: float = Field(default=5.0, gt=0, description="Queue poll when no notification arrives")


class CalibrationSettings(BaseModel):
    """The blend settings' calibration per model (app/calibration; `blendrag calibrate` runs it by hand)."""

    auto: bool = Field(
        default=True,
        description="Calibrate a model served for the first time in the background (once per model fingerprint; "
        "the blend runs on shipped or safe settings until it finishes)",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BLENDRAG_", env_nested_delimiter="__", extra="forbid")

    data_dir: Path = Field(
        default=Path("./data"),
        description="Where the server keeps everything it persists: catalog, index, KV store, uploads (converted "
        "models: models_dir)",
    )
    runtime_dir: Path | None = Field(
        default=None,
        description="Where running servers announce themselves for the CLI (default $XDG_RUNTIME_DIR/blendrag, "
        "else ~/.cache/blendrag)",
    )
    models_dir: Path | None = Field(
        default=None,
        description="The machine's model cache: where catalogue models and GGUF files are converted, once, for "
        "every data dir, server, worker, CLI command and bench run (default $XDG_CACHE_HOME/blendrag/models, "
        "else ~/.cache/blendrag/models). A data dir's own models/ from before the cache is still read",
    )
    server: ServerSettings = Field(default_factory=ServerSettings)
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    kvcache: KVCacheSettings = Field(default_factory=KVCacheSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    calibration: CalibrationSettings = Field(default_factory=CalibrationSettings)

    @model_validator(mode="after")
    def _fill_paths(self) -> Settings:
        # Everything the server persists lives under data_dir unless a path is given explicitly.
        if self.kvcache.dir is None:
            self.kvcache.dir = self.data_dir / "kv"
        if self.catalog.url is None:
            self.catalog.url = f"sqlite:///{self.data_dir / 'catalog.db'}"
        if self.models_dir is None:
            self.models_dir = default_models_dir()
        return self

    @property
    def models_dirs_read(self) -> tuple[Path, ...]:
        """Models dirs read before the cache: the data dir's own models/, where a data dir made before the
        machine-wide cache holds its conversions (read, never written)."""
        return (self.data_dir / "models",)

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "index"

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Precedence: explicit arguments (CLI flags) > environment > settings.yaml > defaults. The environment
        # source reads null / none / off as None for the nullable settings (app/settings_env.py).
        sources = (init_settings, NullableEnvSource(settings_cls), _yaml_source(settings_cls))
        return tuple(_NestedBlendKeys(settings_cls, source) for source in sources)


class _NestedBlendKeys(PydanticBaseSettingsSource):
    """One source's values with the old flat blend keys (engine.recompute_ratio …) read as engine.blend.*, before
    the sources are merged: precedence then holds between an old key in one source and a new one in another."""

    def __init__(self, settings_cls: type[BaseSettings], source: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._source = source

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = self._source()
        engine = values.get("engine")
        if not isinstance(engine, dict):
            return values
        try:
            return values | {"engine": nest_flat_blend_keys(engine)}
        except ValueError as exc:
            raise SettingsError(f"invalid settings: {exc}") from exc


def default_models_dir() -> Path:
    """The model cache when `models_dir` is not set: the user's cache home (XDG base directories; a relative
    $XDG_CACHE_HOME is ignored, as the specification says)."""
    cache_home = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache_home) if cache_home and Path(cache_home).is_absolute() else Path.home() / ".cache"
    return base / "blendrag" / "models"


def _yaml_source(settings_cls: type[BaseSettings]) -> PydanticBaseSettingsSource:
    path = _settings_file()
    try:
        return YamlConfigSettingsSource(settings_cls, yaml_file=path)  # path None: no file, no values
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"{path}: cannot read settings: {exc}") from exc
    except (AttributeError, TypeError, ValueError) as exc:  # a list or scalar at the top level
        raise SettingsError(f"{path}: settings must be a mapping at the top level") from exc


def _settings_file() -> Path | None:
    explicit = os.environ.get(SETTINGS_FILE_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise SettingsError(f"{SETTINGS_FILE_ENV}={explicit}: no such settings file")
        return path
    return DEFAULT_SETTINGS_FILE if DEFAULT_SETTINGS_FILE.is_file() else None


def load_settings(**overrides: Any) -> Settings:
    """Build and validate the settings tree; raise SettingsError with one line per bad field."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r}){_null_hint(err['loc'])}")
        raise SettingsError("invalid settings:\n" + "\n".join(lines)) from exc


def _null_hint(loc: tuple[int | str, ...]) -> str:
    """For a setting that takes null: how to say so (a bad value for it was often meant as "no value")."""
    path = [str(p) for p in loc]
    # A union's error names the member too (relevance_floor.float): the longest prefix that is a field.
    found = next((f for n in range(len(path), 0, -1) if (f := field_at(Settings, path[:n])) is not None), None)
    if found is None or not takes_null(found.annotation):
        return ""
    return "; null (in the environment null, none or off) for no value"

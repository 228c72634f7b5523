"""`engine.model: ollama:NAME[:TAG]`: a model already pulled with Ollama, read from Ollama's own store.

Ollama keeps a model as a manifest (`manifests/<host>/<namespace>/<name>/<tag>`, JSON) whose layers name
content-addressed blobs (`blobs/sha256-<hex>`); the layer of media type `application/vnd.ollama.image.model`
is the GGUF file. blendrag never writes to that store: the blob is checked against its digest and converted
exactly as a local GGUF file is (engine/models/convert.py) into the machine's model cache, under a name that
carries the digest, so a re-pulled tag converts again and two tags of one blob convert once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "ollama:"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
ADAPTER_MEDIA_TYPE = "application/vnd.ollama.image.adapter"
# Where the official Linux installer's service (user `ollama`) keeps its store; a user's own `ollama serve`
# keeps it under ~/.ollama/models.
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[0-9]+)?")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_BLOCK = 8 * 1024 * 1024  # bytes hashed at a time: a blob never sits in memory whole


class OllamaModelError(RuntimeError):
    """An `ollama:` model that cannot be read: no store, no such model or tag, a bad manifest or blob."""


@dataclass(frozen=True)
class OllamaRef:
    """A model name as Ollama reads it: `[host/][namespace/]name[:tag]`."""

    host: str
    namespace: str
    name: str
    tag: str

    @property
    def short(self) -> str:
        """The name as `ollama list` prints it: `name:tag`, `user/name:tag`, `host/user/name:tag`."""
        if self.host != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.name}:{self.tag}"
        if self.namespace != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.name}:{self.tag}"
        return f"{self.name}:{self.tag}"

    def model_dir(self, store: Path) -> Path:
        return store / "manifests" / self.host / self.namespace / self.name


@dataclass(frozen=True)
class OllamaModel:
    """A pulled model: where its store, manifest and GGUF blob are, and the blob's recorded digest and size."""

    ref: OllamaRef
    store: Path
    manifest: Path
    blob: Path
    sha256: str  # hex digest the manifest records for the GGUF blob
    num_bytes: int  # the size the manifest records (-1 when it records none)

    @property
    def converted_dir(self) -> str:
        """Its name in the model cache: the digest names the content (tags of one blob share a conversion)."""
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.ref.namespace}-{self.ref.name}").strip("-.")
        if self.ref.namespace == DEFAULT_NAMESPACE and self.ref.host == DEFAULT_HOST:
            slug = self.ref.name
        return f"ollama-{slug}-{self.sha256[:12]}"


def is_ollama_value(value: str) -> bool:
    return value.startswith(PREFIX)


def parse_ref(value: str) -> OllamaRef:
    """`ollama:NAME[:TAG]` (NAME may be `namespace/name` or `host/namespace/name`) → its parts."""
    text = value.removeprefix(PREFIX)
    path, tag = text, DEFAULT_TAG
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > slash:  # a colon before the last slash is a host's port
        path, tag = text[:colon], text[colon + 1 :]
    parts = path.split("/")
    if len(parts) == 1:
        host, namespace, name = DEFAULT_HOST, DEFAULT_NAMESPACE, parts[0]
    elif len(parts) == 2:
        host, (namespace, name) = DEFAULT_HOST, parts
    elif len(parts) == 3:
        host, namespace, name = parts
    else:
        host = namespace = name = ""
    # Each part becomes a path component under the store: nothing that could leave it ("..", "/", empty).
    if not (_HOST.fullmatch(host) and _PART.fullmatch(namespace) and _PART.fullmatch(name) and _PART.fullmatch(tag)):
        raise OllamaModelError(
            f"engine.model {value!r} is not an Ollama model name: expected ollama:NAME[:TAG], "
            "e.g. ollama:gemma3:270m or ollama:user/name:tag"
        )
    return OllamaRef(host, namespace, name, tag)


def store_candidates(env: Mapping[str, str] | None = None) -> list[Path]:
    """Where Ollama's store may be, in the order looked: $OLLAMA_MODELS alone when set (as Ollama reads it),
    else the user's ~/.ollama/models, then the Linux service's."""
    env = os.environ if env is None else env
    if env.get("OLLAMA_MODELS"):
        return [Path(env["OLLAMA_MODELS"]).expanduser()]
    return [Path("~/.ollama/models").expanduser(), SERVICE_STORE]


def find_store(env: Mapping[str, str] | None = None) -> Path:
    candidates = store_candidates(env)
    for store in candidates:
        if (store / "manifests").is_dir():
            return store
    looked = ", ".join(str(c) for c in candidates)
    raise OllamaModelError(
        f"no Ollama model store on this machine (looked in {looked}); pull the model with `ollama pull` first, "
        "or set OLLAMA_MODELS to the directory that holds Ollama's manifests/ and blobs/"
    )


def _tags(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.iterdir() if p.is_file()) if model_dir.is_dir() else []


def _pulled_models(store: Path) -> list[str]:
    """Every `name:tag` the store holds (namespaced and other hosts' in their long form), for an error message."""
    root = store / "manifests"
    manifests = (p.relative_to(root).parts for p in root.glob("*/*/*/*") if p.is_file())
    return sorted(OllamaRef(*parts).short for parts in manifests)


def locate(value: str, env: Mapping[str, str] | None = None) -> OllamaModel:
    """The pulled model `value` names: its manifest read and its GGUF blob found (not hashed: see verify_blob).
    Raises OllamaModelError saying what is missing and what is there instead."""
    ref = parse_ref(value)
    store = find_store(env)
    model_dir = ref.model_dir(store)
    manifest = model_dir / ref.tag
    if not manifest.is_file():
        tags = _tags(model_dir)
        if tags:
            raise OllamaModelError(
                f"Ollama's store {store} has no tag {ref.tag!r} of {ref.short.rsplit(':', 1)[0]}; "
                f"its tags: {', '.join(tags)}"
            )
        pulled = _pulled_models(store)
        raise OllamaModelError(
            f"Ollama's store {store} has no model {ref.short.rsplit(':', 1)[0]} (`ollama pull {ref.short}`); "
            f"it holds: {', '.join(pulled) if pulled else 'nothing'}"
        )
    layer = _model_layer(manifest, ref)
    digest = _DIGEST.fullmatch(str(layer.get("digest", "")))
    if digest is None:
        raise OllamaModelError(f"{manifest}: the model layer's digest {layer.get('digest')!r} is not sha256:<hex>")
    hexdigest = digest.group(1)
    # Ollama names blobs sha256-<hex>; versions before 0.1.33 named them sha256:<hex>.
    blobs = store / "blobs"
    blob = next((p for p in (blobs / f"sha256-{hexdigest}", blobs / f"sha256:{hexdigest}") if p.is_file()), None)
    if blob is None:
        raise OllamaModelError(
            f"{ref.short}: its GGUF blob {blobs / f'sha256-{hexdigest}'} is missing from Ollama's store; "
            f"pull it again with `ollama pull {ref.short}`"
        )
    size = layer.get("size")
    num_bytes = int(size) if isinstance(size, int) else -1
    if num_bytes >= 0 and blob.stat().st_size != num_bytes:
        raise OllamaModelError(
            f"{ref.short}: its GGUF blob {blob} holds {blob.stat().st_size:,} bytes, the manifest says "
            f"{num_bytes:,}; the blob is damaged or incomplete: pull it again with `ollama pull {ref.short}`"
        )
    return OllamaModel(ref, store, manifest, blob, hexdigest, num_bytes)


def _model_layer(manifest: Path, ref: OllamaRef) -> dict[str, object]:
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        layers = data["layers"]
        if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
            raise TypeError("layers is not a list of objects")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OllamaModelError(f"{ref.short}: its manifest {manifest} is unreadable: {exc}") from exc
    types = [str(layer.get("mediaType", "")) for layer in layers]
    if ADAPTER_MEDIA_TYPE in types:
        # Serving the base without the adapter would answer as another model.
        raise OllamaModelError(f"{ref.short}: the model carries a LoRA adapter layer, which blendrag does not apply")
    models = [layer for layer, kind in zip(layers, types, strict=True) if kind == MODEL_MEDIA_TYPE]
    if len(models) != 1:
        raise OllamaModelError(
            f"{ref.short}: its manifest {manifest} has {len(models)} layers of type {MODEL_MEDIA_TYPE} "
            f"(a GGUF model has one); its layers: {', '.join(types) or 'none'}"
        )
    return models[0]


def verify_blob(model: OllamaModel) -> None:
    """Hash the blob and hold it against the manifest's digest (before anything converts it)."""
    h = hashlib.sha256()
    with model.blob.open("rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    if h.hexdigest() != model.sha256:
        raise OllamaModelError(
            f"{model.ref.short}: its GGUF blob {model.blob} is damaged: its sha256 is {h.hexdigest()}, the manifest "
            f"records {model.sha256}; nothing was converted. Pull it again with `ollama pull {model.ref.short}`"
        )


def describe_ollama_setting(value: str) -> str | None:
    """Why `value` cannot be served (no store, no such model or tag, a bad manifest, a missing blob), or None.
    Reads the manifest only: the blob is hashed when it is converted."""
    try:
        locate(value)
    except OllamaModelError as exc:
        return f"engine.model {value!r}: {exc}"
    return None

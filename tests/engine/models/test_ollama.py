"""`engine.model: ollama:NAME[:TAG]`: a model pulled with Ollama, read from a store laid out as Ollama lays
it out (manifests/<host>/<namespace>/<name>/<tag> naming blobs/sha256-<hex>), converted exactly as the same
GGUF file given by path is; a damaged blob or a missing store, model, tag, manifest or blob is a clear error
and leaves the model cache as it was."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from enginetest_tiny import build_model, engine_logits, random_chunks
from gguf_writer import write_gguf
from pydantic import ValidationError

from engine.builtin import builtin_gguf_path
from engine.config import EngineSettings
from engine.model import load_model
from engine.models.cache import cached_models
from engine.models.ollama import OllamaModelError, OllamaRef, locate, parse_ref, store_candidates
from engine.models.resolve import describe_model_setting, resolve_model

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"


def pull(store: Path, gguf: Path, manifest_path: str, extra_layers: tuple[str, ...] = ()) -> str:
    """Put `gguf` into `store` as `ollama pull` does: the blob under its digest, a manifest naming it beside a
    template and a params layer. Returns the blob's hex sha256."""
    data = gguf.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    blobs = store / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / f"sha256-{digest}").write_bytes(data)
    layers = [{"mediaType": MODEL_MEDIA_TYPE, "digest": f"sha256:{digest}", "size": len(data)}]
    for kind in ("template", "params", *extra_layers):
        text = f"{kind} of the model".encode()
        other = hashlib.sha256(text).hexdigest()
        (blobs / f"sha256-{other}").write_bytes(text)
        layers.append({"mediaType": f"application/vnd.ollama.image.{kind}", "digest": f"sha256:{other}"})
    manifest = store / "manifests" / manifest_path
    manifest.parent.mkdir(parents=True, exist_ok=True)
    config = {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64}
    manifest.write_text(json.dumps({"schemaVersion": 2, "config": config, "layers": layers}))
    return digest


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 written as a float32 GGUF file (seconds to convert)."""
    model_dir = build_model(tmp_path_factory.mktemp("qwen2"), "qwen2", seed=7)
    return write_gguf(model_dir, tmp_path_factory.mktemp("downloads") / "tiny-qwen2.F32.gguf")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An Ollama store where OLLAMA_MODELS points, as a user who moved Ollama's models sets it."""
    root = tmp_path / "ollama-models"
    (root / "manifests").mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


def _cache_entries(models_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(models_dir)) for p in models_dir.rglob("*")) if models_dir.exists() else []


def test_names_read_as_ollama_reads_them() -> None:
    assert parse_ref("ollama:gemma3") == OllamaRef("registry.ollama.ai", "library", "gemma3", "latest")
    assert parse_ref("ollama:gemma3:270m") == OllamaRef("registry.ollama.ai", "library", "gemma3", "270m")
    assert parse_ref("ollama:user/name:q4") == OllamaRef("registry.ollama.ai", "user", "name", "q4")
    assert parse_ref("ollama:hf.co/org/model-GGUF:Q4_K_M") == OllamaRef("hf.co", "org", "model-GGUF", "Q4_K_M")
    assert parse_ref("ollama:host:5000/ns/name") == OllamaRef("host:5000", "ns", "name", "latest")
    assert parse_ref("ollama:user/name:q4").short == "user/name:q4"
    assert parse_ref("ollama:hf.co/org/m:t").short == "hf.co/org/m:t"
    for bad in ("ollama:", "ollama:../x", "ollama:a/../../etc:passwd", "ollama:a/b/c/d", "ollama:name:", "ollama:a b"):
        with pytest.raises(OllamaModelError, match="is not an Ollama model name: expected ollama:NAME"):
            parse_ref(bad)


def test_the_store_is_ollama_models_when_set_else_the_users_then_the_services() -> None:
    assert store_candidates({"OLLAMA_MODELS": "/srv/ollama"}) == [Path("/srv/ollama")]
    assert store_candidates({}) == [Path("~/.ollama/models").expanduser(), Path("/usr/share/ollama/.ollama/models")]


def test_a_pulled_model_converts_as_its_gguf_file_does(store: Path, tiny_gguf: Path, tmp_path: Path) -> None:
    digest = pull(store, tiny_gguf, "registry.ollama.ai/library/tiny/270m")
    models_dir = tmp_path / "models"
    assert describe_model_setting("ollama:tiny:270m") is None
    assert EngineSettings(model="ollama:tiny:270m").model == "ollama:tiny:270m"  # kept as a name, not a path
    resolved = resolve_model("ollama:tiny:270m", models_dir)
    assert resolved.path == models_dir / f"ollama-tiny-{digest[:12]}"
    identity = resolved.identity
    assert (identity.name, identity.display_name, identity.source, identity.architecture) == (
        "ollama:tiny:270m",
        "tiny qwen2",
        "gguf",
        "qwen2",
    )
    assert identity.origin_quantisation == "ALL_F32"
    by_path = resolve_model(str(tiny_gguf), models_dir)
    assert by_path.path != resolved.path
    assert load_model(resolved.path).fingerprint == load_model(by_path.path).fingerprint
    ids = random_chunks([40], seed=2)[0]
    torch.testing.assert_close(engine_logits(resolved.path, ids), engine_logits(by_path.path, ids), atol=0, rtol=0)
    listed = {m.name: m.source for m in cached_models(models_dir)}
    assert listed[resolved.path.name] == "ollama:tiny:270m"
    # A later start trusts the conversion its digest names: nothing converts or hashes again.
    mtime = (resolved.path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("ollama:tiny:270m", models_dir).path == resolved.path
    assert (resolved.path / "model.safetensors").stat().st_mtime_ns == mtime


def test_a_tag_defaults_to_latest_and_a_namespace_is_read_from_its_own_dir(
    store: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    digest = pull(store, tiny_gguf, "registry.ollama.ai/library/tiny/latest")
    pull(store, tiny_gguf, "registry.ollama.ai/someone/tiny/q8")
    first = resolve_model("ollama:tiny", tmp_path / "models")
    assert (first.path.name, first.identity.name) == (f"ollama-tiny-{digest[:12]}", "ollama:tiny:latest")
    other = resolve_model("ollama:someone/tiny:q8", tmp_path / "models")
    assert (other.path.name, other.identity.name) == (f"ollama-someone-tiny-{digest[:12]}", "ollama:someone/tiny:q8")


def test_a_damaged_blob_is_a_clear_error_and_the_model_cache_is_untouched(
    store: Path, tiny_gguf: Path, tmp_path: Path
) -> None:
    digest = pull(store, tiny_gguf, "registry.ollama.ai/library/tiny/latest")
    models_dir = tmp_path / "models"
    resolve_model(str(tiny_gguf), models_dir)  # the cache already holds another model
    before = _cache_entries(models_dir)
    blob = store / "blobs" / f"sha256-{digest}"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight: the size is right, the content is not
    blob.write_bytes(bytes(data))
    actual = hashlib.sha256(data).hexdigest()
    with pytest.raises(OllamaModelError) as err:
        resolve_model("ollama:tiny", models_dir)
    assert str(err.value) == (
        f"tiny:latest: its GGUF blob {blob} is damaged: its sha256 is {actual}, the manifest records {digest}; "
        "nothing was converted. Pull it again with `ollama pull tiny:latest`"
    )
    assert _cache_entries(models_dir) == before


def test_the_real_test_models_blob_with_one_byte_flipped_is_refused(store: Path, tmp_path: Path) -> None:
    digest = pull(store, builtin_gguf_path(), "registry.ollama.ai/library/smollm2/135m")
    blob = store / "blobs" / f"sha256-{digest}"
    with blob.open("r+b") as fh:
        fh.seek(50_000_000)
        byte = fh.read(1)
        fh.seek(50_000_000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(OllamaModelError, match=r"smollm2:135m: its GGUF blob .* is damaged: its sha256 is [0-9a-f]+"):
        resolve_model("ollama:smollm2:135m", tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_no_store_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    message = (
        f"no Ollama model store on this machine (looked in {tmp_path / 'nowhere'}); pull the model with "
        "`ollama pull` first, or set OLLAMA_MODELS to the directory that holds Ollama's manifests/ and blobs/"
    )
    with pytest.raises(OllamaModelError) as err:
        resolve_model("ollama:gemma3:270m", tmp_path / "models")
    assert str(err.value) == message
    assert describe_model_setting("ollama:gemma3:270m") == f"engine.model 'ollama:gemma3:270m': {message}"
    with pytest.raises(ValidationError, match="no Ollama model store on this machine"):
        EngineSettings(model="ollama:gemma3:270m")
    assert not (tmp_path / "models").exists()


def test_a_missing_tag_lists_the_tags_there_and_a_missing_model_the_models(store: Path, tiny_gguf: Path) -> None:
    pull(store, tiny_gguf, "registry.ollama.ai/library/tiny/270m")
    pull(store, tiny_gguf, "registry.ollama.ai/library/tiny/latest")
    pull(store, tiny_gguf, "registry.ollama.ai/someone/other/q8")
    assert describe_model_setting("ollama:tiny:1b") == (
        f"engine.model 'ollama:tiny:1b': Ollama's store {store} has no tag '1b' of tiny; its tags: 270m, latest"
    )
    with pytest.raises(OllamaModelError) as err:
        locate("ollama:gemma3")
    assert str(err.value) == (
        f"Ollama's store {store} has no model gemma3 (`ollama pull gemma3:latest`); "
        "it holds: someone/other:q8, tiny:270m, tiny:latest"
    )


def test_an_unreadable_manifest_or_a_missing_blob_is_a_clear_error(store: Path, tiny_gguf: Path) -> None:
    digest = pull(store, tiny_gguf, "registry.ollama.ai/library/tiny/latest")
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    good = manifest.read_text()
    manifest.write_text("{not json")
    with pytest.raises(OllamaModelError) as err:
        locate("ollama:tiny")
    assert str(err.value).startswith(f"tiny:latest: its manifest {manifest} is unreadable: Expecting property name")
    params_only = [{"mediaType": "application/vnd.ollama.image.params"}]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": params_only}))
    with pytest.raises(OllamaModelError) as err:
        locate("ollama:tiny")
    assert str(err.value) == (
        f"tiny:latest: its manifest {manifest} has 0 layers of type {MODEL_MEDIA_TYPE} (a GGUF model has one); "
        "its layers: application/vnd.ollama.image.params"
    )
    manifest.write_text(good)
    (store / "blobs" / f"sha256-{digest}").unlink()
    with pytest.raises(OllamaModelError) as err:
        locate("ollama:tiny")
    assert str(err.value) == (
        f"tiny:latest: its GGUF blob {store / 'blobs' / f'sha256-{digest}'} is missing from Ollama's store; "
        "pull it again with `ollama pull tiny:latest`"
    )
    assert describe_model_setting("ollama:tiny") == f"engine.model 'ollama:tiny': {err.value}"


def test_a_truncated_blob_is_caught_by_its_size_and_an_adapter_is_refused(store: Path, tiny_gguf: Path) -> None:
    digest = pull(store, tiny_gguf, "registry.ollama.ai/library/tiny/latest")
    blob = store / "blobs" / f"sha256-{digest}"
    size = blob.stat().st_size
    with blob.open("r+b") as fh:
        fh.truncate(size - 10)
    with pytest.raises(OllamaModelError) as err:
        locate("ollama:tiny")
    assert str(err.value) == (
        f"tiny:latest: its GGUF blob {blob} holds {size - 10:,} bytes, the manifest says {size:,}; the blob is "
        "damaged or incomplete: pull it again with `ollama pull tiny:latest`"
    )
    pull(store, tiny_gguf, "registry.ollama.ai/library/tuned/latest", extra_layers=("adapter",))
    with pytest.raises(OllamaModelError, match="^tuned:latest: the model carries a LoRA adapter layer"):
        locate("ollama:tuned")


@pytest.mark.slow
def test_the_test_models_blob_converts_to_the_catalogue_conversions_fingerprint(
    store: Path, tmp_path: Path, smollm2_dir: Path
) -> None:
    """SmolLM2's own GGUF pulled into the store: the same weights and fingerprint as the catalogue's conversion
    of that file (tests/engine/models/test_gguf_file.py holds the GGUF path to the same)."""
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copy(builtin_gguf_path(), gguf)
    pull(store, gguf, "registry.ollama.ai/library/smollm2/135m")
    resolved = resolve_model("ollama:smollm2:135m", tmp_path / "models")
    assert (resolved.identity.display_name, resolved.identity.origin_quantisation) == (
        "Smollm2 135M 8k Lc100K Mix1 Ep2",
        "Q4_1",
    )
    assert load_model(resolved.path).fingerprint == load_model(smollm2_dir).fingerprint

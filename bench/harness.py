"""What every quality/throughput/ingest/kv subcommand shares: the common options, the engine, machine
facts recorded in each JSON (load average included, since timings on a shared machine drift), and the
output files (`--out` JSON, `--plot` PNG next to it by default)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.engine import Engine
    from kvcache.store import TieredKVStore
    from kvcache.types import ChunkKV, LayerKVSource

logger = logging.getLogger(__name__)

DEFAULT_MUSIQUE = Path("../shared/data/musique_dev.json")
DEFAULT_NQ6 = Path("../shared/data/nq6_dev.json")
# The server's default data dir keeps the converted built-in model here (`make serve` creates it).
DEFAULT_MODELS_DIR = Path("data/models")
DEFAULT_OUT_DIR = Path("bench/out")  # git-ignored


def add_common_args(parser: argparse.ArgumentParser, *, dataset: Path, examples: int, passages: int, out: str) -> None:
    parser.add_argument("--dataset", type=Path, default=dataset, help="question/passages JSON file")
    parser.add_argument("--examples", type=int, default=examples, help="number of examples (seeded sample)")
    parser.add_argument("--passages", type=int, default=passages, help="passages (chunks) per prompt")
    parser.add_argument("--seed", type=int, default=0, help="which examples (seeded shuffle)")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT_DIR / out, help=f"JSON result file (default: {DEFAULT_OUT_DIR / out})"
    )
    parser.add_argument("--plot", type=Path, default=None, help="PNG plot (default: --out with .png)")
    parser.add_argument("--model", default="builtin", help="'builtin' (SmolLM2-135M) or an HF checkpoint dir")
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=DEFAULT_MODELS_DIR,
        help="where the built-in model is converted once (default: the server's)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="model compute dtype (auto: float32 on CPU)",
    )


def add_blend_args(parser: argparse.ArgumentParser) -> None:
    """Options that change the engine's blend settings (default: the server's own defaults)."""
    from engine.types import SELECTORS

    parser.add_argument(
        "--selector",
        default=None,
        choices=SELECTORS,
        help="blend token selector (default: the engine's default selector)",
    )
    parser.add_argument("--score-layers", default=None, help="query selector: scoring layers, comma-separated")
    parser.add_argument("--check-layers", default=None, help="deviation selector: check layers, comma-separated")


def _layers(text: str | None) -> list[int] | None:
    return None if not text else [int(x) for x in text.split(",") if x.strip()]


def build_engine(args: argparse.Namespace, **overrides: Any) -> Engine:
    """The engine with the server's default settings, changed only by the options the run gives."""
    from engine.config import EngineSettings
    from engine.engine import Engine

    for name in ("selector", "score_layers", "check_layers"):
        value = getattr(args, name, None)
        if value is not None:
            overrides.setdefault(name, value if name == "selector" else _layers(value))
    settings = EngineSettings(model=args.model, num_threads=args.threads, dtype=args.dtype, **overrides)
    return Engine(settings, models_dir=args.models_dir)


def blend_settings(engine: Engine) -> dict[str, Any]:
    """The engine's blend settings, recorded in every result file."""
    s = engine.settings
    return {
        "selector": s.selector,
        "recompute_ratio": s.recompute_ratio,
        "score_layers": list(s.score_layers),
        "score_fuse": s.score_fuse,
        "score_by": s.score_by,
        "pool_window": s.pool_window,
        "min_per_chunk": s.min_per_chunk,
        "check_layers": list(s.check_layers),
        "deviation_on": s.deviation_on,
    }


def plot_path(args: argparse.Namespace) -> Path:
    return args.plot if args.plot is not None else Path(args.out).with_suffix(".png")


def machine_info(engine: Engine | None = None) -> dict[str, Any]:
    """Facts that make two result files comparable (or explain why they are not)."""
    import torch

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if engine is not None:
        info["device"] = str(engine.device)
        info["compute_dtype"] = str(engine.dtype).removeprefix("torch.")
    return info


def model_name(engine: Engine) -> str:
    from engine.builtin import BUILTIN_LLM_NAME

    name = Path(engine.settings.model).name
    return "SmolLM2-135M-Instruct" if name in ("builtin", BUILTIN_LLM_NAME) else name


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class RunRecord:
    """Wall time and load averages of one benchmark run (recorded at the start and at the end)."""

    started: float = field(default_factory=time.perf_counter)
    load_start: list[float] = field(default_factory=load_avg)

    def finish(self) -> dict[str, Any]:
        return {
            "elapsed_s": round(time.perf_counter() - self.started, 2),
            "load_avg_start": self.load_start,
            "load_avg_end": load_avg(),
            "unix_time": int(time.time()),
        }


def _json_safe(value: Any) -> Any:
    """NaN/inf are not JSON: write them as null so every reader can parse the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_json_safe(data), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    logger.info("wrote %s", path)


def new_figure(num_panels: int, width_per_panel: float = 4.2, height: float = 3.6):
    """A row of matplotlib axes on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, num_panels, figsize=(width_per_panel * num_panels, height), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    logger.info("wrote %s", path)


# ------------------------------------------------------------------------------------ KV sources
STORAGE_DTYPES = ("fp16", "bf16", "int8", "int4")


def put_chunks(
    store: TieredKVStore,
    engine: Engine,
    chunk_ids: list[list[int]],
    kvs: list[ChunkKV],
) -> list[str]:
    """Store each chunk's KV under the key /ask would look up; returns the keys in prompt order.

    Goes through the one KV writer (kvcache/writer.py) with the KV already computed; a chunk the store
    could not keep stops the benchmark (its figures would be of recomputed KV).
    """
    from kvcache.writer import ensure_chunk_kv

    by_ids = {tuple(ids): kv for ids, kv in zip(chunk_ids, kvs, strict=True)}
    written = ensure_chunk_kv(
        store,
        chunk_ids,
        model_fingerprint=engine.fingerprint,
        prefix_ids=engine.prompt.prefix_ids,
        compute=lambda todo: [by_ids[tuple(ids)] for ids in todo],
    )
    if written.unwritten:
        raise RuntimeError(f"the benchmark's KV store refused {len(written.unwritten)} chunk(s)")
    return written.keys


class ChunkKVSet:
    """One prompt's precomputed chunk KV, served as any storage dtype the store supports.

    `fp32` serves the engine's own tensors (no storage rounding); fp16/bf16/int8/int4 go through an
    in-memory `TieredKVStore` (the real encode path with the store's default int4 groups) and its
    layer-wise loader.
    """

    def __init__(self, engine: Engine, chunk_ids: list[list[int]], kvs: list[ChunkKV]) -> None:
        self.engine = engine
        self.chunk_ids = chunk_ids
        self.kvs = kvs
        self._stores: dict[str, tuple[TieredKVStore, list[str]]] = {}

    @property
    def num_tokens(self) -> int:
        return sum(kv.num_tokens for kv in self.kvs)

    def _store(self, storage_dtype: str) -> tuple[TieredKVStore, list[str]]:
        from kvcache.config import KVCacheSettings
        from kvcache.store import TieredKVStore

        if storage_dtype not in self._stores:
            budget = 2 * sum(kv.nbytes() for kv in self.kvs) + 1024 * 1024
            store = TieredKVStore(
                KVCacheSettings(
                    dir=None,
                    storage_dtype=storage_dtype,  # type: ignore[arg-type]
                    memory_bytes=budget,
                    prefetch=False,
                )
            )
            self._stores[storage_dtype] = (store, put_chunks(store, self.engine, self.chunk_ids, self.kvs))
        return self._stores[storage_dtype]

    def source(self, storage_dtype: str = "fp32") -> LayerKVSource:
        from kvcache.types import InMemoryLayerSource

        if storage_dtype == "fp32":
            return InMemoryLayerSource(self.kvs, device=self.engine.device, dtype=self.engine.dtype)
        store, keys = self._store(storage_dtype)
        return store.open_layers(keys, device=self.engine.device, dtype=self.engine.dtype)

    def stored_bytes(self, storage_dtype: str) -> int:
        """Tensor bytes the memory tier holds for these chunks in `storage_dtype` (int8: with scales)."""
        store, keys = self._store(storage_dtype)
        located = store.locate_many(keys)
        return sum(located[k].num_bytes_by_tier["memory"] for k in keys)

    def serialized_entries(self, storage_dtype: str) -> list[bytes]:
        """These chunks' entry files (what the disk tier and Redis hold), in prompt order."""
        from kvcache.format import serialize_entry

        store, keys = self._store(storage_dtype)
        out = []
        for key in keys:
            entry = store.get_entry(key)
            assert entry is not None
            out.append(serialize_entry(entry))
        return out

    def serialized_bytes(self, storage_dtype: str) -> int:
        """Bytes of these chunks' entry files."""
        return sum(len(data) for data in self.serialized_entries(storage_dtype))
